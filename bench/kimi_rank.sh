#!/usr/bin/env bash
# Issue 69's timing rig as one GPU job, from the project root on the GPU machine after staging (bench/kimi_rank.py
# says what each step measures):
#   MARLIN_CACHE=/tmp/marlin-parts testbed/bg.sh start bench/kimi_rank.sh
#   testbed/bg.sh wait 540          (again at once while it runs; each call carries .gpu-bundles/bin)
# Steps, each result copied to $OUT as soon as it exists (a machine taken back keeps what came before):
#   experts    distinct routed experts a layer at each T (SGLang's routing-simulation kernel)
#   decode     uniform, then round-robin routing: one forward of T tokens for T in TOKENS
#   verify     uniform: DDTREE servers at BUDGETS, each driven at LOADS; round-robin: RR_BUDGETS only
# Settings: LAYERS (40), TOKENS, BUDGETS (8,16,32,64), RR_BUDGETS (32), LOADS (1,8,16,32,48), STEPS (which of the
# steps above, default "experts decode-uniform verify-uniform decode-round-robin verify-round-robin").
# MARLIN_CACHE=DIR unpacks DIR/marlin-jit.tgz.part* (SGLang's Marlin MoE kernels for sm_90a) into ~ first.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=${RIG:-$SGLANG_TESTBED/rig}; OUT=${OUT:-$R/out}; mkdir -p "$R" "$OUT"
LAYERS=${LAYERS:-40}; BUDGETS=${BUDGETS:-8,16,32,64}; RR_BUDGETS=${RR_BUDGETS:-32}; LOADS=${LOADS:-1,8,16,32,48}
TOKENS=${TOKENS:-1,8,9,16,17,33,65,129,257,513}
STEPS=${STEPS:-experts decode-uniform verify-uniform decode-round-robin verify-round-robin}
t0=$(date +%s)
if [ -n "${MARLIN_CACHE:-}" ] && ls "$MARLIN_CACHE"/marlin-jit.tgz.part* >/dev/null 2>&1; then
  cat "$MARLIN_CACHE"/marlin-jit.tgz.part* | tar xz -C "$HOME" && echo "[rig] Marlin JIT cache unpacked"
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . 2>&1 \
  | grep -vi warning || true
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
rig() { python3 -m bench.kimi_rank "$@" --out "$R" --layers "$LAYERS" --gpu "$gpu"; }
report() {   # the table and rig.json so far, and the logs, to $OUT after every step
  rig report > "$R/rig.md" 2>&1; cp "$R/rig.md" "$R/rig.json" "$OUT/" 2>/dev/null
  tar czf "$OUT/rig-logs.tgz" -C "$R" logs $(cd "$R" && ls decode-*.jsonl verify-*.json experts.json 2>/dev/null) \
    2>/dev/null
  echo "[rig] $1 done after $(( $(date +%s) - t0 )) s"
}
rig write || exit 2
rc=0
for step in $STEPS; do
  case $step in
    experts) rig experts --tokens "$TOKENS" || rc=1 ;;
    decode-*) rig decode --routing "${step#decode-}" --tokens "$TOKENS" || rc=1 ;;
    verify-uniform) rig verify --routing uniform --budgets "$BUDGETS" --loads "$LOADS" || rc=1 ;;
    verify-round-robin) rig verify --routing round-robin --budgets "$RR_BUDGETS" --loads "$LOADS" || rc=1 ;;
    *) echo "[rig] unknown step $step (expected experts, decode-ROUTING, verify-ROUTING)" >&2; rc=2 ;;
  esac
  report "$step"
done
cat "$R/rig.md"
exit $rc

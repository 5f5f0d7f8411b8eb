#!/usr/bin/env bash
# Issue 69 item 3 as one GPU job, from the project root on the GPU machine after staging (docs/gpu-testbed.md):
#   MARLIN_CACHE=/tmp/marlin-parts BG=/tmp/enlarged testbed/bg.sh start testbed/enlarged_pair.sh
#   BG=/tmp/enlarged testbed/bg.sh wait 540    (again at once until "[bg] ended"; carry .gpu-bundles/bin)
# 1. trains the decidable Kimi-shaped pair whose every expert is active (training/train_pair.py --size kimi-allexp,
#    TRAIN_MINUTES, default 2), unless $ROOT/pair holds one;
# 2. exports it with INT4 experts ($ROOT/small: the small INT4 pair) and enlarges it to one TP-8 rank's widths with
#    EXTRA_LAYERS extra MoE layers (default 2: five servers of ~12 GB fit an H100 beside each other) into $BIG
#    (/dev/shm/enlarged: 1.2 GB a MoE layer; the disk has 64 GB);
# 3. tests/gpu_sglang/test_enlarged_pair.py (the enlarged pair's NONE against the small pair's) and
#    test_ddtree_server.py's greedy and chain tests on the enlarged pair, its referee the small reference pair
#    (SERVERS: the configurations, default none,dflash,ddtree-b32-c8-graphs,ddtree-b7-c1-graphs,ddtree-auto-c8-graphs),
#    and tests/gpu_sglang/test_width_policy.py's tests of the width policy (issue 70) without the overlap scheduler (and
#    without the made-up -steepcost table's server: a sixth server of ~12 GB does not fit beside the five);
# 4. the chain-against-DFLASH test again on the small INT4 pair, as the control for step 3's, and its fault (the
#    chain one token short, SGLANG_DDTREE_FAULT=drop-leaf) shown to break the rule there.
# POLICY_ONLY=1: after step 1 only the width policy's tests (tests/gpu_sglang/test_width_policy.py, no overlap twin) on
# the small pair exported with bf16 experts ($ROOT/plain; SERVERS_POLICY, default none,ddtree-auto-c8-graphs).
# Results: $OUT/results.md, results.json, logs.tgz.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT=${ROOT:-$SGLANG_TESTBED/enlarged}; BIG=${BIG:-/dev/shm/enlarged}; OUT=${OUT:-$ROOT/out}; mkdir -p "$ROOT" "$OUT"
EXTRA_LAYERS=${EXTRA_LAYERS:-2}
SERVERS=${SERVERS:-none,dflash,ddtree-b32-c8-graphs,ddtree-b7-c1-graphs,ddtree-auto-c8-graphs}
t0=$(date +%s)
. testbed/enlarged_common.sh
enlarged_prepare enlarged || exit 1
if [ -n "${POLICY_ONLY:-}" ]; then   # the width policy's tests alone, on the small pair (bf16 experts): a short job
  [ -d "$ROOT/plain/target" ] || python3 -m ddtree.reference.export --pair "$ROOT/pair/b8" --out "$ROOT/plain" || exit 1
  echo "[enlarged] pair ready after $(( $(date +%s) - t0 )) s; the width policy's tests on it"
  SGLANG_DDTREE_PAIR="$ROOT/plain" SGLANG_DDTREE_REF="$ROOT/pair/b8" SGLANG_DDTREE_PROMPTS="$ROOT/pair/heldout_prompts.json" \
  SGLANG_DDTREE_OUT="$OUT" SGLANG_DDTREE_START="${SERVERS_POLICY:-none,ddtree-auto-c8-graphs}" \
    python3 -m pytest tests/gpu_sglang/test_width_policy.py -p no:cacheprovider -q -rfE -k "not overlap"
  rc=$?
  tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null
  echo "[enlarged] width policy tests done after $(( $(date +%s) - t0 )) s (rc $rc)"
  exit $rc
fi
[ -d "$ROOT/small/target" ] || python3 -m ddtree.reference.export --pair "$ROOT/pair/b8" --out "$ROOT/small" \
  --int4-experts || exit 1
enlarged_copy "$BIG" "$EXTRA_LAYERS" || exit 1
echo "[enlarged] pairs ready after $(( $(date +%s) - t0 )) s"
SGLANG_DDTREE_PAIR="$BIG" SGLANG_DDTREE_REF="$ROOT/pair/b8" SGLANG_DDTREE_SMALL_PAIR="$ROOT/small" \
SGLANG_DDTREE_PROMPTS="$ROOT/pair/heldout_prompts.json" SGLANG_DDTREE_OUT="$OUT" SGLANG_DDTREE_START="$SERVERS" \
  python3 -m pytest tests/gpu_sglang/test_enlarged_pair.py tests/gpu_sglang/test_ddtree_server.py \
  tests/gpu_sglang/test_width_policy.py -p no:cacheprovider -q -rfE \
  -k "enlarged or (greedy_equals_no and b32-c8-graphs) or chain_setting_equals or ((policy or timed_before) and not overlap and not steepcost)"
rc=$?
# the control for the chain-against-DFLASH test (it failed on the enlarged pair on 2026-12-07, accept 2.754 against
# 2.717): the same test on the small INT4 pair - the same Marlin kernels over rows 28x shorter. Passing here and
# failing there points at bf16 rounding in the widened draft; failing here too is a difference in the chain itself.
SGLANG_DDTREE_PAIR="$ROOT/small" SGLANG_DDTREE_REF="$ROOT/pair/b8" SGLANG_DDTREE_PROMPTS="$ROOT/pair/heldout_prompts.json" \
SGLANG_DDTREE_OUT="$OUT/small" SGLANG_DDTREE_START="none,dflash,ddtree-b7-c1-graphs,ddtree-b7-c1-graphs-dropleaf" \
  python3 -m pytest tests/gpu_sglang/test_ddtree_server.py -p no:cacheprovider -q -rfE -k chain_setting
rc_small=$?
tar czf "$OUT/logs.tgz" -C "$OUT" logs small 2>/dev/null
echo "[enlarged] tests done after $(( $(date +%s) - t0 )) s (rc $rc; the chain's control on the small pair rc $rc_small)"
[ "$rc" -eq 0 ] && exit "$rc_small"
exit $rc

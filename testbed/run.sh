#!/usr/bin/env bash
# The DDTREE-in-SGLang tests on the GPU test bed, from the project root on the GPU machine, after
# the test bed is staged (docs/gpu-testbed.md):
#   testbed/run.sh [pytest args]      e.g. -k 'not test_ddtree_greedy or b32-c8'; a test file named
#                                     (tests/gpu_sglang/test_width_policy.py) runs alone
#   testbed/run.sh --bench [bench/sglang_e2e.py args]   e.g. --quick
#   testbed/run.sh --production [pytest args]   the production example's unit as rendered
#       (.testbed/plan.json from testbed/production_plan.py, carried) with the playbooks'
#       clients: the pair is exported to the plan's model paths; smg comes from its pinned wheel
#       (requirements/gateway.txt), carried whole in .whl/ or in parts (SMG_PARTS: smg.part* +
#       smg.name, see tools/fetch_smg_wheel.sh), installed with --target into K26_GATEWAY_SITE
# Installs the project into the test bed's site (its entry point is how SGLang finds the plugin),
# trains the byte-level pair when none is there (training/train_pair.py --size $SIZE: small by default, kimi for
# Kimi K2.6's shapes - MLA + MoE + YaRN, exported as DeepseekV3ForCausalLM, EXPORT_ARGS=--kimi-wrapper for the
# KimiK25 wrapper; each size in a folder of its own; TRAIN_MINUTES;
# BLOCKS=8,16 adds a block-16 draft of the same target, served as draft16: configurations -k16),
# exports it to SGLang's formats and runs tests/gpu_sglang, which start one server per
# configuration (SGLANG_DDTREE_START: the ones started together first) and print a PASS/FAIL table.
# Results and server logs go to $OUTDIR (default $WORK/out); PACK=1 also packs the trained pair and
# the JIT caches there in parts of 15 MiB, to be carried back (UNPACK=DIR restores them first).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
SIZE=${SIZE:-small}
WORK=${WORK:-$SGLANG_TESTBED/ddtree$([ "$SIZE" = small ] || echo "-$SIZE")}; OUTDIR=${OUTDIR:-$WORK/out}; mkdir -p "$WORK" "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. testbed/carry.sh
. testbed/targets.sh
if [ -n "${UNPACK:-}" ]; then
  carry_unpack pair "$UNPACK" "$WORK"
  carry_unpack jit "$UNPACK" "$HOME"
fi
t0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . 2>&1 \
  | grep -vi "warning" || true
echo "[run] project installed in $(( $(date +%s) - t0 )) s"
BLOCKS=${BLOCKS:-8}            # draft block sizes of the pair: 8, or 8,16 for a block-16 draft beside it
missing=0
for b in ${BLOCKS//,/ }; do [ -f "$WORK/pair/b$b/draft/model.safetensors" ] || missing=1; done
if [ $missing = 1 ]; then
  python3 -m training.train_pair --out "$WORK/pair" --size "$SIZE" --minutes "${TRAIN_MINUTES:-1.5}" --block-sizes "$BLOCKS" \
    --prompts 32 --device cuda | grep -E "held-out|steps in|corpus" || exit 1
fi
python3 -m ddtree.reference.export --pair "$WORK/pair/b8" --out "$WORK/sglang-pair" ${EXPORT_ARGS:-} || exit 1
if [ "$SIZE" = kimi ]; then    # the same weights as the KimiK25 wrapper and with INT4 routed experts (test_kimi_path)
  python3 -m ddtree.reference.export --pair "$WORK/pair/b8" --out "$WORK/sglang-wrapper" --kimi-wrapper || exit 1
  python3 -m ddtree.reference.export --pair "$WORK/pair/b8" --out "$WORK/sglang-int4" --int4-experts || exit 1
  ln -sfn "$WORK/sglang-wrapper/target" "$WORK/sglang-pair/target-wrapper"
  ln -sfn "$WORK/sglang-int4/target" "$WORK/sglang-pair/target-int4"
fi
if [ -f "$WORK/pair/b16/draft/model.safetensors" ]; then      # the same target: only its draft is added
  python3 -m ddtree.reference.export --pair "$WORK/pair/b16" --out "$WORK/sglang-pair16" || exit 1
  ln -sfn "$WORK/sglang-pair16/draft" "$WORK/sglang-pair/draft16"
fi
echo "[run] pair ready after $(( $(date +%s) - t0 )) s"
if [ "${1:-}" = "--production" ]; then     # the rendered production unit on this pair
  shift
  root=$(python3 -c "import yaml; print(yaml.safe_load(open('testbed/testbed.yml'))['root'])")
  mkdir -p "$root/models"
  ln -sfn "$WORK/sglang-pair/target" "$root/models/target"; ln -sfn "$WORK/sglang-pair/draft" "$root/models/draft"
  export K26_GATEWAY_SITE=$root/gateway-site
  if [ ! -d "$K26_GATEWAY_SITE/smg" ]; then
    parts=${SMG_PARTS:-.whl}
    if ls "$parts"/smg.part* >/dev/null 2>&1; then cat "$parts"/smg.part* > "$root/$(cat "$parts"/smg.name)"; fi
    wheel=$(ls "$root"/smg-*.whl .whl/smg-*.whl 2>/dev/null | head -1)
    [ -n "$wheel" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target "$K26_GATEWAY_SITE" "$wheel" \
      2>&1 | grep -vi warning
  fi
  SGLANG_DDTREE_PAIR="$WORK/sglang-pair" SGLANG_DDTREE_REF="$WORK/pair/b8" \
  SGLANG_DDTREE_PROMPTS="$WORK/pair/heldout_prompts.json" SGLANG_DDTREE_OUT="$OUTDIR" \
  K26_TESTBED_PLAN=${K26_TESTBED_PLAN:-.testbed/plan.json} \
    python3 -m pytest tests/gpu_sglang/test_production_path.py -p no:cacheprovider -q -rfE "$@"
elif [ "${1:-}" = "--bench" ]; then    # bench/sglang_e2e.py on the same pair instead of the tests
  shift
  python3 bench/sglang_e2e.py --pair "$WORK/sglang-pair" --prompts "$WORK/pair/heldout_prompts.json" \
    --out "$OUTDIR" "$@"
else
  SGLANG_DDTREE_PAIR="$WORK/sglang-pair" SGLANG_DDTREE_REF="$WORK/pair/b8" \
  SGLANG_DDTREE_PROMPTS="$WORK/pair/heldout_prompts.json" SGLANG_DDTREE_OUT="$OUTDIR" \
    python3 -m pytest $(gpu_test_targets "$@") -p no:cacheprovider -q -rfE "$@"
fi
rc=$?
echo "[run] tests done after $(( $(date +%s) - t0 )) s (rc $rc)"
# what comes back through the device tool's $OUT (at most 8 files): tables, results, the logs and traces
if [ -n "${OUT:-}" ] && [ "$OUT" != "$OUTDIR" ]; then
  cp "$OUTDIR"/results.md "$OUTDIR"/results.json "$OUTDIR"/table.md "$OUTDIR"/tokens_per_s.png "$OUT"/ 2>/dev/null
  cp "$OUTDIR"/profile.md "$OUTDIR"/profile.json "$OUTDIR"/validate-report.md "$OUTDIR"/validate-float32-gaps.json \
    "$OUTDIR"/sweep-results.md "$OUT"/ \
    2>/dev/null
  tar czf "$OUT/logs.tgz" -C "$OUTDIR" logs $(cd "$OUTDIR" && ls -d traces 2>/dev/null) 2>/dev/null
  if [ "${PACK:-0}" = 1 ]; then
    carry_pack pair "$WORK" 0 pair
    carry_pack jit "$HOME" 30 .triton .cache/flashinfer .cache/tvm-ffi .cache/sglang
  fi
  ls -la "$OUT" | awk 'NR > 1 {print $5, $9}'
fi
exit $rc

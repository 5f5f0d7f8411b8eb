#!/usr/bin/env bash
# NONE vs DFLASH vs DDTREE inside SGLang on the GPU test bed, in one job (run from the project root
# on the GPU machine after the test bed is staged (docs/gpu-testbed.md); long: start it with
# testbed/bg.sh start bench/sglang_compare.sh, then bg.sh wait):
#   1. the glue kernels compiled on CUDA against their torch paths (tests/unit/test_triton_kernels.py)
#   2. a fresh pair with block-8 and block-16 drafts of one target (TRAIN_MINUTES, default 2.5)
#   3. bench/sglang_e2e.py: the full matrix on the block-8 draft, DFLASH and DDTREE on the block-16
#      draft (--k16), batch 1 and 8, temperature 0 and 0.7; step profiles; torch-profiler traces
#   4. with 2 GPUs: tests/gpu_sglang/test_tp2.py (TP 2 equality, the candidate all-gather)
# Everything it measured goes to $OUT/results.tgz (tables, JSON, plot, server logs, traces).
set -u
cd "$(dirname "$0")/.."
W=${SGLANG_COMPARE_DIR:-/tmp/sglang-compare}
rm -rf "$W"; mkdir -p "$W"
. .gpu-bundles/bin/env.sh
export PYTHONUNBUFFERED=1
t0=$(date +%s)
say() { echo "[compare $(( $(date +%s) - t0 )) s] $*"; }
PYTHONPATH=src:$PYTHONPATH python3 -m pytest -q -p no:cacheprovider tests/unit/test_triton_kernels.py -k "mask or commit" 2>&1 | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || { say "glue kernels failed on CUDA"; exit 1; }
say "glue kernels pass on CUDA"
OUT= OUTDIR=$W/bench BLOCKS=8,16 TRAIN_MINUTES=${TRAIN_MINUTES:-2.5} testbed/run.sh --bench --k16 \
  --profile ddtree-b64-c8-graphs,ddtree-b64-c8-graphs-k16 --trace dflash,ddtree-b64-c8-graphs \
  --start-timeout 600 --repeats 2 "$@"
bench_rc=$?
say "bench done (rc $bench_rc)"
tp_rc=skipped
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  OUT= OUTDIR=$W/tp2 SGLANG_DDTREE_START=none,none-tp2,ddtree-b32-c8-graphs-tp2,ddtree-b32-c8-graphs \
    testbed/run.sh -k tp2
  tp_rc=$?
  say "TP 2 tests done (rc $tp_rc)"
fi
cp "$SGLANG_TESTBED/ddtree/pair/train.json" "$W/bench/" 2>/dev/null
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/results.tgz" -C "$W" --exclude='*.safetensors' bench $( [ -d "$W/tp2" ] && echo tp2 )
  ls -la "$OUT"
fi
say "bench rc $bench_rc, TP 2 rc $tp_rc"
[ "$bench_rc" = 0 ] && { [ "$tp_rc" = 0 ] || [ "$tp_rc" = skipped ]; }

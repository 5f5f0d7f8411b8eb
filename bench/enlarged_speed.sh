#!/usr/bin/env bash
# Issue 69 item 4 as background jobs, from the project root on the GPU machine after staging (docs/gpu-testbed.md):
#   MARLIN_CACHE=/tmp/marlin-parts MODES=off BG=/tmp/speed-off testbed/bg.sh start bench/enlarged_speed.sh
#   BG=/tmp/speed-off testbed/bg.sh wait 540    (again at once until "[bg] ended"; carry .gpu-bundles/bin)
# then MODES=on with another BG on the same machine (the pair and the enlarged copy are kept there).
# 1. trains the decidable Kimi-shaped pair (training/train_pair.py --size kimi-allexp, TRAIN_MINUTES, default 2) unless
#    $ROOT/pair holds one (testbed/enlarged_pair.sh trains the same, with the same prompt files);
# 2. enlarges it to one TP-8 rank's widths with EXTRA_LAYERS extra MoE layers (default 24: 32 layers, ~40 GB - one
#    server fills an H100) into $BIG (/dev/shm/big);
# 3. bench/sglang_speed.py --phase fixed --one-at-a-time: each of CONFIGS started alone in each overlap mode of MODES,
#    driven at LOADS with MAX_NEW tokens an answer, the slower of two passes, stopped before the next; each of TRACE
#    (names as CONFIGS) also traced at one request (bench/trace_steps.py's table in traces/NAME.md).
# Results: $OUT/results.json after every row (a machine taken back keeps what came before), table.md, logs.tgz (the
# server logs, and metrics/CONFIG-LOAD.prom: its sglang:ddtree_* lines and forward device seconds after each row).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT=${ROOT:-$SGLANG_TESTBED/enlarged}; BIG=${BIG:-/dev/shm/big}; OUT=${OUT:-$ROOT/speed-out}; mkdir -p "$ROOT" "$OUT"
CONFIGS=${CONFIGS:-none,dflash,ddtree-b8-c1-graphs,ddtree-b8-c4-graphs,ddtree-b16-c4-graphs,ddtree-b32-c8-graphs,ddtree-auto-c8-graphs}
t0=$(date +%s)
. testbed/enlarged_common.sh
enlarged_prepare speed || exit 1
rm -rf /dev/shm/enlarged          # enlarged_pair.sh's 10-layer copy: /dev/shm is the machine's memory
enlarged_copy "$BIG" "${EXTRA_LAYERS:-24}" || exit 1
echo "[speed] pair and its enlarged copy ready after $(( $(date +%s) - t0 )) s"
python3 -m bench.sglang_speed --pair "$BIG" --prompts "$ROOT/pair/heldout_prompts.json" \
  --train-prompts "$ROOT/pair/train_prompts.json" --out "$OUT" --phase fixed --one-at-a-time --no-profile \
  --configs "$CONFIGS" --modes "${MODES:-off}" --loads "${LOADS:-1,8,32}" --max-new-tokens "${MAX_NEW:-96}" \
  --trace "${TRACE:-}"
rc=$?
tar czf "$OUT/logs.tgz" -C "$OUT" logs metrics traces 2>/dev/null
echo "[speed] done after $(( $(date +%s) - t0 )) s (rc $rc)"
exit $rc

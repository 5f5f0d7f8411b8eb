#!/usr/bin/env bash
# Issue 45's speed table on the GPU test bed, from the project root on the GPU machine:
#   bench/speed_sweep.sh train   the speed pair (bench/train_pair.py --size h200, block 8, TRAIN_MINUTES, default 8: the first run's 4 minutes gave DFLASH an accept length of 3.4 at 1 request),
#                                with held-out and training-file prompts; needs only the machine's torch, so it can run
#                                in the background while the test bed is staged (BG=/tmp/ddtree-train
#                                tests/gpu_sglang/bg.sh start bench/speed_sweep.sh train); a pair already there, or
#                                one carried back (UNPACK=DIR: the parts PACK=1 wrote), is kept
#   bench/speed_sweep.sh run     after staging: waits for the training, exports the pair to SGLang's formats and runs
#                                bench/sglang_speed.py (NONE, DFLASH, DDTREE +- the overlap scheduler, the schedule it
#                                finds; 1, 8, 16, 32, 48 running requests) alone on the GPU
# Results: $OUT/speed.tgz (table.md, results.json, schedule.json, server logs, train.json); PACK=1 also writes the pair
# to $OUT/pair.tgz.part* (15 MiB parts) to be carried back.
set -u
cd "$(dirname "$0")/.."
W=${SPEED_DIR:-/tmp/ddtree-speed}
PAIR=$W/pair
RESULTS=$W-out      # /tmp/ddtree-*/results.json: tests/gpu_sglang/bg.sh wait brings it back while the sweep runs
mkdir -p "$W"
t0=$(date +%s)
say() { echo "[speed $(( $(date +%s) - t0 )) s] $*"; }

train() {
  if [ -n "${UNPACK:-}" ] && ls "$UNPACK"/pair.tgz.part* > /dev/null 2>&1; then
    cat "$UNPACK"/pair.tgz.part* | tar xzf - -C "$W" && say "pair unpacked from $UNPACK"
  fi
  if [ -f "$PAIR/b8/draft/model.safetensors" ] && [ -f "$PAIR/train_prompts.json" ]; then
    say "pair already trained: $PAIR"; return 0
  fi
  PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} python3 bench/train_pair.py --out "$PAIR" --size h200 \
    --minutes "${TRAIN_MINUTES:-8}" --block-sizes 8 --prompts 64 --train-prompts 64 --device cuda > "$W/train.log" 2>&1
  rc=$?
  grep -E "held-out|steps in" "$W/train.log"
  say "training ended (rc $rc)"
  return $rc
}

run() {
  . .gpu-bundles/bin/env.sh
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  while [ -f /tmp/ddtree-train/log ] && [ ! -f /tmp/ddtree-train/rc ]; do sleep 5; done   # the background training
  [ -f "$PAIR/b8/draft/model.safetensors" ] || train || return 1
  python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . 2>&1 | grep -vi warning
  [ -d "$W/sglang-pair/target" ] || python3 -m ddtree.reference.export --pair "$PAIR/b8" --out "$W/sglang-pair" \
    > "$W/export.log" 2>&1 || { cat "$W/export.log"; return 1; }
  say "pair exported; the sweep starts"
  python3 bench/sglang_speed.py --pair "$W/sglang-pair" --prompts "$PAIR/heldout_prompts.json" \
    --train-prompts "$PAIR/train_prompts.json" --out "$RESULTS" "$@"
  rc=$?
  cp "$PAIR/train.json" "$W/train.log" "$RESULTS/" 2>/dev/null
  [ -n "${OUT:-}" ] && tar czf "$OUT/speed.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
  say "sweep ended (rc $rc)"
  return $rc
}

pack() {
  [ -n "${OUT:-}" ] || return 0
  tar czf - -C "$W" --exclude='*/sglang-pair' pair | split -b 15m - "$OUT/pair.tgz.part"
}

case ${1:-} in
  train) shift; train; rc=$?; [ "${PACK:-0}" = 1 ] && pack; exit $rc ;;
  run) shift; run "$@"; rc=$?; [ "${PACK:-0}" = 1 ] && pack; exit $rc ;;
  *) echo "usage: $0 train | run [sglang_speed.py options]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Issue 45's speed table on the GPU test bed, from the project root on the GPU machine:
#   testbed/speed_sweep.sh train   the speed pair (training/train_pair.py --size h200, block 8, TRAIN_MINUTES, default 8: the first run's 4 minutes gave DFLASH an accept length of 3.4 at 1 request),
#                                with held-out and training-file prompts; needs only the machine's torch, so it can run
#                                in the background while the test bed is staged (BG=/tmp/ddtree-train
#                                testbed/bg.sh start testbed/speed_sweep.sh train); a pair already there, or
#                                one carried back (UNPACK=DIR: the parts PACK=1 wrote), is kept. DISTILL=F (a share
#                                0..1): the draft trained on the target's own greedy continuations for that share
#                                of its batches (train_pair.py --distill); on a pair already there (carried) only
#                                its draft is trained again, on its target (--target-from), all TRAIN_MINUTES long;
#                                REDRAFT=1 trains the draft of a pair already there on again even when its share is
#                                DISTILL's (a draft that still accepts too little: 4 more minutes, say); BLOCK=16
#                                (default 8) the block-16 draft, in $PAIR/b16: on a pair already there a new draft on
#                                its target (a draft of another block size cannot be trained on), which run then sweeps
#   testbed/speed_sweep.sh run [JOB] [sglang_speed.py options]
#                                after staging: waits for the training, exports the pair to SGLang's formats and runs
#                                bench/sglang_speed.py (NONE, DFLASH, DDTREE +- the overlap scheduler, the schedule it
#                                finds beside its twins; 1, 8, 16, 32, 48 running requests) alone on the GPU. JOB splits
#                                the sweep into jobs of one device call each (about 8, 8 and 7 minutes on the H200,
#                                run back to back on one machine): fixed-off, fixed-on (phase 1 in each overlap mode),
#                                schedule (phase 2 from the fixed jobs' rows on this machine); all (the default) runs
#                                the whole sweep in one process (about 20 minutes). Each job's results: $RESULTS/JOB
#   testbed/speed_sweep.sh snapshot
#                                while (or after) a training run with SNAPSHOT_EVERY=S: its draft so far to
#                                $OUT/<SPEED_DIR's name>/draft.tgz.part* (training/put_draft.sh takes them like PACK=draft's):
#                                a machine taken back mid-training keeps what the last call brought back
# Results: $OUT/speed.tgz (every job's table.md, results.json, schedule.json, server logs; train.json); PACK=1 also
# writes the pair to $OUT/pair.tgz.part* (15 MiB parts) to be carried back; PACK=draft only its b$BLOCK/draft and
# train.json to $OUT/draft.tgz.part* (2 parts: a carried pair's target is unchanged, put them over its parts here).
# The training prints each draft's offline accept length on the sweep's 1-request prompts (train_pair.py: within
# 0.05 of SGLang's on 2026-12-05's pair), so a redraft is judged before staging SGLang.
set -u
cd "$(dirname "$0")/.."
case ${PACK:-0} in
  0|1|draft) ;;
  *) echo "PACK=$PACK is invalid: expected 0 (nothing), 1 (the whole pair) or draft (its draft and train.json)" >&2
     exit 2 ;;
esac
. testbed/carry.sh
W=${SPEED_DIR:-/tmp/ddtree-speed}
PAIR=$W/pair
BLOCK=${BLOCK:-8}   # the draft's block size: the sweep runs the pair folder $PAIR/b$BLOCK
case $BLOCK in
  8|16) ;;
  *) echo "BLOCK=$BLOCK is invalid: expected 8 or 16 (the draft's block size)" >&2; exit 2 ;;
esac
RESULTS=$W-out      # /tmp/ddtree-*/results.json: testbed/bg.sh wait brings it back while the sweep runs
mkdir -p "$W"
t0=$(date +%s)
say() { echo "[speed $(( $(date +%s) - t0 )) s] $*"; }

distilled_as_asked() {   # the --distill share the pair's draft was trained with (0 when none or no train.json) is
  # DISTILL's, compared as numbers (train.json writes 1.0 for DISTILL=1)
  python3 - "$PAIR/train.json" "${DISTILL:-0}" 2>/dev/null <<'PY'
import json, os, sys
path, asked = sys.argv[1:]
share = json.load(open(path)).get("distill") or 0 if os.path.exists(path) else 0
sys.exit(float(share) != float(asked))
PY
}

kept_pair() {   # a pair folder already here whose target the training keeps (b8 first), or nothing
  local b
  for b in 8 16; do
    [ -f "$PAIR/b$b/target/config.json" ] && [ -f "$PAIR/train_prompts.json" ] && { echo "$PAIR/b$b"; return; }
  done
}

train() {
  [ -n "${UNPACK:-}" ] && carry_unpack pair "$UNPACK" "$W"
  local trained=0 extra=() kept
  [ -f "$PAIR/b$BLOCK/draft/model.safetensors" ] && [ -f "$PAIR/train_prompts.json" ] && trained=1
  if [ "$trained" = 1 ] && distilled_as_asked && [ "${REDRAFT:-0}" != 1 ]; then
    say "pair already trained: $PAIR"; return 0
  fi
  # keep a pair's target and train its draft again (one of this block size: on from its weights; else a new one)
  kept=$(kept_pair)
  [ -n "$kept" ] && extra=(--target-from "$kept")
  # SNAPSHOT_EVERY=S: the draft so far every S seconds in $W/snapshot (speed_sweep.sh snapshot brings it back);
  # DISTILL_CACHE=FILE: trainings side by side on one carried target generate its greedy continuations once
  [ -n "${SNAPSHOT_EVERY:-}" ] && extra+=(--snapshot-every "$SNAPSHOT_EVERY" --snapshot-dir "$W/snapshot")
  [ -n "${DISTILL_CACHE:-}" ] && extra+=(--distill-cache "$DISTILL_CACHE")
  # TRAIN_SIZE, TRAIN_DEVICE and TRAIN_ARGS (more train_pair.py options) for a pair made elsewhere, e.g. the CPU test
  # shellcheck disable=SC2086
  PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} python3 -m training.train_pair --out "$PAIR" --size "${TRAIN_SIZE:-h200}" \
    --minutes "${TRAIN_MINUTES:-8}" --block-sizes "$BLOCK" --prompts 64 --train-prompts 64 \
    --device "${TRAIN_DEVICE:-cuda}" --distill "${DISTILL:-0}" "${extra[@]}" ${TRAIN_ARGS:-} > "$W/train.log" 2>&1
  rc=$?
  grep -E "held-out|steps in|distill|greedy|offline accept" "$W/train.log"
  say "training ended (rc $rc)"
  return $rc
}

job_args() {   # JOB -> sglang_speed.py's options for it (the schedule job: the modes whose fixed job ran here)
  local rows="" modes=""
  case $1 in
    all) ;;
    fixed-off) echo "--phase fixed --modes off" ;;
    fixed-on) echo "--phase fixed --modes on" ;;
    schedule)
      for m in off on; do
        [ -f "$RESULTS/fixed-$m/results.json" ] || continue
        rows=${rows:+$rows,}$RESULTS/fixed-$m/results.json; modes=${modes:+$modes,}$m
      done
      if [ -z "$rows" ]; then
        echo "speed_sweep.sh run schedule: no $RESULTS/fixed-off or fixed-on results.json on this machine: run the fixed-off and fixed-on jobs first" >&2
        return 2
      fi
      echo "--phase schedule --modes $modes --rows $rows" ;;
    *) echo "speed_sweep.sh run $1 is not a job: expected fixed-off, fixed-on, schedule or all" >&2; return 2 ;;
  esac
}

run() {
  job=all
  case ${1:-} in -*|"") ;; *) job=$1; shift ;; esac
  local opts; opts=$(job_args "$job") || return 2
  read -r -a args <<< "$opts"
  . .gpu-bundles/bin/env.sh
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  while [ -f /tmp/ddtree-train/log ] && [ ! -f /tmp/ddtree-train/rc ]; do sleep 5; done   # the background training
  [ -f "$PAIR/b$BLOCK/draft/model.safetensors" ] || train || return 1
  python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . 2>&1 | grep -vi warning
  local exported=$W/sglang-pair-b$BLOCK
  [ -d "$exported/target" ] || python3 -m ddtree.reference.export --pair "$PAIR/b$BLOCK" --out "$exported" \
    > "$W/export.log" 2>&1 || { cat "$W/export.log"; return 1; }
  say "pair exported (block $BLOCK); the sweep's job $job starts"
  python3 -m bench.sglang_speed --pair "$exported" --prompts "$PAIR/heldout_prompts.json" \
    --train-prompts "$PAIR/train_prompts.json" --out "$RESULTS/$job" "${args[@]}" "$@"
  rc=$?
  cp "$PAIR/train.json" "$W/train.log" "$RESULTS/" 2>/dev/null
  [ -n "${OUT:-}" ] && tar czf "$OUT/speed.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
  say "sweep ended (rc $rc)"
  return $rc
}

pack() {   # PACK=1: the whole pair; PACK=draft: its draft and train.json only (a carried pair's target is unchanged)
  [ -n "${OUT:-}" ] || return 0
  if [ "$PACK" = draft ]; then
    carry_pack draft "$W" 0 "pair/b$BLOCK/draft" pair/train.json
  else
    carry_pack pair "$W" 0 pair
  fi
}

snapshot() {   # the newest draft snapshot of a training (SNAPSHOT_EVERY) to $OUT/<SPEED_DIR's name>/draft.tgz.part*,
  # laid out as PACK=draft's parts (pair/bN/draft, pair/train.json) for put_draft.sh; one part (bf16 weights)
  local to
  to=${OUT:?speed_sweep.sh snapshot: OUT is not set (the device sets it)}/$(basename "$W")
  if [ ! -e "$W/snapshot/current/pair/train.json" ]; then
    echo "speed_sweep.sh snapshot: $W/snapshot/current holds no snapshot yet (train with SNAPSHOT_EVERY=S, and" \
      "wait S seconds into the draft's training)" >&2
    return 1
  fi
  mkdir -p "$to"
  OUT=$to carry_pack draft "$W/snapshot/current" 0 pair
}

case ${1:-} in
  train) shift; train; rc=$?; [ "${PACK:-0}" != 0 ] && pack; exit $rc ;;
  snapshot) snapshot; exit $? ;;
  run) shift; run "$@"; rc=$?; [ "${PACK:-0}" != 0 ] && pack; exit $rc ;;
  *) echo "usage: $0 train | snapshot | run [fixed-off | fixed-on | schedule | all] [sglang_speed.py options]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Issue 45's draft session on a bare GPU machine (no pair carried in): a fresh speed pair, then three drafts trained on
# its target side by side, one process tree under bg.sh (from the project root):
#   BG=/tmp/ddtree-train-P testbed/bg.sh start training/draft_session.sh
# Stage 1 (PAIR_MINUTES, default 8, train_pair.py's most for a whole pair on CUDA): testbed/speed_sweep.sh train in
#   $ROOT-P, block 8, DISTILL=1 (the draft's batches all the target's greedy continuations), PACK=1: the whole pair in
#   $OUT/pair.tgz.part* (15 MiB parts), which bg.sh wait brings back a few a call.
# Stage 2 (DRAFT_MINUTES, default 11): three copies of that pair, $ROOT-A, -B, -C, each trained on side by side
#   (speed_sweep.sh train REDRAFT=1 DISTILL=1), a snapshot of each draft every SNAPSHOT_EVERY s (default 60; wait calls
#   bring them back with speed_sweep.sh snapshot), one file of greedy continuations (DISTILL_CACHE) for the three:
#     A  block 8, on from stage 1's draft
#     B  the same, DFlash's weighting of a block's early positions (--depth-decay 4) and twice the batch (WIDE_BATCH,
#        default 128)
#     C  a new block-16 draft (--depth-decay 7, WIDE_BATCH)
#   then training/best_draft.py over the three (the best folder on the last line of its table).
# TRAIN_ARGS goes to every training before a variant's own options (the CPU test's small settings); TRAIN_SIZE and
# TRAIN_DEVICE pass through to speed_sweep.sh. Each stage-2 log: $ROOT-X.log. Exit status: stage 1's when it failed,
# else 1 when any stage-2 training failed.
set -u
cd "$(dirname "$0")/.."
ROOT=${ROOT:-/tmp/ddtree-speed}
CACHE=${DISTILL_CACHE:-$ROOT-distill.safetensors}   # stage 2's greedy continuations, made once for the three
t0=$(date +%s)
say() { echo "[draft-session $(( $(date +%s) - t0 )) s] $*"; }

fresh_pair() {   # stage 1 -> $ROOT-P/pair (b8), packed to $OUT when OUT is set
  SPEED_DIR=$ROOT-P DISTILL=1 BLOCK=8 TRAIN_MINUTES=${PAIR_MINUTES:-8} PACK=${OUT:+1} \
    bash testbed/speed_sweep.sh train
}

variant() {   # NAME BLOCK OPTIONS: one stage-2 training of a copy of the fresh pair, in the background
  local name=$1 block=$2 opts=$3 dir=$ROOT-$1
  rm -rf "$dir"; mkdir -p "$dir"
  cp -r "$ROOT-P/pair" "$dir/pair"
  SPEED_DIR=$dir REDRAFT=1 DISTILL=1 BLOCK=$block TRAIN_MINUTES=${DRAFT_MINUTES:-11} \
    SNAPSHOT_EVERY=${SNAPSHOT_EVERY:-60} DISTILL_CACHE=$CACHE \
    TRAIN_ARGS="${TRAIN_ARGS:-} --distill-windows ${DISTILL_WINDOWS:-16384} $opts" OUT='' \
    bash testbed/speed_sweep.sh train > "$dir.log" 2>&1 &
  say "variant $name (block $block $opts) started, pid $!"
}

say "stage 1: a fresh pair in $ROOT-P"
fresh_pair || { rc=$?; say "stage 1 failed (rc $rc)"; exit $rc; }
rm -f "$CACHE"   # one of an earlier target: the fresh one's are made anew
variant A 8 ""
variant B 8 "--depth-decay 4 --batch ${WIDE_BATCH:-128}"
variant C 16 "--depth-decay 7 --batch ${WIDE_BATCH:-128}"
failed=0
for pid in $(jobs -p); do wait "$pid" || failed=1; done
for x in A B C; do tail -n 4 "$ROOT-$x.log"; done
say "stage 2 ended (a training failed: $failed)"
python3 -m training.best_draft "$ROOT-A" "$ROOT-B" "$ROOT-C"
exit $failed

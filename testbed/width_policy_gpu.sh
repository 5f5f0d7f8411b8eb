#!/usr/bin/env bash
# Issue 70 on the GPU as one background chain, from the project root on the GPU machine after staging
# (docs/gpu-testbed.md), the pairs trained beside the staging under bg.sh (TRAIN_BG): the policy tests start once the
# small pair is there, the enlarging once TRAIN_BG has ended (the kimi-allexp training took 5+ minutes on 2026-12-07
# with --train-prompts, the small one 1.5):
#   MARLIN_CACHE=/tmp/marlin-parts BG=/tmp/policy testbed/bg.sh start testbed/width_policy_gpu.sh
#   BG=/tmp/policy testbed/bg.sh wait 540     (again at once until "[bg] ended"; carry .gpu-bundles/bin)
# 1. tests/gpu_sglang/test_width_policy.py on the small pair ($SGLANG_TESTBED/ddtree/pair, testbed/run.sh): the
#    policy with its step without speculation - every verify graph timed before ready (width 1 among them), greedy
#    equal to NONE with the policy on, plain and overlap, and on the -steepcost server whose made-up table makes
#    both kinds of step run, the sampling test; the kimi-allexp pair is enlarged meanwhile (CPU and memory);
# 2. bench/enlarged_speed.sh on the enlarged pair (issue 69 item 4 and issue 70 item 4): CONFIGS in MODES at LOADS.
# POLICY_K narrows step 1 to the tests pytest -k selects (with POLICY_SERVERS: the servers they need).
# Results: $OUT/policy/ (step 1: results, logs) and $OUT (step 2: results.json, table.md, logs.tgz).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
TRAIN_BG=${TRAIN_BG:-/tmp/train}
SMALL=$SGLANG_TESTBED/ddtree/pair
while [ -f "$TRAIN_BG/log" ] && [ ! -f "$TRAIN_BG/rc" ] && [ ! -f "$SMALL/heldout_prompts.json" ]; do sleep 5; done
ROOT=${ROOT:-$SGLANG_TESTBED/enlarged}; BIG=${BIG:-/dev/shm/big}; OUT=${OUT:-/tmp/policy-out}; mkdir -p "$OUT/policy"
t0=$(date +%s)
. testbed/enlarged_common.sh
( while [ -f "$TRAIN_BG/log" ] && [ ! -f "$TRAIN_BG/rc" ]; do sleep 5; done
  enlarged_copy "$BIG" "${EXTRA_LAYERS:-24}" > "$OUT/enlarge.log" 2>&1
  echo "[policy] enlarged after $(( $(date +%s) - t0 )) s (rc $?)" ) &
enlarging=$!
OUTDIR="$OUT/policy" \
SGLANG_DDTREE_START=${POLICY_SERVERS:-none,ddtree-auto-c8-graphs,ddtree-auto-c8-graphs-overlap,ddtree-auto-c8-graphs-steepcost} \
  testbed/run.sh tests/gpu_sglang/test_width_policy.py ${POLICY_K:+-k "$POLICY_K"}
echo "[policy] width policy tests rc $? after $(( $(date +%s) - t0 )) s"
tar czf "$OUT/policy-logs.tgz" -C "$OUT/policy" . 2>/dev/null
wait "$enlarging"
[ -n "${NO_SPEED:-}" ] && exit 0
OUT="$OUT" BIG="$BIG" ROOT="$ROOT" bench/enlarged_speed.sh

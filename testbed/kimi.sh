#!/usr/bin/env bash
# Issue 31's GPU run on the Kimi-shaped pair, from the project root on the GPU machine after staging, as one
# job (testbed/bg.sh start testbed/kimi.sh):
#   0. in the background from the start: one dummy-weight INT4 server (bench/kimi_probe.py --group marlin-warm),
#      whose first start JIT-compiles SGLang's Marlin MoE kernel into ~/.cache/sglang/jit (more than 8 minutes
#      on the shared 16-core machine on 2026-12-02) while the pair trains and part 1 runs;
#   1. trains the pair (run.sh SIZE=kimi) and runs part 1: the export checks, DFLASH, the chain, temperature 0.7,
#      operations, budget 32 cap 8 at temperature 0, test_kimi_path but the Marlin INT4 servers, and constrained
#      decoding (test_grammars: NONE, DFLASH and DDTREE servers that tokenize; issue 33) - 17 servers started at once;
#   2. part 2: the rest of the budget x cap x graphs matrix at temperature 0 and the graph-log check;
#   3. part 3, once the Marlin build is done (or MARLIN_WAIT seconds from the start have passed): the INT4 test
#      under SGLang's Marlin runner.
# MARLIN=0 leaves out the warm-up and part 3 (the nvcc build takes the host's cores from the server starts).
# At most 17 servers share the GPU and the host's memory at once. Each part's results.md / results.json /
# logs.tgz come back prefixed part1- / part2- / part3-, the warm-up's log as marlin-warm.log.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
export SIZE=kimi TRAIN_MINUTES=${TRAIN_MINUTES:-1.5}
WORK=$SGLANG_TESTBED/ddtree-kimi; mkdir -p "$WORK"
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . 2>&1 | grep -vi warning
MARLIN=${MARLIN:-1}
if [ "$MARLIN" = 1 ]; then
  python3 -m bench.kimi_probe --out "$WORK/marlin-warm" --group marlin-warm --arch dsv3 --timeout "${MARLIN_WAIT:-1200}" \
    > "$WORK/marlin-warm.log" 2>&1 &
  warm=$!
fi
kimi=$(python3 -c "from tests.gpu_sglang.test_kimi_path import KIMI_SERVERS; print(','.join(KIMI_SERVERS))")
marlin=$(python3 -c "from tests.gpu_sglang.test_kimi_path import KIMI_SERVERS; print(','.join(n for n in KIMI_SERVERS
if '-int4' in n and not n.endswith('-moetriton')))")
matrix=$(python3 -c "from testbed import servers as s
print(','.join(c.name for c in s.MATRIX if '-b32-c8-' not in c.name))")
rc=0
move() { for f in results.md results.json logs.tgz; do [ -f "$OUT/$f" ] && mv "$OUT/$f" "$OUT/$1-$f"; done; }
grammar=$(python3 -c "from tests.gpu_sglang.test_grammars import GRAMMAR_SERVERS; print(','.join(GRAMMAR_SERVERS))")
SGLANG_DDTREE_START="none,dflash,ddtree-b32-c8-graphs,ddtree-b32-c8-eager,ddtree-b7-c1-graphs,$(echo "$kimi" | tr ',' '\n' \
  | grep -vxF -f <(echo "$marlin" | tr ',' '\n') | paste -sd,),$grammar" OUTDIR=${OUTDIR1:-/tmp/ddtree-kimi-part1} \
  testbed/run.sh -k '(not test_ddtree_greedy or b32-c8) and not production and not tp2 and not marlin and not test_overlap and not test_widths' \
  || rc=1
move part1
SGLANG_DDTREE_START="none,$matrix" OUTDIR=${OUTDIR2:-/tmp/ddtree-kimi-part2} \
  testbed/run.sh -k '(test_ddtree_greedy and not b32-c8) or test_graph_runs' || rc=1
move part2
[ "$MARLIN" = 1 ] || exit $rc
echo "[kimi] waiting for the Marlin warm-up (pid $warm)"; wait "$warm"; cp "$WORK/marlin-warm.log" "$OUT/" 2>/dev/null
SGLANG_DDTREE_START="none,$marlin" OUTDIR=${OUTDIR3:-/tmp/ddtree-kimi-part3} \
  testbed/run.sh -k 'marlin' || rc=1
move part3
exit $rc

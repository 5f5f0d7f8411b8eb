#!/usr/bin/env bash
# Issue 31's GPU run on the Kimi-shaped pair, from the project root on the GPU machine after staging, as one
# job (tests/gpu_sglang/bg.sh start tests/gpu_sglang/kimi.sh): trains the pair (run.sh SIZE=kimi), then two
# pytest sessions so that at most 17 servers share the GPU and the host's memory at once:
#   part 1: the export checks, DFLASH, the chain, temperature 0.7, operations, budget 32 cap 8 at temperature 0,
#           and test_kimi_path (radix cache, KimiK25 wrapper, INT4 experts under Marlin and Triton, FlashInfer)
#   part 2: the rest of the budget x cap x graphs matrix at temperature 0, and the graph-log check
# Each part's results.md / results.json / logs.tgz come back prefixed part1- / part2-.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
export SIZE=kimi TRAIN_MINUTES=${TRAIN_MINUTES:-1.5}
kimi=$(python3 -c "from tests.gpu_sglang.test_kimi_path import KIMI_SERVERS; print(','.join(KIMI_SERVERS))")
matrix=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import sglang_servers as s
print(','.join(c.name for c in s.MATRIX if '-b32-c8-' not in c.name))")
rc=0
move() { for f in results.md results.json logs.tgz; do [ -f "$OUT/$f" ] && mv "$OUT/$f" "$OUT/$1-$f"; done; }
SGLANG_DDTREE_START="none,dflash,ddtree-b32-c8-graphs,ddtree-b32-c8-eager,ddtree-b7-c1-graphs,$kimi" \
  tests/gpu_sglang/run.sh -k '(not test_ddtree_greedy or b32-c8) and not production and not tp2' || rc=1
move part1
SGLANG_DDTREE_START="none,$matrix" OUTDIR=${OUTDIR2:-/tmp/ddtree-kimi-part2} \
  tests/gpu_sglang/run.sh -k '(test_ddtree_greedy and not b32-c8) or test_graph_runs' || rc=1
move part2
exit $rc

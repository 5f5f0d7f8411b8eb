#!/usr/bin/env bash
# Issues 32 and 35 on the GPU test bed, one job from the project root after staging
# (testbed/bg.sh start testbed/widths_overlap.sh; SIZE=small by default, kimi for the
# Kimi-shaped pair):
#   1. the budget / cap schedule inside SGLang (test_widths: graphs per width, greedy while the running batch
#      crosses widths, the chi-square at two widths) and the graph-log check;
#   2. DDTREE under the overlap scheduler (test_overlap: greedy at 1, 8 and 48 requests with staggered arrivals
#      and lengths, the chi-square, no synchronising call site of this project in the step, no deprecation
#      warning) and the graph-log check.
# Each part's results.md / results.json / logs.tgz come back prefixed widths- / overlap-.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
rc=0
move() { for f in results.md results.json logs.tgz; do [ -f "$OUT/$f" ] && mv "$OUT/$f" "$OUT/$1-$f"; done; }
widths=$(python3 -c "from testbed import servers as s
print(','.join(c.name for c in s.SCHEDULED))")
SGLANG_DDTREE_START="none,$widths" OUTDIR=${OUTDIRW:-/tmp/ddtree-widths} \
  testbed/run.sh -k 'test_widths or test_graph_runs' || rc=1
move widths
overlap=$(python3 -c "from tests.gpu_sglang.test_overlap import OVERLAP_SERVERS; print(','.join(OVERLAP_SERVERS))")
SGLANG_DDTREE_START="none,$overlap" OUTDIR=${OUTDIRO:-/tmp/ddtree-overlap} \
  testbed/run.sh -k 'test_overlap or test_graph_runs' || rc=1
move overlap
exit $rc

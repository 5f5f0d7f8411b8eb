#!/usr/bin/env bash
# The width policy's shortest GPU check (issue 70), for a session's last device minutes, from the project root on the
# GPU machine after staging: a random-weight pair (ddtree.reference.init --preset small, block 8; the draft's target
# layers moved below the last one, as SGLang needs), one DDTREE server with --speculative-ddtree-budget auto and CUDA
# graphs, then tests/gpu_sglang/test_width_policy.py's start-up test (every verify graph timed before ready, the
# table in the log and on /metrics) and 16 greedy requests, 8 at a time, with the steps of each option read back from
# /metrics. A random draft accepts almost nothing: this proves the policy runs inside SGLang, not what it earns
# (testbed/enlarged_pair.sh POLICY_ONLY=1 on a trained pair does that).
#   BG=/tmp/policy testbed/bg.sh start bench/policy_smoke.sh; BG=/tmp/policy testbed/bg.sh wait 300
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
ROOT=${ROOT:-$SGLANG_TESTBED/policy-smoke}; OUT=${OUT:-$ROOT/out}; mkdir -p "$ROOT" "$OUT"
t0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . 2>&1 \
  | grep -vi warning || true
python3 -m ddtree.reference.init --out "$ROOT/ref" --preset small --seed 0 || exit 1
python3 - "$ROOT" <<'EOF' || exit 1
import json, random, sys
from pathlib import Path
root = Path(sys.argv[1])
layers = json.loads((root / "ref/target/config.json").read_text())["num_hidden_layers"]
cfg = root / "ref/draft/config.json"          # the draft's target layers below the last (as many: same weights' shapes)
c = json.loads(cfg.read_text())
n = len(c["dflash_config"]["target_layer_ids"])
c["dflash_config"]["target_layer_ids"] = list(range(max(0, layers - 1 - n), layers - 1))
cfg.write_text(json.dumps(c))
rng = random.Random(0)
vocab = json.loads((root / "ref/target/config.json").read_text())["vocab_size"]
(root / "prompts.json").write_text(json.dumps([[rng.randrange(vocab) for _ in range(260)] for _ in range(16)]))
EOF
python3 -m ddtree.reference.export --pair "$ROOT/ref" --out "$ROOT/pair" || exit 1
echo "[policy] pair ready after $(( $(date +%s) - t0 )) s"
SGLANG_DDTREE_PAIR="$ROOT/pair" SGLANG_DDTREE_REF="$ROOT/ref" SGLANG_DDTREE_PROMPTS="$ROOT/prompts.json" \
SGLANG_DDTREE_OUT="$OUT" SGLANG_DDTREE_START=ddtree-auto-c8-graphs \
  python3 -m pytest tests/gpu_sglang/test_width_policy.py tests/gpu_sglang/test_policy_smoke.py -p no:cacheprovider \
  -q -rfE -k "(timed_before and not overlap) or smoke"
rc=$?
tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null
echo "[policy] done after $(( $(date +%s) - t0 )) s (rc $rc)"
exit $rc

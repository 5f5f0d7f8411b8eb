#!/usr/bin/env bash
# Issue 44's GPU job, from the project root on the GPU machine after staging (testbed/bg.sh start
# testbed/decide.sh [PART]):
#   trains the pairs of SIZES (default: small = dense Qwen3-style, kimi-dense = MLA + dense MLPs, kimi-allexp = MLA +
#   MoE with every expert active, kimi = MLA + MoE top 2 of 8), all at once on the one GPU (TRAIN_MINUTES each,
#   default 1.5), once per machine (a pair already there is kept), exports each to SGLang's formats, then
#   part "nodes" (default): tests/gpu_sglang/test_node_logits.py over all of them (issue 44 items 1-3: tree against
#              path node by node with the chain control and a deliberate fault, the committed KV, the radix cache);
#              NODE_VARIANTS (server names, comma-separated, each with -dump) adds trees held to the same rule on the
#              pairs without routing choices (issue 45: the budget schedule across widths, the overlap scheduler);
#   part "greedy": the temperature-0 test of test_ddtree_server.py (GREEDY_MATRIX, default budget 8 cap 8, 32 x 4,
#              32 x 8, 64 x 8 with graphs and 32 x 8 eager; 1 and 8 at once; the chain against DFLASH; the export) on
#              GREEDY_SIZES (default kimi-dense kimi-allexp), one pytest session per pair at once (ports 10000 + 100 x
#              i), and beside them on the small pair issue 45's schedule servers (test_widths) and the overlap
#              scheduler's greedy and sync-check tests (test_overlap);
#              GREEDY_WIDTHS=0 leaves the small pair's servers out;
#   part "requests": issue 45's request features on REQUEST_SIZES (default small kimi-dense: pairs on which SGLang's
#              own DFLASH under deterministic inference is expected to equal NONE, so identity is decidable), one
#              pytest session per pair at once (ports 11000 + 100 x i): tests/gpu_sglang/test_requests.py
#              (deterministic inference as the control, seeds, penalties and min_new_tokens, custom logit
#              processors, output logprobs) and test_grammars.py, each pair's controls on servers beside its DDTREE
#              servers; REQUEST_K selects tests (pytest -k), REQUEST_START the servers started (default: all of both
#              modules). The features DDTREE serves under the overlap scheduler (seeds, output logprobs, grammars;
#              passed 2026-12-05 16:35, docs/benchmarks.md): REQUEST_K=overlap REQUEST_START=none-det-clp-tok,
#              dflash-det-clp-tok,ddtree-b32-c8-graphs,ddtree-b32-c8-graphs-det-overlap-tok,none-grammar,
#              ddtree-b32-c8-graphs-grammar-overlap (one comma-separated value);
#   part "gates": issue 45's gated features on GATES_SIZES (default kimi-dense kimi-allexp: MLA, identity decidable),
#              one pytest session per pair at once (ports 12000 + 100 x i): tests/gpu_sglang/test_widths.py (the
#              budget schedule: each width's graphs, greedy while a batch crosses widths, sampling at two widths) and
#              test_overlap.py (the overlap scheduler: greedy at 1, 8 and 48 with arrivals, sampling, no host sync);
#              GATES_K selects tests (pytest -k), GATES_START the servers started (e.g. GATES_SIZES=kimi-allexp
#              GATES_K=test_sampling_matches_none_at_two_widths GATES_START=none,ddtree-sched-graphs);
#   part "kimipath": tests/gpu_sglang/test_kimi_path.py on KIMIPATH_SIZES (default kimi-dense kimi-allexp: identity
#              decidable) - the radix cache, the KimiK25 wrapper, and on the MoE pair INT4 experts under SGLang's Triton
#              MoE runner (issue 44 item 3);
#   part "moe": tests/gpu_sglang/test_moe_partings.py on MOE_SIZE (default kimi: top 2 of 8) - DDTREE's partings from
#              NONE per 1,000 tokens against SGLang's DFLASH's, and the sibling fault (issue 44 item 3);
#   part "marlin": SGLang's Marlin INT4 MoE kernel JIT-built by one warm-up server (MARLIN_CACHE=DIR: the parts a
#              previous run packed are unpacked first), the JIT cache packed to $OUT/marlin-jit.tgz.part* (15 MiB parts,
#              to be carried back), then the INT4 test under Marlin on MARLIN_SIZE (default kimi-allexp; issue 44 item 4);
#   UNPACK=DIR restores pairs a previous job packed with PACK=1 ($OUT/pairs.tgz.part*, carried back in 15 MiB parts),
#   so a pair is trained once and carried from an ignored folder (issue 44 item 5);
#   part "train": only the pairs, with torch alone (before the test bed is staged: BG=/tmp/ddtree-train-decide
#              testbed/bg.sh start testbed/decide.sh train; the other parts wait for it);
#   part "all": nodes, then greedy; several parts in one call run one after the other (decide.sh requests greedy),
#              with PARALLEL=1 at once on the one GPU (the pairs are trained first, once).
# Results come back through $OUT, one archive per part (nodes.tgz, greedy.tgz: results.md / results.json, node-check.md,
# server logs) and train-logs.tgz; each part's tables are printed too.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. .gpu-bundles/bin/env.sh
. testbed/carry.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PART=${1:-nodes}
SIZES=${SIZES:-small kimi-dense kimi-allexp kimi}
ROOT=$SGLANG_TESTBED/decide; mkdir -p "$ROOT"; OUT=${OUT:-$ROOT/out}; mkdir -p "$OUT"
TRAIN_BG=${TRAIN_BG:-/tmp/ddtree-train-decide}     # where part train runs under bg.sh while the test bed is staged
t0=$(date +%s)

unpack_pairs() {   # UNPACK=DIR: the pairs a previous job packed (PACK=1), so this machine need not train them again
  [ -n "${UNPACK:-}" ] || return 0
  local s missing=0
  for s in $SIZES; do [ -f "$ROOT/$s/pair/b8/draft/model.safetensors" ] || missing=1; done
  [ $missing = 1 ] || return 0
  if carry_unpack pairs "$UNPACK" "$ROOT"; then
    echo "[decide] pairs unpacked: $(cd "$ROOT" && ls -d */pair | tr '\n' ' ')"
  else
    echo "[decide] UNPACK=$UNPACK holds no pairs.tgz.part*: the pairs are trained here" >&2
  fi
}

pack_pairs() {    # PACK=1: SIZES' trained pairs (reference formats only) to $OUT/pairs.tgz.part*, 15 MiB parts to carry back
  [ "${PACK:-0}" = 1 ] || return 0
  local s paths=()
  for s in $SIZES; do paths+=("$s/pair"); done
  carry_pack pairs "$ROOT" 0 "${paths[@]}"
}

train() {     # SIZES' pairs trained at once (a pair already on this machine or unpacked is kept); only torch needed
  unpack_pairs
  for s in $SIZES; do
    [ -f "$ROOT/$s/pair/b8/draft/model.safetensors" ] && continue
    mkdir -p "$ROOT/$s"
    PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} python3 -m training.train_pair --out "$ROOT/$s/pair" --size "$s" --minutes "${TRAIN_MINUTES:-1.5}" --block-sizes 8 \
      --prompts 32 --device cuda > "$ROOT/$s/train.log" 2>&1 &
  done
  wait
  for s in $SIZES; do grep -E "held-out|steps in" "$ROOT/$s/train.log" 2>/dev/null | sed "s/^/[$s] /"; done
}

export_pair() {   # pair $1 in SGLang's formats; an MLA target also as the KimiK25 wrapper, with MoE also INT4 experts
  local s=$1 w="$ROOT/$1" cfg="$ROOT/$1/pair/b8/target/config.json"
  [ -d "$w/sglang-pair/target" ] || python3 -m ddtree.reference.export --pair "$w/pair/b8" --out "$w/sglang-pair" \
    > "$w/export.log" 2>&1 || { cat "$w/export.log"; return 1; }
  local kind   # mla, mla-moe (MoE layers present) or plain, from the reference target's config
  kind=$(python3 -c "import json, sys; c = json.load(open(sys.argv[1])); mla = c.get('kv_lora_rank', 0) > 0
moe = c.get('n_routed_experts', 0) > 0 and c.get('first_k_dense_replace', 0) < c['num_hidden_layers']
print('plain' if not mla else 'mla-moe' if moe else 'mla')" "$cfg")
  [ "$kind" = plain ] && return 0
  [ -d "$w/sglang-wrapper/target" ] || python3 -m ddtree.reference.export --pair "$w/pair/b8" --out "$w/sglang-wrapper" \
    --kimi-wrapper >> "$w/export.log" 2>&1 || { cat "$w/export.log"; return 1; }
  ln -sfn "$w/sglang-wrapper/target" "$w/sglang-pair/target-wrapper"
  [ "$kind" = mla-moe ] || return 0
  [ -d "$w/sglang-int4/target" ] || python3 -m ddtree.reference.export --pair "$w/pair/b8" --out "$w/sglang-int4" \
    --int4-experts >> "$w/export.log" 2>&1 || { cat "$w/export.log"; return 1; }
  ln -sfn "$w/sglang-int4/target" "$w/sglang-pair/target-int4"
}

prepare() {   # the plugin installed, SIZES' pairs trained (here, or by part "train" started before) and exported
  # (once per job: the parts a multi-part job runs find it done, and neither install into $SITE at once nor pack again)
  [ "${DECIDE_PREPARED:-0}" = 1 ] && [ -f "$ROOT/pairs.json" ] && return 0
  python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . 2>&1 | grep -vi warning
  while [ -f "$TRAIN_BG/log" ] && [ ! -f "$TRAIN_BG/rc" ]; do sleep 5; done    # part train in the background
  train
  for s in $SIZES; do export_pair "$s" || return 1; done
  pack_pairs
  echo "[decide] pairs ready after $(( $(date +%s) - t0 )) s"
  python3 - "$ROOT" $SIZES > "$ROOT/pairs.json" <<'PY'
import json, sys
root, sizes = sys.argv[1], sys.argv[2:]
print(json.dumps({s: {"pair": f"{root}/{s}/sglang-pair", "ref": f"{root}/{s}/pair/b8",
                      "prompts": f"{root}/{s}/pair/heldout_prompts.json"} for s in sizes}))
PY
}

if [ "$PART" = train ]; then train; exit $?; fi
if [ $# -gt 1 ] || [ "$PART" != "${PART//+/}" ]; then
  # several parts: the pairs once, then the parts one after the other (PARALLEL=1: at once); parts joined by +
  # (nodes+kimipath) run one after the other inside one parallel slot
  prepare || exit 1
  export DECIDE_PREPARED=1
  rc=0
  in_turn() { local r=0; for p in ${1//+/ }; do "$0" "$p" || r=1; done; return $r; }
  for part in "$@"; do
    if [ "${PARALLEL:-0}" = 1 ]; then in_turn "$part" > "$ROOT/part-$part.log" 2>&1 & else in_turn "$part" || rc=1; fi
  done
  if [ "${PARALLEL:-0}" = 1 ]; then
    for job in $(jobs -p); do wait "$job" || rc=1; done
    for part in "$@"; do echo "===== part $part"; cat "$ROOT/part-$part.log"; done
  fi
  exit $rc
fi
prepare || exit 1
one() {   # the conftest's single-pair variables, for pair $1
  echo "SGLANG_DDTREE_PAIR=$ROOT/$1/sglang-pair SGLANG_DDTREE_REF=$ROOT/$1/pair/b8 SGLANG_DDTREE_PROMPTS=$ROOT/$1/pair/heldout_prompts.json"
}
report() {   # part $1's logs and tables for pairs $2... ($ROOT/PART-PAIR.log, /tmp/ddtree-PART-PAIR/): each failed test
  # and the summary line printed, the tables shown, rc set, everything archived to $OUT/PART.tgz
  local part=$1; shift
  for s in "$@"; do
    grep -q " failed\| error" "$ROOT/$part-$s.log" && rc=1
    grep -E "^(FAILED|ERROR) " "$ROOT/$part-$s.log" | cut -c1-300 | sed "s/^/[$part $s] /"    # pytest -rfE: which test, why
    grep -E "passed|failed|skipped" "$ROOT/$part-$s.log" | tail -1 | sed "s/^/[$part $s] /"
    cat "/tmp/ddtree-$part-$s/results.md" 2>/dev/null
  done
  tar czf "$OUT/$part.tgz" $(ls -d /tmp/ddtree-$part-* "$ROOT"/$part-*.log 2>/dev/null) 2>/dev/null
}
rc=0
case $PART in
  nodes)
    first=${SIZES%% *}
    if [ "${WITH_WIDTHS:-0}" = 1 ]; then     # issue 45's schedule servers beside it, on the small pair
      env $(one small) SGLANG_DDTREE_OUT=/tmp/ddtree-widths SGLANG_DDTREE_BASE_PORT=14000 \
        SGLANG_DDTREE_START="none,ddtree-sched-graphs,ddtree-sched-eager" python3 -m pytest tests/gpu_sglang/test_widths.py \
        -p no:cacheprovider -q -rfE -k "test_each_width or test_greedy_equals_none_while" > "$ROOT/widths.log" 2>&1 &
    fi
    env $(one "$first") SGLANG_DDTREE_PAIRS="$ROOT/pairs.json" SGLANG_DDTREE_OUT=/tmp/ddtree-nodes \
      SGLANG_DDTREE_NODE_VARIANTS="${NODE_VARIANTS:-}" \
      python3 -m pytest tests/gpu_sglang/test_node_logits.py -p no:cacheprovider -q -rfE || rc=1
    wait
    cat /tmp/ddtree-nodes/results.md /tmp/ddtree-nodes/node-check.md /tmp/ddtree-widths/results.md 2>/dev/null
    tar czf "$OUT/nodes.tgz" --exclude=dumps -C /tmp $(cd /tmp && ls -d ddtree-nodes ddtree-widths 2>/dev/null) \
      $(ls "$ROOT"/widths.log 2>/dev/null) 2>/dev/null ;;
  greedy)
    i=0
    GREEDY_MATRIX=${GREEDY_MATRIX:-ddtree-b8-c8-graphs,ddtree-b32-c4-graphs,ddtree-b32-c8-graphs,ddtree-b64-c8-graphs,ddtree-b32-c8-eager}
    for s in ${GREEDY_SIZES:-kimi-dense kimi-allexp}; do
      names=none,dflash,ddtree-b7-c1-graphs,ddtree-b7-c1-graphs-dropleaf,$GREEDY_MATRIX
      env $(one "$s") SGLANG_DDTREE_OUT="/tmp/ddtree-greedy-$s" SGLANG_DDTREE_START="$names" \
        SGLANG_DDTREE_BASE_PORT=$((10000 + 100 * i)) python3 -m pytest tests/gpu_sglang/test_ddtree_server.py \
        -p no:cacheprovider -q -rfE -k "$(echo "$GREEDY_MATRIX" | sed 's/,/ or /g') or test_chain_setting or test_export or test_graph_runs" \
        > "$ROOT/greedy-$s.log" 2>&1 &
      i=$((i + 1))
    done
    # issue 45: the budget schedule's servers (they died at start-up before) and the overlap scheduler's sync check,
    # on the dense pair beside them
    [ "${GREEDY_WIDTHS:-1}" = 1 ] && env $(one small) SGLANG_DDTREE_OUT=/tmp/ddtree-greedy-widths SGLANG_DDTREE_BASE_PORT=14500 \
      SGLANG_DDTREE_START="none,ddtree-sched-graphs,ddtree-sched-eager,ddtree-b32-c8-graphs-overlap,none-bs48,ddtree-b32-c8-graphs-overlap-synccheck-bs48" \
      python3 -m pytest tests/gpu_sglang/test_widths.py tests/gpu_sglang/test_overlap.py -p no:cacheprovider -q -rfE \
      -k "${WIDTHS_K:-test_each_width or test_greedy_equals_none_while or test_overlap_greedy or test_overlap_48 or test_no_host_sync}" \
      > "$ROOT/greedy-widths.log" 2>&1 &
    wait
    report greedy ${GREEDY_SIZES:-kimi-dense kimi-allexp} $([ "${GREEDY_WIDTHS:-1}" = 1 ] && echo widths) ;;
  requests)
    i=0
    names=${REQUEST_START:-$(python3 -c "from tests.gpu_sglang.test_requests import REQUEST_SERVERS as r
from tests.gpu_sglang.test_grammars import GRAMMAR_SERVERS as g; print(','.join((*r, *g)))")}
    for s in ${REQUEST_SIZES:-small kimi-dense}; do
      env $(one "$s") SGLANG_DDTREE_OUT="/tmp/ddtree-requests-$s" SGLANG_DDTREE_START="$names" \
        SGLANG_DDTREE_BASE_PORT=$((11000 + 100 * i)) python3 -m pytest tests/gpu_sglang/test_requests.py \
        tests/gpu_sglang/test_grammars.py -p no:cacheprovider -q -rfE ${REQUEST_K:+-k "$REQUEST_K"} \
        > "$ROOT/requests-$s.log" 2>&1 &
      i=$((i + 1))
    done
    wait
    report requests ${REQUEST_SIZES:-small kimi-dense} ;;
  gates)      # issue 45 item 2: the budget schedule and the overlap scheduler on the MLA pairs where identity is decidable
    i=0
    for s in ${GATES_SIZES:-kimi-dense kimi-allexp}; do
      env $(one "$s") SGLANG_DDTREE_OUT="/tmp/ddtree-gates-$s" SGLANG_DDTREE_BASE_PORT=$((12000 + 100 * i)) \
        SGLANG_DDTREE_START="${GATES_START:-none,ddtree-sched-graphs,ddtree-sched-eager,ddtree-b32-c8-graphs-overlap,none-bs48,ddtree-b32-c8-graphs-overlap-synccheck-bs48}" \
        python3 -m pytest tests/gpu_sglang/test_widths.py tests/gpu_sglang/test_overlap.py -p no:cacheprovider -q -rfE \
        ${GATES_K:+-k "$GATES_K"} > "$ROOT/gates-$s.log" 2>&1 &
      i=$((i + 1))
    done
    wait
    report gates ${GATES_SIZES:-kimi-dense kimi-allexp} ;;
  kimipath)   # issue 44 item 3 on the pairs that decide identity: the radix cache, the KimiK25 wrapper, INT4 experts
    i=0
    for s in ${KIMIPATH_SIZES:-kimi-dense kimi-allexp}; do
      names=none,ddtree-b32-c8-graphs,none-radix,ddtree-b32-c8-graphs-radix,none-wrapper,ddtree-b32-c8-graphs-wrapper
      [ -e "$ROOT/$s/sglang-pair/target-int4" ] && names=$names,none-int4-moetriton,ddtree-b32-c8-graphs-int4-moetriton
      env $(one "$s") SGLANG_DDTREE_OUT="/tmp/ddtree-kimipath-$s" SGLANG_DDTREE_START="$names" \
        SGLANG_DDTREE_BASE_PORT=$((13000 + 100 * i)) python3 -m pytest tests/gpu_sglang/test_kimi_path.py \
        -p no:cacheprovider -q -rfE -k "not marlin and not flashinfer" > "$ROOT/kimipath-$s.log" 2>&1 &
      i=$((i + 1))
    done
    wait
    report kimipath ${KIMIPATH_SIZES:-kimi-dense kimi-allexp} ;;
  moe)        # issue 44 item 3: top 2 of 8 experts, DDTREE's partings from NONE against SGLang's DFLASH's; the fault
    s=${MOE_SIZE:-kimi}
    env $(one "$s") SGLANG_DDTREE_OUT="/tmp/ddtree-moe-$s" \
      SGLANG_DDTREE_START=none,dflash,ddtree-b32-c8-graphs,ddtree-b32-c8-graphs-fault SGLANG_DDTREE_BASE_PORT=15000 \
      python3 -m pytest tests/gpu_sglang/test_moe_partings.py -p no:cacheprovider -q -rfE > "$ROOT/moe-$s.log" 2>&1
    report moe "$s" ;;
  marlin)     # issue 44 item 4: SGLang's Marlin INT4 MoE kernel built once (JIT, nvcc), its cache packed, the INT4 test
    s=${MARLIN_SIZE:-kimi-allexp}
    [ -n "${MARLIN_CACHE:-}" ] && carry_unpack marlin-jit "$MARLIN_CACHE" "$HOME"
    t1=$(date +%s)
    python3 -m bench.kimi_probe --out "$ROOT/marlin-warm" --group marlin-warm --arch dsv3 \
      --timeout "${MARLIN_WAIT:-1200}" > "$ROOT/marlin-warm.log" 2>&1
    echo "[decide] Marlin warm-up server done after $(( $(date +%s) - t1 )) s: $(tail -1 "$ROOT/marlin-warm.log")"
    carry_pack marlin-jit "$HOME" 45 .cache/sglang .cache/tvm-ffi
    env $(one "$s") SGLANG_DDTREE_OUT="/tmp/ddtree-marlin-$s" SGLANG_DDTREE_START=none,none-int4,ddtree-b32-c8-graphs-int4 \
      SGLANG_DDTREE_BASE_PORT=15500 python3 -m pytest tests/gpu_sglang/test_kimi_path.py -p no:cacheprovider -q -rfE \
      -k "int4 and marlin" > "$ROOT/marlin-$s.log" 2>&1
    cp "$ROOT/marlin-warm.log" /tmp/ddtree-marlin-$s/ 2>/dev/null
    report marlin "$s" ;;
  all) "$0" nodes || rc=1; "$0" greedy || rc=1 ;;
  *) echo "part $PART is invalid: expected train, nodes, greedy, requests, gates, kimipath, moe, marlin or all (parts joined by + run in turn)" >&2; exit 2 ;;
esac
tar czf "$OUT/train-logs.tgz" -C "$ROOT" $(cd "$ROOT" && ls */train.log */pair/train.json 2>/dev/null) 2>/dev/null
echo "[decide] part $PART done after $(( $(date +%s) - t0 )) s (rc $rc)"
exit $rc

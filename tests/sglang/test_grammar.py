"""Constrained decoding on DDTREE (issue 33, item 4) with SGLang 0.5.23's own xgrammar backend, on the CPU:
JSON schema, regex, EBNF and a structural tag.

The grammars are SGLang's XGrammarGrammar objects made by its XGrammarGrammarBackend from the test pair's
byte tokenizer (the tokenizer.json the export writes). Checked here:
  * build_legal_tree keeps exactly the budget best legal paths (against a brute-force enumeration), fills
    every node's bitmask with the grammar's mask at that node's own path, and leaves the matcher as found;
  * with nothing to prune it builds ddtree.tree's tree, node for node;
  * constrain_step (the worker's grammar stage) rewrites only the rows of requests with a grammar;
  * decoding: a stand-in target decoded greedily under the grammar (NONE: mask, argmax, accept, as SGLang's
    sampler and scheduler do) and by DDTREE steps (legal trees, per-node masks, the greedy walk, the
    committed tokens accepted into the matcher) give the same answer, and the answer is in the language.
Runs in the SGLang contract venv.
"""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend  # noqa: E402

from ddtree import build_tree  # noqa: E402
from ddtree.grammar_tree import allows, build_legal_tree, legal_rows  # noqa: E402
from ddtree.reference.hf_tokenizer import write_hf_tokenizer  # noqa: E402
from ddtree.reference.tokenizer import ByteTokenizer  # noqa: E402
from ddtree.sglang.step.grammar import constrain_step  # noqa: E402
from ddtree.tree import build_tree_from_candidates, draft_candidates_torch  # noqa: E402
from ddtree.verify import accept_path  # noqa: E402
from tests.helpers import tree_node_path  # noqa: E402

VOCAB, EOS = 260, 257
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
REGEX = r"(yes|no), [0-9]{1,3}( [a-z]{2,5}){2,4}\."
EBNF = 'root ::= "(" expr ")"\nexpr ::= num | num op expr\nop ::= "+" | "*"\nnum ::= [1-9] [0-9]?'
# a structural tag in SGLang's (legacy) request form: free text, then a <f>...</f> tag whose body is a JSON
# object of the schema, at least one (so the answer opens with the tag)
TAG = {"structures": [{"begin": "<f>", "schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                  "required": ["n"], "additionalProperties": False}, "end": "</f>"}],
       "triggers": ["<f"], "at_least_one": True}
GRAMMARS = {"json": ("dispatch_json", json.dumps(SCHEMA)), "regex": ("dispatch_regex", REGEX),
            "ebnf": ("dispatch_ebnf", EBNF), "tag": ("dispatch_structural_tag", json.dumps(TAG))}


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("byte-tokenizer")
    write_hf_tokenizer(ByteTokenizer(), out, 4096)
    return XGrammarGrammarBackend(AutoTokenizer.from_pretrained(out), vocab_size=VOCAB, model_eos_token_ids=[EOS])


def grammar(backend, kind: str, accepted: list[int] = ()):
    method, key = GRAMMARS[kind]
    g = getattr(backend, method)(key)
    for t in accepted:
        g.accept_token(t)
    return g


def mask_of(g) -> np.ndarray:
    m = g.allocate_vocab_mask(VOCAB, 1, "cpu")
    g.fill_vocab_mask(m, 0)
    return m[0].numpy().copy()


def legal_tokens(g) -> list[int]:
    row = mask_of(g)
    return [t for t in range(VOCAB) if allows(row, t)]


def target_logits(prefix: list[int]) -> torch.Tensor:
    """A stand-in target: logits a fixed function of the last two tokens (Python hashes int tuples the same
    in every run), white space disfavoured (JSON's optional white space would fill the answer)."""
    g = torch.Generator().manual_seed(hash(tuple(prefix[-2:])) % (2**31))
    logits = torch.randn(VOCAB, generator=g) * 3
    logits[list(b" \t\r\n")] -= 6.0
    return logits


def format_draft(backend, kind, answer: list[int], root_seq: list[int], depth: int, gen, noise: float):
    """Draft logits [L, V] of a draft that learned the format a little: depth d's row is the target's at the
    draft's own legal greedy path so far, illegal tokens pushed down by 6 (not out), plus noise."""
    g = grammar(backend, kind, answer)
    rows, seq, alive = [], list(root_seq), not g.is_terminated()
    for _ in range(depth):
        row = target_logits(seq) + noise * torch.randn(VOCAB, generator=gen)
        if alive:
            legal = torch.zeros(VOCAB, dtype=torch.bool)
            legal[legal_tokens(g)] = True
            row = torch.where(legal, row, row - 6.0)
            pick = int(torch.where(legal, row, float("-inf")).argmax())
            g.accept_token(pick)
            alive = not g.is_terminated()
        else:
            pick = int(row.argmax())
        rows.append(row)
        seq.append(pick)
    return torch.stack(rows)


def best_legal_paths(backend, kind, answer, logp, tokens, budget):
    """Brute force: every legal path over the candidates with its float32 score, the best `budget`."""
    found = []

    def walk(path, score, g):
        d = len(path)
        if d == logp.shape[0] or g.is_terminated():
            return
        row = mask_of(g)
        for r in range(logp.shape[1]):
            t = int(tokens[d, r])
            if not np.isfinite(float(logp[d, r])) or not allows(row, t):
                continue
            s = np.float32(score) + np.float32(logp[d, r])
            found.append((float(s), tuple(path + [t])))
            g.accept_token(t)
            walk(path + [t], s, g)
            g.rollback(1)

    walk([], np.float32(0.0), grammar(backend, kind, answer))
    found.sort(key=lambda x: -x[0])
    return {p for _, p in found[:budget]}


PREFIXES = {"json": b'{"name": "ab', "regex": b"yes, 4", "ebnf": b"(1", "tag": b'<f>{"n": 1'}


@pytest.mark.parametrize("kind", sorted(GRAMMARS))
def test_legal_tree_is_the_best_legal_paths_with_each_nodes_own_mask(backend, kind):
    answer = list(PREFIXES[kind])
    gen = torch.Generator().manual_seed(3)
    draft = format_draft(backend, kind, answer, [256, *answer], depth=5, gen=gen, noise=1.0)
    cand = draft_candidates_torch(draft[None], 6)
    g = grammar(backend, kind, answer)
    before = (list(g.accepted_tokens), mask_of(g))
    budget = 24
    rows = g.allocate_vocab_mask(VOCAB, budget + 1, "cpu")
    tree = build_legal_tree(cand.logp[0], cand.tokens[0], answer[-1], budget, g, rows)

    paths = {tuple(tree.path(i)) for i in range(1, len(tree.tokens))}
    assert paths == best_legal_paths(backend, kind, answer, cand.logp[0], cand.tokens[0], budget)
    assert tree.pruned > 0                                          # the draft does propose illegal tokens
    assert all(tree.parents[i] < i for i in range(1, len(tree.tokens)))
    assert all(a >= b for a, b in zip(tree.scores[1:], tree.scores[2:]))
    for i in range(len(tree.tokens)):                               # each node's row: its own path's mask
        fresh = grammar(backend, kind, answer + tree.path(i))
        if not fresh.is_terminated():
            assert np.array_equal(rows[i].numpy(), mask_of(fresh)), i
    assert (list(g.accepted_tokens), mask_of(g).tolist()) == (before[0], before[1].tolist())   # left as found


def test_with_nothing_to_prune_it_is_the_device_trees_build(backend):
    regex = backend.dispatch_regex(r"[a-z]{0,40}")                 # every candidate below is a letter
    letters = torch.arange(ord("a"), ord("z") + 1)
    gen = torch.Generator().manual_seed(0)
    logits = torch.full((1, 6, VOCAB), -30.0)
    logits[:, :, letters] = torch.randn((1, 6, len(letters)), generator=gen) * 2
    cand = draft_candidates_torch(logits, 5)
    budget = 40
    rows = regex.allocate_vocab_mask(VOCAB, budget + 1, "cpu")
    host = legal_rows([build_legal_tree(cand.logp[0], cand.tokens[0], ord("q"), budget, regex, rows)], budget + 1)
    device = build_tree_from_candidates(cand, torch.tensor([ord("q")]), budget, backend="torch")
    for field in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(host, field), getattr(device, field)), field
    assert torch.equal(host.scores, device.scores)
    assert torch.equal(host.ancestor_mask, device.ancestor_mask)
    assert regex.accepted_tokens == []


def test_constrain_step_rewrites_only_the_rows_with_a_grammar(backend):
    answer = list(b"no, 12")
    reqs = [NS(grammar=None), NS(grammar=grammar(backend, "regex", answer)), NS(grammar=None)]
    gen = torch.Generator().manual_seed(5)
    draft = torch.randn((3, 4, VOCAB), generator=gen)
    draft[1] = format_draft(backend, "regex", answer, [256, *answer], 4, gen, noise=3.0)
    cand = draft_candidates_torch(draft, 4)
    roots = torch.tensor([7, answer[-1], 9])
    tree = build_tree_from_candidates(cand, roots, 10, backend="torch")
    barrier_calls = []
    step = constrain_step(reqs, cand, tree, 10, VOCAB, barrier=lambda: barrier_calls.append(1))
    assert barrier_calls == [1]
    for field in ("tokens", "parents", "depths", "scores", "num_nodes", "ancestor_mask"):
        assert torch.equal(getattr(step.tree, field)[[0, 2]], getattr(tree, field)[[0, 2]]), field
    mask = step.mask.vocab_mask.view(3, 11, -1)
    assert bool((mask[[0, 2]] == -1).all())                         # unconstrained rows: everything allowed
    assert step.pruned > 0 and step.nodes == int(step.tree.num_nodes[1])
    for j in range(1, int(step.tree.num_nodes[1])):                 # every node of the constrained row is legal
        grammar(backend, "regex", answer + tree_node_path(step.tree, 1, j)[1:])
    logits = torch.zeros((33, VOCAB))
    step.mask.apply(logits)                                         # SGLang's own apply on the CPU
    assert torch.isinf(logits.view(3, 11, -1)[1, 0, ord("a")]) and not torch.isinf(logits[0]).any()
    assert reqs[1].grammar.accepted_tokens == answer


def none_decode(backend, kind, length):
    """NONE under SGLang's grammar flow: mask the step's logits, argmax, accept the token; stop at the end."""
    g, seq = grammar(backend, kind), [256]
    while len(seq) - 1 < length and not g.is_terminated():
        logits = target_logits(seq)
        legal = torch.zeros(VOCAB, dtype=torch.bool)
        legal[legal_tokens(g)] = True
        t = int(torch.where(legal, logits, float("-inf")).argmax())
        g.accept_token(t)
        seq.append(t)
    return seq[1:]


def ddtree_decode(backend, kind, length, budget, cap, depth=5, seed=0):
    """The worker's constrained flow for one request: legal tree and node masks (constrain_step), node logits
    masked, the greedy walk, the committed tokens accepted into the matcher (SGLang's scheduler does this)."""
    gen, seq = torch.Generator().manual_seed(seed), [256]
    req = NS(grammar=grammar(backend, kind))
    t0 = int(torch.where(torch.tensor([allows(mask_of(req.grammar), t) for t in range(VOCAB)]),
                         target_logits(seq), float("-inf")).argmax())            # the prefill's token
    req.grammar.accept_token(t0)
    seq.append(t0)
    steps = 0
    while len(seq) - 1 < length and not req.grammar.is_terminated():
        draft = format_draft(backend, kind, seq[1:], seq, depth, gen, noise=1.5)[None]
        cand = draft_candidates_torch(draft, min(cap, budget))
        tree = build_tree_from_candidates(cand, torch.tensor([seq[-1]]), budget, backend="torch")
        step = constrain_step([req], cand, tree, budget, VOCAB)
        tree = step.tree
        logits = torch.stack([target_logits(seq[:-1] + tree_node_path(tree, 0, j))
                              for j in range(budget + 1)])                      # [N, V]
        step.mask.apply(logits)
        verdict = accept_path(tree, logits.argmax(-1)[None])
        for t in verdict.tokens[0, : int(verdict.accept_len[0]) + 1].tolist():
            if req.grammar.is_terminated():
                break                                                             # the scheduler stops here
            req.grammar.accept_token(t)
            seq.append(t)
        steps += 1
    return seq[1:length + 1], steps


@pytest.mark.parametrize("kind", sorted(GRAMMARS))
@pytest.mark.parametrize("budget,cap", [(8, 4), (24, 8)])
def test_ddtree_under_a_grammar_gives_nones_constrained_answer(backend, kind, budget, cap):
    want = none_decode(backend, kind, 80)
    got, steps = ddtree_decode(backend, kind, 80, budget, cap)
    assert got == want
    assert steps < len(want) * 0.8, (steps, len(want))            # trees were accepted past their roots
    g = grammar(backend, kind, want)
    assert g.is_terminated() or len(want) == 80
    if kind == "json" and want[-1] == EOS:
        doc = json.loads(bytes(want[:-1]).decode())
        assert set(doc) == {"name", "age", "tags"} and 0 <= doc["age"] <= 120
    if kind == "tag":                                              # the answer opens with a whole tag
        text = bytes(t for t in want if t < 256).decode(errors="replace")
        assert text.startswith("<f>") and "</f>" in text, text
        assert isinstance(json.loads(text[3:text.index("</f>")])["n"], int), text


def test_pruning_spends_the_budget_on_legal_paths(backend):
    """Against the unpruned tree of the same candidates: the pruned one has only legal nodes, and at least as
    many of them (it never keeps fewer legal paths than the device build, which spends nodes on illegal ones)."""
    answer = list(b'{"name": "x", "age": 3')
    gen = torch.Generator().manual_seed(11)
    draft = format_draft(backend, "json", answer, [256, *answer], 5, gen, noise=2.0)
    cand = draft_candidates_torch(draft[None], 8)
    plain = build_tree(draft[None], torch.tensor([answer[-1]]), budget=24, topk_cap=8, backend="torch")

    def legal(path):
        g = grammar(backend, "json", answer)
        try:
            for t in path:
                g.accept_token(t)
        except ValueError:
            return False
        return True

    plain_legal = sum(legal(tree_node_path(plain, 0, j)[1:]) for j in range(1, int(plain.num_nodes[0])))
    g = grammar(backend, "json", answer)
    pruned = build_legal_tree(cand.logp[0], cand.tokens[0], answer[-1], 24, g, g.allocate_vocab_mask(VOCAB, 25, "cpu"))
    assert pruned.pruned > 0 and plain_legal < int(plain.num_nodes[0]) - 1
    assert len(pruned.tokens) - 1 >= plain_legal
    assert all(legal(pruned.path(i)) for i in range(1, len(pruned.tokens)))


def test_the_sglang_names_the_worker_reads_exist():
    """tree_worker._ddtree_grammar reads batch.has_grammar / .reqs / .sampling_info.vocab_size and clears
    sampling_info.grammar_mask; grammar.py calls the grammar object's allocate / fill / move / accept / rollback."""
    import dataclasses

    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    assert {"has_grammar", "reqs", "sampling_info"} <= {f.name for f in dataclasses.fields(ScheduleBatch)}
    assert {"grammar_mask", "vocab_size"} <= {f.name for f in dataclasses.fields(SamplingBatchInfo)}
    for method in ("allocate_vocab_mask", "fill_vocab_mask", "move_vocab_mask", "apply_vocab_mask", "accept_token",
                   "rollback", "is_terminated"):
        assert callable(getattr(BaseGrammarObject, method)), method

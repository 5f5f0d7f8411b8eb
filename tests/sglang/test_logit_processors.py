"""Custom logit processors at every DDTREE node (issue 33, item 5) with SGLang 0.5.23's own processors, on the CPU.

NONE: a stand-in target decoded greedily, SGLang's apply_custom_logit_processor on each step's logits with the
request's params and its Req (SGLang's own Req class, token ids in array('q'); its scheduler puts it in "__req__").
DDTREE: trees from a draft that knows the target a little, ddtree.sglang.step.logit_processors on every node's row
(each node's Req view extended by its own path), the greedy walk. With SGLang's DeepSeek-OCR n-gram blocker
(it reads the answer so far) and its disallowed-tokens processor (it reads only its parameters) in one batch,
the answers must be NONE's; applied as SGLang's DFLASH verify applies them (the step's Req at every position),
they are not.
"""

from __future__ import annotations

from array import array

import pytest
import torch

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.layers.sampler import apply_custom_logit_processor  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.sampling.custom_logit_processor import (  # noqa: E402
    DeepseekOCRNoRepeatNGramLogitProcessor, DisallowedTokensLogitsProcessor)
from sglang.srt.sampling.sampling_batch_info import ProcessorEntry  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from ddtree import build_tree  # noqa: E402
from ddtree.sglang.step.logit_processors import NodeRequest, apply_node_processors, node_paths  # noqa: E402
from ddtree.verify import accept_path  # noqa: E402
from tests.helpers import informed_draft, tree_node_path  # noqa: E402

VOCAB = 24
NGRAM = {"ngram_size": 2, "window_size": 40}
BANNED = {"token_ids": [3, 11]}


def target_logits(prefix: list[int]) -> torch.Tensor:
    """A target that loops: a short cycle of tokens strongly preferred, so the n-gram blocker has work."""
    g = torch.Generator().manual_seed(hash(tuple(prefix[-2:])) % (2**31))
    logits = torch.randn(VOCAB, generator=g)
    logits[(prefix[-1] * 7 + 3) % 6] += 4.0
    return logits


class Info:
    """The fields of SGLang's SamplingBatchInfo that its processor path reads."""

    def __init__(self, kinds: list[str | None], reqs):
        self.custom_params, rows = [], {}
        for i, (kind, req) in enumerate(zip(kinds, reqs)):
            params = {"ngram": {**NGRAM, "__req__": req}, "banned": dict(BANNED)}.get(kind)
            self.custom_params.append(params)
            if kind:
                rows.setdefault(kind, []).append(i)
        processors = {"ngram": DeepseekOCRNoRepeatNGramLogitProcessor(), "banned": DisallowedTokensLogitsProcessor()}
        self.custom_logit_processor = {k: ProcessorEntry(processors[k], r, torch.tensor(r)) for k, r in rows.items()}
        self.device, self.has_custom_logit_processor = "cpu", bool(rows)

    def __len__(self):
        return len(self.custom_params)


KINDS = ["ngram", "banned", None, "ngram"]
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2]]


def none_decode(length: int) -> list[list[int]]:
    reqs = [sglang_req(p) for p in PROMPTS]
    info = Info(KINDS, reqs)
    for _ in range(length):
        logits = torch.stack([target_logits(r.origin_input_ids + r.output_ids) for r in reqs])
        apply_custom_logit_processor(logits, info)
        for r, t in zip(reqs, logits.argmax(-1).tolist()):
            r.output_ids.append(t)
    return [list(r.output_ids) for r in reqs]


def ddtree_decode(length: int, per_node: bool = True, budget=12, cap=3, depth=4, seed=0) -> list[list[int]]:
    """The worker's flow: the prefill's token (NONE's step), then trees whose node rows get the processors
    (per_node: each node's own path; else SGLang's DFLASH way, the step's Req at every node)."""
    gen = torch.Generator().manual_seed(seed)
    reqs = [sglang_req(p) for p in PROMPTS]
    info = Info(KINDS, reqs)
    first = torch.stack([target_logits(r.origin_input_ids) for r in reqs])
    apply_custom_logit_processor(first, info)
    for r, t in zip(reqs, first.argmax(-1).tolist()):
        r.output_ids.append(t)
    while min(len(r.output_ids) for r in reqs) < length:
        seqs = [list(r.origin_input_ids + r.output_ids) for r in reqs]
        draft = torch.stack([informed_draft(target_logits, sq, depth, gen, noise=1.5) for sq in seqs])
        tree = build_tree(draft, torch.tensor([sq[-1] for sq in seqs]), budget=budget, topk_cap=cap, backend="torch")
        n = tree.tokens.shape[1]
        rows = torch.stack([torch.stack([target_logits(seqs[b][:-1] + tree_node_path(tree, b, j)) for j in range(n)])
                            for b in range(len(reqs))])                     # [bs, N, V]
        flat = rows.view(-1, VOCAB)
        if per_node:
            apply_node_processors(flat, info, tree)
        else:
            apply_custom_logit_processor(flat, info, num_tokens_in_batch=n)
        verdict = accept_path(tree, rows.argmax(-1))
        for b, r in enumerate(reqs):
            r.output_ids.extend(verdict.tokens[b, : int(verdict.accept_len[b]) + 1].tolist())
    return [list(r.output_ids[:length]) for r in reqs]


def test_processors_per_node_give_nones_tokens():
    want = none_decode(40)
    assert ddtree_decode(40) == want
    banned_row = want[KINDS.index("banned")]
    assert not set(banned_row) & set(BANNED["token_ids"])


def test_the_step_start_req_at_every_node_is_not_enough():
    """SGLang's DFLASH verify passes the step's Req at every position: the n-gram blocker then misses the
    n-grams the path itself makes, and the answers part from NONE's."""
    want = none_decode(40)
    got = ddtree_decode(40, per_node=False)
    assert got[KINDS.index("ngram")] != want[KINDS.index("ngram")] or got[3] != want[3]


def sglang_req(prompt: list[int], rid: str = "r") -> Req:
    """SGLang 0.5.23's own Req, built as its scheduler builds one (token ids as array('q'))."""
    return Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=64))


def test_a_node_view_is_the_req_with_its_path():
    req = sglang_req([1, 2], "r1")
    req.output_ids.extend([5, 6])
    view = NodeRequest(req, [7, 8])
    assert list(view.output_ids) == [5, 6, 7, 8] and list(view.origin_input_ids) == [1, 2] and view.rid == "r1"
    assert list(req.output_ids) == [5, 6]
    # processors add the two (SGLang's n-gram blocker: req.origin_input_ids + req.output_ids); a list view of an
    # array Req crashed SGLang's scheduler on the H200 (2026-12-03)
    assert list(view.origin_input_ids + view.output_ids) == [1, 2, 5, 6, 7, 8]
    with pytest.raises(AttributeError, match="read-only"):
        view.output_ids = []
    assert node_paths([9, 4, 5, 6, 9], [-1, 0, 0, 1, -1]) == [[], [4], [5], [4, 6], []]

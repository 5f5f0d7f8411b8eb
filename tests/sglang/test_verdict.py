"""The verdict stage (ddtree.sglang.step.verdict) on the CPU, with SGLang 0.5.23's own sampling info and penalizers.

decide() takes the verify pass's logits at every node, processes them as NONE would, picks each node's token, has
rank 0's tokens broadcast (SGLang's SpecTpSync, a recording stand-in here: one rank) and walks the tree. Checked:
the walk is over the processed argmax; a deferred TP gather is finished (not skipped to the raw argmax) when a
request has a penalty - the forward copy's own field says there is none, the kept orchestrator says there is;
the tokens a step accepts are fed to the scheduler's penalizers.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite  # noqa: E402

from ddtree import build_tree  # noqa: E402
from ddtree.sglang.step.verdict import VerdictSetup, decide  # noqa: E402
from ddtree.verify import accept_path  # noqa: E402
from tests.sglang.test_penalties import VOCAB, forward_copy, orchestrator, unhooked_copy  # noqa: E402


class RecordingSync:
    """SGLang's SpecTpSync on one rank: records what it was asked to broadcast."""

    def __init__(self):
        self.calls = []

    def sync(self, site, tensor):
        self.calls.append((site, tensor.clone()))


class DeferredGather:
    """A target LogitsProcessor whose TP gather is deferred: the argmax path and the full gather, recorded."""

    def __init__(self):
        self.used = []

    def is_deferred_shard(self, logits):
        return True

    def deferred_argmax(self, logits):
        self.used.append("argmax")
        return logits.argmax(-1)

    def finish_deferred_gather(self, logits):
        self.used.append("gather")
        return logits


def a_step(bs=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    draft = torch.randn(bs, 3, VOCAB, generator=g)
    tree = build_tree(draft, torch.tensor([1, 2][:bs]), budget=6, topk_cap=2, backend="torch")
    n = tree.tokens.shape[1]
    logits = torch.randn(bs * n, VOCAB, generator=g) * 3
    return tree, logits


def setup_with(processor=None, sync=None, can_skip=True):
    return VerdictSetup(logits_processor=processor, can_skip_logits=lambda batch, info: can_skip,
                        tp_sync=sync or RecordingSync())


def test_a_greedy_verdict_walks_the_argmax_and_broadcasts_rank_0s_tokens():
    tree, logits = a_step()
    sync = RecordingSync()
    info = forward_copy(orchestrator([{}, {}]), 2)
    verdict = decide(setup_with(sync=sync), NS(sampling_info=info), tree, NS(next_token_logits=logits.clone()),
                     torch.tensor([5, 7]))
    want = accept_path(tree, logits.view(2, -1, VOCAB).argmax(-1))
    assert torch.equal(verdict.tokens, want.tokens) and torch.equal(verdict.accept_len, want.accept_len)
    assert [site for site, _ in sync.calls] == [SpecTpSyncSite.DFLASH_ACCEPT_GREEDY]


def test_a_penalised_batch_finishes_the_deferred_gather_and_feeds_the_penalizers():
    tree, logits = a_step(seed=1)
    orch = orchestrator([{"frequency": 2.0}, {}])
    gather = DeferredGather()
    verdict = decide(setup_with(processor=gather), NS(sampling_info=forward_copy(orch, 2)), tree,
                     NS(next_token_logits=logits.clone()), torch.tensor([5, 7]))
    assert gather.used == ["gather"]                    # not the raw argmax: the nodes needed their penalties
    freq = next(p for p in orch.penalizers.values() if type(p).__name__ == "BatchedFrequencyPenalizer")
    fed = int(verdict.accept_len[0]) + 1                # the root, then the accepted draft tokens
    assert float(freq.cumulated_frequency_penalties[0].sum()) == pytest.approx(2.0 * fed)


def test_without_the_kept_orchestrator_the_same_batch_would_skip_to_the_raw_argmax():
    """The failure the hook prevents: SGLang's forward copy alone says no request has a penalty."""
    tree, logits = a_step(seed=1)
    gather = DeferredGather()
    decide(setup_with(processor=gather), NS(sampling_info=unhooked_copy(orchestrator([{"frequency": 2.0}, {}]), 2)),
           tree, NS(next_token_logits=logits.clone()), torch.tensor([5, 7]))
    assert gather.used == ["argmax"]

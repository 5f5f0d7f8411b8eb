"""The verdict stage (ddtree.sglang.step.verdict) on the CPU, with SGLang 0.5.23's own sampling info and penalizers.

decide() takes the verify pass's logits at every node, processes them as NONE would, picks each node's token, has
rank 0's tokens broadcast (SGLang's SpecTpSync, a recording stand-in here: one rank) and walks the tree. Checked:
the walk is over the processed argmax; a deferred TP gather is finished (not skipped to the raw argmax) when a
request has a penalty - the forward copy's own field says there is none, the kept orchestrator says there is;
the tokens a step accepts are fed to the scheduler's penalizers; the target's verify output is read, never
written (the gathered logits come back in Decided, the logprobs as fields); the penalty hook the test bed's
stale-penalties fault worker sets changes what the nodes are penalised by.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite  # noqa: E402

from ddtree import build_tree  # noqa: E402
from ddtree.sglang.diagnostics.step_dump import hide_paths_from_penalties  # noqa: E402
from ddtree.sglang.step.glue import commit_step  # noqa: E402
from ddtree.sglang.step.verdict import LOGPROB_FIELDS, VerdictSetup, committed_logprobs, decide  # noqa: E402
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
        return logits.clone()                           # the gathered logits: a tensor of their own


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
                     torch.tensor([5, 7])).verdict
    want = accept_path(tree, logits.view(2, -1, VOCAB).argmax(-1))
    assert torch.equal(verdict.tokens, want.tokens) and torch.equal(verdict.accept_len, want.accept_len)
    assert [site for site, _ in sync.calls] == [SpecTpSyncSite.DFLASH_ACCEPT_GREEDY]


def test_a_penalised_batch_finishes_the_deferred_gather_and_feeds_the_penalizers():
    tree, logits = a_step(seed=1)
    orch = orchestrator([{"frequency": 2.0}, {}])
    gather = DeferredGather()
    verdict = decide(setup_with(processor=gather), NS(sampling_info=forward_copy(orch, 2)), tree,
                     NS(next_token_logits=logits.clone()), torch.tensor([5, 7])).verdict
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


def test_the_verdict_hands_back_the_gathered_logits_and_leaves_the_targets_output_as_it_was():
    tree, logits = a_step(seed=1)
    raw = logits.clone()
    output = NS(next_token_logits=raw)
    decided = decide(setup_with(processor=DeferredGather()),
                     NS(sampling_info=forward_copy(orchestrator([{"frequency": 2.0}, {}]), 2)), tree, output,
                     torch.tensor([5, 7]))
    assert output.next_token_logits is raw and torch.equal(raw, logits)     # not replaced, not penalised in place
    assert decided.logits is not None and decided.logits.shape == logits.shape
    assert not torch.equal(decided.logits, logits)                         # the processed (penalised) rows


def test_an_argmax_only_verdict_hands_on_no_logits():
    tree, logits = a_step()
    output = NS(next_token_logits=logits)
    decided = decide(setup_with(processor=DeferredGather()),
                     NS(sampling_info=forward_copy(orchestrator([{}, {}]), 2)), tree, output, torch.tensor([5, 7]))
    assert decided.logits is None and output.next_token_logits is logits


def test_the_stale_penalties_hook_penalises_every_node_by_the_step_starts_counts():
    """The test bed's fault worker sets VerdictSetup.penalty_paths; the same step processed with it differs from
    the step's own paths (a node below the root no longer counts the tokens of its own path)."""
    tree, logits = a_step(seed=1)

    def processed(**hook):
        setup = VerdictSetup(logits_processor=DeferredGather(), can_skip_logits=lambda batch, info: True,
                             tp_sync=RecordingSync(), **hook)
        info = forward_copy(orchestrator([{"frequency": 2.0}, {}]), 2)
        return decide(setup, NS(sampling_info=info), tree, NS(next_token_logits=logits.clone()),
                      torch.tensor([5, 7])).logits

    own, stale = processed(), processed(penalty_paths=hide_paths_from_penalties)
    n = tree.tokens.shape[1]
    assert torch.equal(own[:1], stale[:1])                                 # the root: the same counts
    assert not torch.equal(own[:n], stale[:n])                             # request 0's deeper nodes differ
    assert torch.equal(own[n:], stale[n:])                                 # request 1 has no penalty


def test_committed_logprobs_come_back_as_fields_and_leave_the_logits_alone():
    tree, logits = a_step()
    bs, n = tree.tokens.shape
    verdict = accept_path(tree, logits.view(bs, n, -1).argmax(-1))
    window = torch.arange(bs * n, dtype=torch.int64).view(bs, n)
    done = commit_step(verdict, window, window.clone(), torch.tensor([5, 7]),
                       torch.zeros((bs, 64), dtype=torch.int32), torch.arange(bs), backend="torch")
    batch = NS(seq_lens=torch.tensor([5, 7]), sampling_info=NS(is_all_greedy=True), top_logprobs_nums=[2, 0],
               token_ids_logprobs=None)
    before = logits.clone()
    fields = committed_logprobs(batch, logits, done)
    assert torch.equal(logits, before)
    assert set(fields) == {"next_token_logprobs", "next_token_top_logprobs_val", "next_token_top_logprobs_idx"}
    assert set(fields) <= set(LOGPROB_FIELDS)
    steps = done.out_tokens.shape[1]
    want = torch.log_softmax(logits, -1)[done.hidden_rows.reshape(-1), done.out_tokens.reshape(-1)].view(bs, steps)
    assert torch.allclose(fields["next_token_logprobs"], want)

"""Seeded sampling on DDTREE (issue 33, item 3), on the CPU with SGLang 0.5.23's own sampling functions.

A stand-in target whose logits are a fixed function of the prefix; NONE draws each token as SGLang's
sampler does under deterministic inference (one row per request, the input's position, the request's
seed). DDTREE builds trees from random draft logits, draws every node's target with
ddtree.sglang.step.seeded and walks the tree: the emitted tokens must be NONE's, for every seed, with
top-k / top-p on or off, whatever else is in the batch. Runs in the SGLang contract venv.

SGLang hashes (seed, position, token) with murmur3 in a Triton kernel on the GPU and an sgl-kernel op on
the CPU; sgl-kernel does not load on a machine without libcuda, so here the hash is a torch stand-in of
the same signature (a different function of the same three inputs). What this checks is everything
around it: the seed and position each node is drawn with, the filter, the walk. The GPU test bed runs
the real hash (tests/gpu_sglang).
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.layers.sampler import (  # noqa: E402
    sampling_from_probs_torch,
    top_k_top_p_min_p_sampling_from_probs_torch,
)

from ddtree import build_tree  # noqa: E402
from ddtree.sglang.step.seeded import seeded_node_targets  # noqa: E402
from ddtree.verify import accept_path  # noqa: E402
from tests.helpers import informed_draft, tree_node_path  # noqa: E402

VOCAB = 24


def stand_in_hash(seed: torch.Tensor, positions: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """uint32 [n, m], a fixed function of (seed[i], positions[i], cols[j]) (SGLang's murmur_hash32's contract)."""
    x = (seed.to(torch.int64)[:, None] * 0x9E3779B1 + positions.to(torch.int64)[:, None] * 0x85EBCA77
         + cols.to(torch.int64)[None, :] * 0xC2B2AE3D) & 0xFFFFFFFF
    for shift, mult in ((16, 0x7FEB352D), (15, 0x846CA68B), (16, 1)):
        x = ((x ^ (x >> shift)) * mult) & 0xFFFFFFFF
    return x.to(torch.uint32)


@pytest.fixture(autouse=True)
def cpu_hash(monkeypatch):
    import sglang.srt.layers.sampler as sampler

    monkeypatch.setattr(sampler, "murmur_hash32", stand_in_hash)


def target_logits(prefix: list[int]) -> torch.Tensor:
    """The stand-in target: float32 [V] logits fixed by the prefix (a peaked, prefix-seeded distribution)."""
    g = torch.Generator().manual_seed(hash(tuple(prefix)) % (2**31))
    return torch.randn(VOCAB, generator=g) * 2.5


def info_for(temperature: list[float], top_k: list[int], top_p: list[float], seeds: list[int]):
    """The SamplingBatchInfo fields the seeded path reads (SGLang's shapes: temperatures [bs, 1])."""
    return NS(temperatures=torch.tensor(temperature)[:, None], top_ks=torch.tensor(top_k, dtype=torch.int32),
              top_ps=torch.tensor(top_p), min_ps=torch.zeros(len(seeds)), sampling_seed=torch.tensor(seeds),
              need_top_k_sampling=any(k < VOCAB for k in top_k), need_top_p_sampling=any(p < 1.0 for p in top_p),
              need_min_p_sampling=False)


def none_token(prefix: list[int], position: int, info, row: int) -> int:
    """NONE's next token for one request, as SGLang's sampler draws it with a seed (one row, its own params)."""
    logits = target_logits(prefix)[None] / info.temperatures[row:row + 1]
    probs = torch.softmax(logits, dim=-1)
    seed, where = info.sampling_seed[row:row + 1], torch.tensor([position])
    if not (info.need_top_k_sampling or info.need_top_p_sampling):
        return int(sampling_from_probs_torch(probs, sampling_seed=seed, positions=where)[0])
    return int(top_k_top_p_min_p_sampling_from_probs_torch(probs, info.top_ks[row:row + 1], info.top_ps[row:row + 1],
                                                            info.min_ps[row:row + 1], False, seed, where)[0])


def ddtree_steps(prompts: list[list[int]], info, steps: int, budget: int, cap: int, depth: int, seed: int):
    """DDTREE decoding of every prompt for `steps` steps: random draft logits, the tree, each node's target
    drawn with seeded_node_targets at the node's position, the walk. Returns the emitted tokens per prompt."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [list(p) for p in prompts]
    for _ in range(steps):
        bs = len(seqs)
        roots = torch.tensor([s[-1] for s in seqs])
        prefix_lens = torch.tensor([len(s) - 1 for s in seqs])                 # the root's position
        draft = torch.stack([informed_draft(target_logits, s, depth, gen, noise=1.0) for s in seqs])  # [bs, L, V]
        tree = build_tree(draft, roots, budget=budget, topk_cap=cap, backend="torch")
        rows = torch.stack([torch.stack([target_logits(seqs[b][:-1] + tree_node_path(tree, b, j)) for j in range(tree.tokens.shape[1])])
                            for b in range(bs)])                               # [bs, N, V]
        targets = seeded_node_targets(rows, info, tree.positions(prefix_lens))
        verdict = accept_path(tree, targets)
        for b in range(bs):
            n = int(verdict.accept_len[b]) + 1
            seqs[b] += [int(t) for t in verdict.tokens[b, :n]]
    return [s[len(p):] for s, p in zip(seqs, prompts)]


def none_decode(prompts: list[list[int]], info, length: int) -> list[list[int]]:
    out = []
    for row, p in enumerate(prompts):
        seq = list(p)
        while len(seq) < len(p) + length:
            seq.append(none_token(seq, len(seq) - 1, info, row))
        out.append(seq[len(p):])
    return out


@pytest.mark.parametrize("top_k,top_p", [(VOCAB, 1.0), (8, 0.9)])
def test_ddtree_draws_nones_seeded_answer(top_k, top_p):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    info = info_for([0.8, 1.0, 0.6], [top_k] * 3, [top_p] * 3, seeds=[11, 12, 13])
    got = ddtree_steps(prompts, info, steps=6, budget=13, cap=4, depth=4, seed=0)
    want = none_decode(prompts, info, max(len(g) for g in got))
    for g, w in zip(got, want):
        assert g == w[:len(g)]
    assert sum(len(g) for g in got) >= 2 * 3 * 6      # deep nodes were accepted: their draws count


def test_a_seeded_answer_does_not_depend_on_the_batch_or_the_tree():
    """The same request (prompt, seed) alone, beside others, with another budget and other draft logits."""
    prompt = [3, 1, 4, 1, 5]
    alone = ddtree_steps([prompt], info_for([0.9], [VOCAB], [1.0], [99]), steps=5, budget=8, cap=2, depth=3, seed=1)
    crowd = ddtree_steps([[2, 7], prompt, [1, 8, 2]], info_for([0.7, 0.9, 1.0], [VOCAB] * 3, [1.0] * 3, [5, 99, 6]),
                         steps=5, budget=20, cap=6, depth=5, seed=2)
    n = min(len(alone[0]), len(crowd[1]))
    assert n >= 5 and alone[0][:n] == crowd[1][:n]


def test_another_seed_gives_another_answer():
    prompt = [[3, 1, 4]]
    a = ddtree_steps(prompt, info_for([1.0], [VOCAB], [1.0], [1]), steps=6, budget=8, cap=2, depth=3, seed=0)[0]
    b = ddtree_steps(prompt, info_for([1.0], [VOCAB], [1.0], [2]), steps=6, budget=8, cap=2, depth=3, seed=0)[0]
    n = min(len(a), len(b))
    assert a[:n] != b[:n]

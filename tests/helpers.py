"""Assertions shared by the CPU and GPU tests."""

from __future__ import annotations

import torch

TREE_FIELDS = ("tokens", "parents", "depths", "num_nodes", "ancestor_mask")
VERDICT_FIELDS = ("accepted", "accept_len", "bonus", "tokens")


def assert_same_tree(a, b, atol: float = 1e-5) -> None:
    """Two DraftTrees are identical (scores within atol: fp32 sums in another order)."""
    for field in TREE_FIELDS:
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert torch.allclose(a.scores, b.scores, atol=atol)


def assert_same_verdict(a, b) -> None:
    for field in VERDICT_FIELDS:
        assert torch.equal(getattr(a, field), getattr(b, field)), field


def chi_square_pvalue(samples, want: dict) -> float:
    """Pearson chi-square of sampled sequences (iterable of tuples) against exact probabilities.

    `want` is renormalised (float32-derived probabilities need not sum to 1 exactly); the rarest
    cells are pooled until each pooled cell expects at least 5. Fails on an impossible sequence.
    """
    from collections import Counter

    from scipy import stats

    samples = list(samples)
    counts = Counter(samples)
    assert set(counts) <= {s for s, p in want.items() if p > 0}, "emitted an impossible sequence"
    total = sum(want.values())
    obs, exp, acc_o, acc_e = [], [], 0.0, 0.0
    for s in sorted(want, key=want.get):
        acc_o += counts.get(s, 0)
        acc_e += want[s] / total * len(samples)
        if acc_e >= 5:
            obs.append(acc_o)
            exp.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        obs[-1] += acc_o
        exp[-1] += acc_e
    return float(stats.chisquare(obs, exp).pvalue)


def import_bench(name: str):
    """Import bench/<name>.py as a module (bench/ on sys.path, so spawned processes find it too)."""
    import importlib
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[1] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module(name)

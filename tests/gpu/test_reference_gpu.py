"""The reference engine on the GPU (Triton build/verify path): dflash and ddtree equal ar, greedy."""

from __future__ import annotations

import pytest
import torch

from ddtree.reference import generate

from ..reference.conftest import small_vocab_pair

pytestmark = pytest.mark.gpu
PROMPTS = [[0, 2, 3], [0], [0, 5, 6, 2, 3, 4, 1, 2], [0, 3, 3, 3, 3], [0, 6]]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_speculative_methods_equal_autoregressive_on_cuda(dtype):
    pair = small_vocab_pair()
    pair.target.to(device="cuda", dtype=dtype)
    pair.draft.to(device="cuda", dtype=dtype)
    want = [g.tokens for g in generate(pair, PROMPTS, max_new_tokens=48, method="ar")]
    for method, budget, cap in (("dflash", 3, 1), ("ddtree", 4, 2), ("ddtree", 32, 8)):
        got = generate(pair, PROMPTS, max_new_tokens=48, method=method, budget=budget, topk_cap=cap)
        assert [g.tokens for g in got] == want, (method, budget, cap)
        assert sum(sum(g.accept_lengths) for g in got) > 0

"""The ids the start-up timing replays the verify graphs with (ddtree.sglang.policy.graph_timing, issue 70): only
tokens whose embedding row is not zero, as global ids of a rank's shard, every id of a shard with none; random ids
come from that pool alone (the enlarged pair's case: tests/reference/test_enlarge.py)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

from ddtree.sglang.policy.graph_timing import embedded_ids, random_ids


def shard(rows: int, live: list[int], hidden: int = 4) -> torch.Tensor:
    w = torch.zeros(rows, hidden)
    w[live] = torch.randn(len(live), hidden) + 3.0
    return w


def test_only_rows_that_embed_are_drawn_as_global_ids_and_padding_is_left_out():
    w = shard(10, [0, 2, 7, 9])                  # rows 8-9: the shard's padding (count 8)
    assert embedded_ids(w, 0, 8).tolist() == [0, 2, 7]
    assert embedded_ids(w, 1000, 8).tolist() == [1000, 1002, 1007]        # rank r's shard starts at its offset
    assert embedded_ids(shard(6, []), 500, 6).tolist() == list(range(500, 506))
    with pytest.raises(ValueError, match="count=0"):
        embedded_ids(w, 0, 0)


def test_random_ids_fill_the_graphs_input_from_the_pool_alone():
    buffers = NS(input_ids=torch.full((40,), -1, dtype=torch.int64))
    pool = torch.tensor([3, 11, 250], dtype=torch.int64)
    random_ids(NS(buffers=buffers), 33, pool, torch.Generator().manual_seed(0))
    got = buffers.input_ids
    assert set(got[:33].tolist()) <= {3, 11, 250} and len(set(got[:33].tolist())) == 3
    assert got[33:].tolist() == [-1] * 7                                  # rows past the graph's tokens untouched

"""TP candidate merge over NCCL on 2 GPUs: every rank equals the unsharded tree; graphs replay exactly."""

from __future__ import annotations

import pytest
import torch


pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


def test_two_ranks_merge_to_the_unsharded_tree_and_replay_in_graphs():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (a multi-GPU lent machine)")
    from bench import tp_merge
    rows = tp_merge.run(2, quick=True)
    assert rows and all(r.world == 2 for r in rows)
    assert {r.shard for r in rows} == {"triton", "torch"}
    for r in rows:
        assert r.equal_unsharded, r
        assert r.graph_exact, r

"""The NCCL smoke test on the lent GPU(s): NCCL initialises, all-reduces and the sum is checked."""

from __future__ import annotations

import pytest
import torch

from ddtree.tools.nccl_smoke import run_smoke

pytestmark = pytest.mark.gpu


def test_nccl_all_reduce_over_every_visible_gpu(tmp_path):
    world = torch.cuda.device_count()
    result = run_smoke(world, backend="nccl", timeout=120, log_dir=str(tmp_path))
    assert result.ok, result.reason + "\n" + result.nccl_log_tail
    assert all(r.value == world * (world + 1) / 2 for r in result.ranks)
    assert list(tmp_path.glob("nccl.*.log")), "NCCL wrote no debug log"

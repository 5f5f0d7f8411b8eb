"""bench/cost_model.py: the terms behave as the model says (docs/cost-model.md), and the table and
the schedule follow from them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cost_model", ROOT / "bench/cost_model.py")
cm = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("cost_model", cm)
_spec.loader.exec_module(cm)

SHAPE, HW = cm.KimiShape(), cm.Hardware()


def test_one_token_reads_its_eight_experts_and_a_wide_step_reads_them_all():
    assert cm.expected_experts(1, SHAPE) == pytest.approx(8)
    assert 185 < cm.expected_experts(33, SHAPE) < 200
    assert cm.expected_experts(48 * 33, SHAPE) == pytest.approx(384, abs=0.01)
    # all 384 experts of 60 layers in INT4, split 8 ways, plus the bf16 parts: the checkpoint's size
    full = cm.weight_bytes(10**6, SHAPE, HW) * HW.gpus / 1e9
    assert 550 < full < 640, full


def test_the_all_reduce_is_latency_bound_for_one_token_and_linear_for_many():
    one, many, twice = (cm.allreduce_ms(t, SHAPE, HW) for t in (1, 1584, 3168))
    assert one == pytest.approx(2 * 61 * HW.allreduce_latency_us / 1e3, rel=0.05)      # 122 latencies
    assert twice - many == pytest.approx(many - one, rel=0.05)


def test_a_wider_tree_costs_more_per_step_and_the_best_budget_is_read_from_the_costs():
    pred = cm.predict([1, 8, 48], [8, 16, 32, 64], 4096, cm.TEST_BED_TOKENS_PER_STEP)
    for batch in (1, 8, 48):
        steps = [pred.costs[(batch, b)].step_ms for b in (0, 8, 16, 32, 64)]
        assert steps == sorted(steps), steps
        best = pred.best_budget(batch)
        assert pred.costs[(batch, best)].tokens_per_s == max(c.tokens_per_s for (b, _), c in pred.costs.items() if b == batch)
    assert pred.schedule().split(",")[0] in ("8", "1:8")
    # a faster bus and longer contexts favour DDTREE (docs/cost-model.md's sensitivity)
    slow = cm.predict([8], [8], 1024, cm.TEST_BED_TOKENS_PER_STEP, hw=cm.Hardware(bus_gbps=10))
    fast = cm.predict([8], [8], 16384, cm.TEST_BED_TOKENS_PER_STEP, hw=cm.Hardware(bus_gbps=40))
    assert slow.none_wins() == [8] and fast.none_wins() == []


def test_the_command_prints_the_table_and_the_schedule(capsys):
    assert cm.main(["--batches", "1,48"]) == 0
    out = capsys.readouterr().out
    assert "| batch | NONE | b8 | b16 | b32 | b64 | best |" in out and "schedule (DDTREE's best budget" in out

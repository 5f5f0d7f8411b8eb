"""bench/cost_model.py: the terms behave as the model says (docs/cost-model.md), and the table, the winners and the
schedule follow from them. (The model against the measured rig: tests/bench/test_kimi_rank.py.)"""

from __future__ import annotations

import pytest


from bench import cost_model as cm
SHAPE, HW = cm.KimiShape(), cm.Hardware()


def test_one_token_reads_its_eight_experts_and_a_wide_step_reads_them_all():
    assert cm.expected_experts(1, SHAPE) == pytest.approx(8)
    assert 185 < cm.expected_experts(33, SHAPE) < 200
    assert cm.expected_experts(48 * 33, SHAPE) == pytest.approx(384, abs=0.01)
    # one rank's share of the checkpoint: every routed expert of 60 layers in INT4 plus the bf16 parts (q_a and kv_a
    # replicated on each rank) - Kimi K2.6's ~590 GB over 8 ranks, and more
    bf16, routed = cm.weight_bytes(10**6, SHAPE, HW)
    assert 70 < (bf16 + routed) / 1e9 < 80, (bf16, routed)
    assert routed / 1e9 * 8 == pytest.approx(384 * 3 * 7168 * 2048 * 60 * 0.5625 / 1e9, rel=1e-6)


def test_the_all_reduce_is_latency_bound_for_one_token_linear_for_many_and_absent_on_one_rank():
    one, many, twice = (cm.allreduce_ms(t, SHAPE, HW) for t in (1, 1584, 3168))
    assert one == pytest.approx(2 * 61 * HW.allreduce_latency_us / 1e3, rel=0.05)      # 122 latencies
    assert twice - many == pytest.approx(many - one, rel=0.05)
    assert cm.allreduce_ms(1584, SHAPE, cm.Hardware(allreduce=False)) == 0


def test_a_verify_pass_costs_its_own_overhead_over_a_decode_forward_of_its_tokens():
    decode, verify = (cm.forward_cost(264, 8, 4096, SHAPE, HW, verify=v) for v in (False, True))
    assert verify.ms - decode.ms == pytest.approx(HW.verify_fixed_ms + 264 * HW.verify_us_per_token / 1e3)
    slow = cm.forward_cost(264, 8, 4096, SHAPE, cm.Hardware(expert_efficiency=HW.expert_efficiency / 2))
    assert slow.memory_ms > decode.memory_ms and slow.compute_ms == decode.compute_ms


def test_a_wider_tree_costs_more_per_step_and_the_winner_is_read_from_the_costs():
    pred = cm.predict([1, 8, 48], cm.ACCEPTS["kimi-pair"], 4096)
    assert [s.name for s in pred.settings] == ["NONE", "DFLASH", "b8", "b32", "b64"]
    for batch in (1, 8, 48):
        steps = [pred.costs[(batch, n)].step_ms for n in ("NONE", "DFLASH", "b8", "b32", "b64")]
        assert steps == sorted(steps), steps
        best = pred.best(batch)
        assert pred.costs[(batch, best)].tokens_per_s == max(c.tokens_per_s for (b, _), c in pred.costs.items()
                                                              if b == batch)
    assert pred.schedule() == "8"
    # b32 costs about twice a DFLASH step at one request: a tree accepting over twice the chain's would win there
    generous = cm.predict([1], {"chain": 4.59, 8: 4.64, 32: 10.0}, 4096)
    assert generous.best(1) == "b32" and generous.wins("DFLASH") == []


def test_the_command_prints_the_table_the_schedule_and_the_winners(capsys):
    assert cm.main(["--batches", "1,48"]) == 0
    out = capsys.readouterr().out
    assert "| batch | NONE | DFLASH | b8 | b32 | b64 | best |" in out and "DDTREE's best budget by running batch" in out
    assert cm.main(["--batches", "1", "--accepts", "test-bed"]) == 0
    assert "| batch | NONE | b8 | b16 | b32 | b64 | best |" in capsys.readouterr().out

"""Issue 69's timing rig (bench/kimi_rank.py) and the cost model checked against it (bench/cost_model.py --check), on
the CPU: the rank's shapes, the rig's parsing of SGLang's one-batch results and the worker's step profile, and the
check's calibration and verdict. The measurements themselves run on the GPU test bed (bench/kimi_rank.sh)."""

from __future__ import annotations

import json

import pytest

from ddtree.sglang.diagnostics.profile import StepProfile

from bench import kimi_rank as rank
from bench import cost_model as cm


def test_the_rank_slice_has_one_tp8_ranks_widths_int4_experts_and_the_drafts_layout(tmp_path):
    pair = rank.write_rig(tmp_path, 40)
    t = json.loads((pair / "target/config.json").read_text())
    assert (t["hidden_size"], t["num_attention_heads"], t["q_lora_rank"], t["kv_lora_rank"]) == (7168, 8, 1536, 512)
    assert (t["n_routed_experts"], t["num_experts_per_tok"], t["moe_intermediate_size"]) == (384, 8, 256)
    assert (t["intermediate_size"], t["vocab_size"], t["first_k_dense_replace"]) == (2304, 20480, 1)
    weights = t["quantization_config"]["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"]) == (4, 32)
    assert (pair / "target/tokenizer.json").exists()
    d = json.loads((pair / "draft/config.json").read_text())
    assert d["hidden_size"] == 7168 and d["num_attention_heads"] // d["num_key_value_heads"] == 8
    for layers in (2, 8, 40, 61):
        ids = rank.draft_layer_ids(layers)
        assert ids == sorted(ids) and max(ids) < layers - 1, (layers, ids)
    assert rank.draft_layer_ids(61) == [1, 12, 24, 35, 47, 58]       # Kimi's own at 61 layers
    with pytest.raises(ValueError, match="--layers 1 is too few"):
        rank.rank_target_config(1)


def test_a_routing_other_than_sglangs_two_simulations_is_refused_by_name():
    assert rank.routing_env("round-robin") == {"SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS": "1"}
    with pytest.raises(ValueError, match="--routing 'real' is invalid: expected one of uniform, round-robin"):
        rank.routing_env("real")
    assert rank.main(["verify", "--out", "/nonexistent", "--routing", "real"]) == 2
    with pytest.raises(SystemExit, match="--loads '8,x' is invalid"):
        rank.main(["verify", "--out", "/nonexistent", "--loads", "8,x"])


def test_the_decode_command_captures_a_graph_at_every_t_it_measures(tmp_path):
    cmd = rank.decode_command(tmp_path, (1, 9, 513), tmp_path / "r.jsonl")
    graphs = cmd[cmd.index("--cuda-graph-bs-decode") + 1: cmd.index("--cuda-graph-max-bs-decode")]
    batches = cmd[cmd.index("--batch-size") + 1: cmd.index("--input-len")]
    assert graphs == batches == ["1", "9", "513"]                     # 9 runs at 9, not padded to the next size
    assert cmd[cmd.index("--max-running-requests") + 1] == "513" and "dummy" in cmd


class StandIn:
    """A served rig: answers every request and logs the step profile lines a DDTREE server would."""

    def __init__(self, log: str, name: str = "rig-b32-uniform"):
        self.config = type("C", (), {"name": name})()
        self.log, self.text, self.loads = "sglang.log", log, []

    def complete_all(self, prompts, sampling, concurrency):
        self.loads.append(concurrency)
        return [{"output_ids": [1] * sampling["max_new_tokens"]} for _ in prompts]

    def log_text(self):
        return self.text


def profile(bs: int, verify: float) -> str:
    stages = {"draft": (0.3, 1.0), "verify": (0.2, verify), "step": (0.9, verify + 2.0)}
    return StepProfile(batch_size=bs, steps=16, stages=stages).line()


def test_verify_rows_take_the_last_profile_line_of_each_load_and_name_a_missing_one():
    log = "\n".join([profile(1, 9.0), profile(1, 7.5), profile(8, 12.0), "noise"])
    server = StandIn(log)
    rows = rank.verify_rows(server, 32, "uniform", (1, 8))
    assert server.loads == [1, 8]
    assert [(r.batch, r.tokens, r.verify_ms, r.step_ms) for r in rows] == [(1, 33, 7.5, 9.5), (8, 264, 12.0, 14.0)]
    with pytest.raises(RuntimeError, match="rig-b32-uniform: no step profile line at batch 16"):
        rank.verify_rows(StandIn(log), 32, "uniform", (1, 16))


def write_rig_files(out, curve: dict[int, float], verify: list[dict], copy_gbps: float = 2900.0) -> None:
    (out / "decode-uniform.jsonl").write_text("".join(
        json.dumps({"batch_size": t, "median_decode_latency": ms / 1000}) + "\n" for t, ms in curve.items()))
    (out / "verify-uniform.json").write_text(json.dumps({"rows": verify, "errors": []}))
    (out / "experts.json").write_text(json.dumps({"uniform": {"1": [8, 8], "33": [180, 190]}, "copy_gbps": copy_gbps}))


def synthetic_curve(hw, shape, tokens, context=rank.INPUT_LEN) -> dict[int, float]:
    return {t: round(cm.forward_cost(t, t, context, shape, hw).ms, 4) for t in tokens}


def synthetic_verify(hw, shape, widths=(9, 33, 65), loads=(1, 8, 48)) -> list[dict]:
    return [{"budget": w - 1, "width": w, "batch": b, "tokens": w * b, "routing": "uniform", "steps": 16, "draft_ms": 1,
             "step_ms": 2, "verify_ms": round(cm.forward_cost(w * b, b, rank.INPUT_LEN, shape, hw, verify=True).ms, 4)}
            for w in widths for b in loads]


RIG_HW = cm.Hardware(name="rig", memory_gbps=2900.0, expert_efficiency=0.77, tflops=216.0, layer_floor_us=94.0,
                     verify_fixed_ms=0.8, verify_us_per_token=7.0, allreduce=False)


def test_the_report_gathers_every_file_and_the_model_recovers_a_curve_made_by_its_own_formulas(tmp_path):
    shape = cm.rig_shape(40)
    curve = synthetic_curve(RIG_HW, shape, rank.DECODE_TOKENS)
    write_rig_files(tmp_path, curve, synthetic_verify(RIG_HW, shape))
    assert rank.main(["report", "--out", str(tmp_path), "--gpu", "H100 80GB HBM3"]) == 0
    data = json.loads((tmp_path / "rig.json").read_text())
    assert data["decode_ms"]["uniform"]["513"] == pytest.approx(curve[513], abs=1e-3)
    assert data["experts"]["uniform"] == {"1": 8.0, "33": 185.0} and data["copy_gbps"] == 2900.0
    rig = cm.load_rig(tmp_path / "rig.json")
    cal = cm.calibrate(rig, shape)
    hw = cal.hw
    # the constants come back from the decode curve and the two extreme widths
    assert hw.expert_efficiency == pytest.approx(0.77) and hw.tflops == pytest.approx(216.0, rel=1e-3)
    assert hw.layer_floor_us == pytest.approx(94.0, abs=0.2)
    assert (hw.verify_fixed_ms, hw.verify_us_per_token) == pytest.approx((0.8, 7.0), abs=0.02)
    rows = cm.check(rig, cal, shape)
    assert len(rows) == len(curve) + 9 and max(abs(c.error) for c in rows) < 0.005
    assert [c.point.width for c in rows if not c.fitted and c.point.kind == "verify"] == [33, 33, 33]


def test_a_curve_the_formulas_cannot_follow_fails_the_check_and_bad_files_are_refused(tmp_path, capsys):
    shape = cm.rig_shape(40)
    curve = synthetic_curve(RIG_HW, shape, rank.DECODE_TOKENS)
    curve[33] *= 1.35                                                 # a step 35% slower than the formulas allow
    write_rig_files(tmp_path, curve, [])
    rank.main(["report", "--out", str(tmp_path)])
    assert cm.main(["--check", str(tmp_path / "rig.json")]) == 1
    out = capsys.readouterr().out
    assert "| decode | uniform | 33 | 33 x 1 |" in out and "**over 20%**" in out
    assert "9/10 within 20%" in out
    (tmp_path / "empty.json").write_text(json.dumps({"layers": 40, "decode_ms": {}}))
    assert cm.main(["--check", str(tmp_path / "empty.json")]) == 2
    assert "holds no copy bandwidth or no decode curve" in capsys.readouterr().err


def test_round_robin_reads_more_experts_than_uniform_and_a_measured_count_overrides_both():
    shape = cm.KimiShape()
    for t in (2, 9, 33):
        assert cm.distinct_experts(t, shape, "round-robin") > cm.distinct_experts(t, shape, "uniform")
    assert cm.distinct_experts(48, shape, "round-robin") == 384
    assert cm.distinct_experts(33, shape, "uniform", {33: 120.0}) == 120.0
    with pytest.raises(ValueError, match="routing 'real' is invalid"):
        cm.distinct_experts(4, shape, "real")

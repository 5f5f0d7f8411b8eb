"""The probes' shared loop (testbed.servers.probe_servers) and the Kimi probe's configurations,
on the CPU with stand-in servers: no GPU, no SGLang."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
from bench import kimi_probe
from testbed import servers as harness


class StandIn:
    def __init__(self, ready: bool):
        self.ready, self.ready_after, self.stopped = ready, 1.25, False

    def wait_ready(self, timeout: float) -> bool:
        return self.ready

    def exit_message(self) -> str:
        return "RuntimeError: the server died at start"

    def stop(self) -> None:
        self.stopped = True


def test_a_server_that_did_not_start_or_failed_a_request_is_an_error_in_its_row_and_all_are_stopped():
    servers = {"up": StandIn(True), "down": StandIn(False), "broken": StandIn(True)}

    def ask(name, server, row):
        if name == "broken":
            raise ValueError("no output_ids")
        row["answered"] = True

    rows = {r["server"]: r for r in harness.probe_servers(servers, 10, ask)}
    assert rows["up"] == {"server": "up", "healthy_after_s": 1.2, "errors": [], "answered": True}
    assert rows["down"]["healthy_after_s"] is None and rows["down"]["errors"] == ["RuntimeError: the server died at start"]
    assert rows["broken"]["errors"] == ["ValueError: no output_ids"]
    assert all(s.stopped for s in servers.values())


def test_the_kimi_pairs_keep_kimis_widths_and_the_drafts_layout(tmp_path):
    for kind in ("wrapper", "int4", "dsv3"):
        kimi_probe.write_pair(tmp_path / kind, kind)
    wrapper = json.loads((tmp_path / "wrapper/target/config.json").read_text())
    text = wrapper["text_config"]
    assert wrapper["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert (text["kv_lora_rank"], text["qk_rope_head_dim"], text["vocab_size"]) == (512, 64, 163840)
    assert "quantization_config" not in text
    int4 = json.loads((tmp_path / "int4/target/config.json").read_text())["text_config"]["quantization_config"]
    assert int4["format"] == "pack-quantized" and int4["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert json.loads((tmp_path / "dsv3/target/config.json").read_text())["architectures"] == ["DeepseekV3ForCausalLM"]
    draft = json.loads((tmp_path / "wrapper/draft/config.json").read_text())
    ids = draft["dflash_config"]["target_layer_ids"]
    assert len(ids) == 6 and max(ids) < text["num_hidden_layers"] - 1 and draft["dflash_config"]["mask_token_id"] == 163838
    assert draft["num_attention_heads"] // draft["num_key_value_heads"] == 64 // 8
    # the wrapper's servers are language-model-only; the fallback's are not
    assert all("--language-model-only" in p.config.extra for p in kimi_probe.probes("wrapper"))
    assert not any("--language-model-only" in p.config.extra for p in kimi_probe.probes("all", arch="dsv3"))


def test_first_divergence_is_one_answer_for_the_probes_and_the_gpu_tests():
    assert harness.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert harness.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert harness.first_divergence([1, 2], [1, 2, 3]) == 2 and harness.first_divergence([1, 2, 3], [1, 2]) == 2
    assert harness.first_divergence([], [4]) == 0


def test_no_bench_script_imports_a_test_module():
    """Benchmarks are operators' tools: they share the GPU harness (testbed/servers.py), never a test."""
    importers = [p.name for p in (ROOT / "bench").glob("*.py")
                 if any(line.startswith(("from tests", "import tests")) for line in p.read_text().splitlines())]
    assert importers == []

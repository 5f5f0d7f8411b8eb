"""The GPU benchmarks' CPU paths, so they do not rot between GPU runs: train_pair for seconds,
then e2e.py in eager mode on what it wrote, with the offline acceptance check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run(*args, timeout=600):
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_train_pair_then_e2e_on_the_cpu(tmp_path):
    # the small size: the default (h200, 25M parameters) spent 3 minutes of make test's CPU lane here
    out = run("-m", "training.train_pair", "--out", str(tmp_path), "--size", "small", "--minutes", "0.05", "--batch", "4",
              "--seq", "64", "--prompts", "3", "--device", "cpu")
    assert "held-out" in out
    report = json.loads((tmp_path / "train.json").read_text())
    assert report["heldout_files"] and set(report["drafts"]) == {"b8", "b16"}
    assert len(report["drafts"]["b16"]["heldout_top1_by_depth"]) == 15
    prompts = json.loads((tmp_path / "heldout_prompts.json").read_text())
    assert len(prompts) == 3 and all(p[0] == 256 and len(p) == 257 for p in prompts)
    e2e = ("-m", "bench.e2e", "--device", "cpu", "--modes", "eager", "--in-process", "--pair", str(tmp_path / "b8"),
           "--prompts", str(tmp_path / "heldout_prompts.json"), "--num-prompts", "2", "--warmup", "1", "--steps", "2",
           "--budgets", "4,8", "--caps", "2,budget", "--batches", "1", "--offline-check",
           "--json", str(tmp_path / "e2e.json"))
    run(*e2e, "--temperatures", "0")
    first = json.loads((tmp_path / "e2e.json").read_text())["rows"]
    # a cut-short sweep resumes: the rows already measured are kept as they were, only the rest run
    out = run(*e2e, "--temperatures", "0,0.7", "--resume")
    assert f"resuming: {len(first)} cases" in out
    rows = json.loads((tmp_path / "e2e.json").read_text())["rows"]
    assert rows[:len(first)] == first and {r["temperature"] for r in rows[len(first):]} == {0.7}
    # rendering merges saved rows into the tables and the plot without measuring
    out = run("-m", "bench.e2e", "--render", str(tmp_path / "e2e.json"), "--out", str(tmp_path / "e2e.md"),
              "--png", str(tmp_path / "e2e.png"))
    assert "| ddtree | 8 | 8 | 1 | 0.7 | eager |" in (tmp_path / "e2e.md").read_text()
    assert {(r["method"], r["budget"], r["cap"]) for r in rows} >= {("ar", 1, 1), ("dflash", 7, 1), ("ddtree", 4, 2),
                                                                     ("ddtree", 8, 8)}
    checked = [r for r in rows if r["offline_tokens_per_step"] is not None]
    assert checked and all(r["temperature"] == 0 for r in checked)
    for r in checked:   # the engine's own count and the offline count agree (float32 on the CPU)
        assert r["offline_tokens_per_step"] == pytest.approx(r["tokens_per_step"], rel=1e-9)
    assert (tmp_path / "e2e.png").stat().st_size > 10_000


def test_a_draft_distilled_on_a_loaded_targets_greedy_tokens(tmp_path):
    """--target-from keeps the given target (its weights unchanged) and trains drafts only; --distill draws that
    share of the draft's batches from the target's greedy continuations and reports the draft's top-1 on the
    target's greedy continuations of held-out text; bad values name the flag."""
    base = ("-m", "training.train_pair", "--size", "small", "--batch", "4", "--seq", "64", "--prompts", "2",
            "--device", "cpu", "--block-sizes", "8")
    run(*base, "--out", str(tmp_path / "first"), "--minutes", "0.03")
    out = run(*base, "--out", str(tmp_path / "second"), "--minutes", "0.05", "--target-from", str(tmp_path / "first/b8"),
              "--distill", "0.5", "--distill-windows", "8")
    assert "distill: 8 greedy continuations of 32 tokens" in out and "target:" not in out    # no target training
    report = json.loads((tmp_path / "second/train.json").read_text())
    assert report["distill"] == 0.5 and report["distill_windows"] == 8 and "target_losses" not in report
    assert len(report["drafts"]["b8"]["heldout_greedy_top1_by_depth"]) == 7
    assert report["drafts"]["b8"]["warm_start"] == str(tmp_path / "first/b8/draft")    # trained on, not anew
    assert report["drafts"]["b8"]["steps"] > 0 and f"draft b8: {report['drafts']['b8']['steps']} steps in" in out
    assert "trained on from" in out
    weights = [(tmp_path / d / "b8/target/model.safetensors").read_bytes() for d in ("first", "second")]
    assert weights[0] == weights[1]
    for flag, value, said in (("--distill", "1.5", "--distill 1.5 is invalid: expected a share 0..1"),
                              ("--target-from", str(tmp_path), f"--target-from {tmp_path} is invalid: it has no "
                                                               "target/config.json")):
        r = subprocess.run([sys.executable, *base, "--out", str(tmp_path / "bad"), "--minutes", "0.03", flag, value],
                           capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
        assert r.returncode != 0 and said in r.stderr, r.stderr[-500:]
    # the GPU's limits, checked before any device is touched: 8 minutes for a pair, 15 for a draft trained on
    for extra, minutes, said in (((), "9", "--minutes 9.0 is invalid: expected 0 < minutes <= 8 on cuda"),
                                 (("--target-from", str(tmp_path / "first/b8")), "16",
                                  "--minutes 16.0 is invalid: expected 0 < minutes <= 15 on cuda for a draft trained "
                                  "on (--target-from)")):
        r = subprocess.run([sys.executable, *base[:-4], "--device", "cuda", "--block-sizes", "8", "--out",
                            str(tmp_path / "bad"), "--minutes", minutes, *extra], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
        assert r.returncode != 0 and said in r.stderr, r.stderr[-500:]
    assert not (tmp_path / "bad").exists()
    r = subprocess.run([sys.executable, *base[:3], "h200", *base[4:], "--out", str(tmp_path / "bad"), "--minutes", "0.03",
                        "--target-from", str(tmp_path / "first/b8")], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "is invalid with --size h200" in r.stderr, r.stderr[-500:]


def test_sglang_e2e_summarizes_tables_and_plots_without_a_server(tmp_path):
    """bench/sglang_e2e.py's arithmetic and outputs on hand-made answers (the servers run on the GPU)."""

    from bench import sglang_e2e as e2e
    from testbed import servers
    none = [{"output_ids": [1, 2, 3, 4], "meta_info": {}}, {"output_ids": [5, 6, 7, 8], "meta_info": {}}]
    tree = [{"output_ids": [1, 2, 3, 4], "meta_info": {"spec_accept_length": 3.0, "spec_verify_ct": 1}},
            {"output_ids": [5, 6, 7, 9], "meta_info": {"spec_accept_length": 1.5, "spec_verify_ct": 2}}]
    rows = [e2e.summarize(servers.NONE, 1, 0.0, none, 2.0, [1.0, 1.0], None),
            e2e.summarize(servers.DFLASH, 1, 0.0, [{**a, "meta_info": {"spec_accept_length": 2.0, "spec_verify_ct": 2}}
                                                   for a in none], 1.0, [0.5, 0.5], [a["output_ids"] for a in none]),
            e2e.summarize(servers.ddtree(32, 8), 1, 0.0, tree, 0.5, [0.2, 0.3], [a["output_ids"] for a in none])]
    assert rows[0].tokens_per_s == 4.0 and rows[0].step_ms == 250.0        # 1 s / (3 decode steps + 1)
    ddtree = rows[2]
    assert ddtree.tokens_per_s == 16.0 and ddtree.accept_length == 2.25
    assert ddtree.tokens_per_step == 2.0                                    # (8 - 2 first tokens) / 3 verify steps
    assert ddtree.step_ms == round(1000 * (0.2 / 2 + 0.3 / 3) / 2, 3) and ddtree.equal_to_none == "1/2"
    timed = e2e.summarize(servers.ddtree(32, 8), 1, 0.0, tree, 0.5, [0.2, 0.3], None, forward_s=0.006)
    assert timed.forward_ms == 2.0                                          # 6 ms of forward passes / 3 verify steps
    assert timed.device_tokens_per_s == 1000.0                              # 6 decoded tokens / 6 ms
    assert rows[2].device_tokens_per_s is None                              # the device timer was off
    assert e2e.summarize(servers.NONE, 1, 0.0, none, 2.0, [1.0, 1.0], None, forward_s=0.003).forward_ms == 0.5
    assert rows[2].first_token_ms is None and rows[2].decode_step_ms is None   # no latencies in the meta_info
    latencies = [{"first_token_latency": 0.1, "e2e_latency": 0.3}, {"first_token_latency": 0.3, "e2e_latency": 0.6},
                 {"e2e_latency": 9.0}]                                          # one without: left out of both
    timed_tree = [{**a, "meta_info": {**a["meta_info"], **t}} for a, t in zip(tree + tree[:1], latencies)]
    split = e2e.summarize(servers.ddtree(32, 8), 1, 0.0, timed_tree, 0.5, [0.2, 0.3, 9.0], None)
    assert split.first_token_ms == 200.0                                        # (100 + 300) / 2
    assert split.decode_step_ms == round(1000 * (0.2 / 1 + 0.3 / 2) / 2, 3)    # per verify step, per request
    timed_none = [{**a, "meta_info": t} for a, t in zip(none, latencies)]
    assert e2e.summarize(servers.NONE, 1, 0.0, timed_none, 2.0, [1.0, 1.0], None).decode_step_ms == \
        round(1000 * (0.2 / 3 + 0.3 / 3) / 2, 3)                               # NONE: output tokens - 1 steps
    text = e2e.table(rows)
    assert text.splitlines()[-1].startswith("| ddtree-b32-c8-graphs | 8 | 1 | 0 | 16.0 | 2.25 | 2.0 |")
    assert e2e.table([split]).splitlines()[-1].endswith("|  | 200.0 | 175.0 |")    # equal: none; the split last
    e2e.plot(rows, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
    assert [c.name for c in e2e.configurations(quick=True, k16=False)] == ["none", "dflash", "ddtree-b32-c8-graphs",
                                                                            "ddtree-b64-c8-graphs"]
    full = [c.name for c in e2e.configurations(quick=False, k16=False)]
    assert len(full) == 2 + 14 and "ddtree-b8-c8-graphs" in full and "ddtree-b128-c128-graphs" in full
    with_k16 = e2e.configurations(quick=False, k16=True)
    assert len(with_k16) == 16 + 7 and {e2e.block_of(c) for c in with_k16[16:]} == {16}
    with pytest.raises(ValueError, match="configuration 'eagle' is invalid"):
        servers.config("eagle")


def test_server_configurations_by_name_draft_tp_and_profiler(tmp_path):

    from testbed import servers
    c = servers.config("ddtree-b64-c8-graphs-k16-tp2-profile")
    assert (c.algorithm, c.budget, c.cap, c.draft, c.tp) == ("DDTREE", 64, 8, "draft16", 2)
    assert dict(c.env) == {"SGLANG_DDTREE_PROFILE_STEPS": str(servers.PROFILE_STEPS)}
    args = c.args(tmp_path, 31000)
    assert args[args.index("--speculative-draft-model-path") + 1] == str(tmp_path / "draft16")
    assert args[args.index("--tp-size") + 1] == "2" and "--sleep-on-idle" in args
    assert "--tp-size" not in servers.config("none").args(tmp_path, 31000)
    with pytest.raises(ValueError, match="only DDTREE servers have the step profiler"):
        servers.config("dflash-profile")


def test_server_configurations_for_kimis_paths(tmp_path):
    """The Kimi-shaped pair's variants (issue 31): the wrapper's target with remote code, the INT4 target under
    SGLang's Triton MoE runner, FlashInfer attention, the radix cache with the Python tree core and the strict
    idle check - each an argument the server really gets."""

    from testbed import servers

    def arg(args, flag):
        return args[args.index(flag) + 1]

    wrapper = servers.config("ddtree-b32-c8-graphs-wrapper-radix").args(tmp_path, 31000)
    assert arg(wrapper, "--model-path") == str(tmp_path / "target-wrapper") and "--trust-remote-code" in wrapper
    assert "--disable-radix-cache" not in wrapper
    radix = servers.config("none-radix")
    assert dict(radix.env)["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"
    assert dict(radix.env)["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "1"
    assert "--disable-radix-cache" in servers.config("none").args(tmp_path, 31000)
    int4 = servers.config("none-int4-moetriton").args(tmp_path, 31000)
    assert arg(int4, "--model-path") == str(tmp_path / "target-int4") and arg(int4, "--moe-runner-backend") == "triton"
    assert "--moe-runner-backend" not in servers.config("none-int4").args(tmp_path, 31000)
    flashinfer = servers.config("ddtree-b32-c8-graphs-flashinfer").args(tmp_path, 31000)
    assert arg(flashinfer, "--attention-backend") == "flashinfer"
    assert arg(servers.config("none").args(tmp_path, 31000), "--attention-backend") == "triton"
    profiled = servers.config("ddtree-b32-c8-graphs-radix-profile")
    assert {"SGLANG_DDTREE_PROFILE_STEPS", "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"} <= set(dict(profiled.env))


def test_profile_table_from_a_servers_log(monkeypatch):
    from ddtree.sglang.diagnostics.profile import StepProfile

    from bench import sglang_e2e as e2e
    from testbed import servers
    line = StepProfile(1, 40, {"between": (0.9, 0.9), "draft": (0.5, 0.6), "step": (3.0, 3.0)}).line()

    class FakeServer:
        config = servers.config("ddtree-b32-c8-graphs-profile")

        def log_text(self):
            return f"[2026] INFO x\n[2026] {line}\n"

    monkeypatch.setattr(e2e, "measure", lambda *a, **k: None)   # no server: the log above is what it "printed"
    rows = e2e.profile_rows(FakeServer(), [[1]], [1, 8], 4)
    assert [(r.config, r.batch) for r in rows] == [("ddtree-b32-c8-graphs", 1)]     # no line for batch 8
    text = e2e.profile_table(rows)
    assert "| ddtree-b32-c8-graphs | 1 | 0.900 / 0.900 | 0.500 / 0.600 | 3.000 / 3.000 |" in text


def test_forward_seconds_read_from_sglangs_metrics_leave_out_prefill(monkeypatch):

    from testbed import servers
    server = servers.Server(servers.NONE, 13000, Path("/dev/null"))      # no server: its metrics are given below
    text = ("# HELP sglang:forward_execution_seconds_total Total time that GPU is busy\n"
            'sglang:forward_execution_seconds_total{category="target_verify",model_name="m"} 1.5\n'
            'sglang:forward_execution_seconds_total{category="extend",model_name="m"} 9.0\n'
            'sglang:forward_execution_seconds_total{category="decode",model_name="m"} 2.5e-01\n'
            'sglang:spec_accept_length{model_name="m"} 4.0\n')
    monkeypatch.setattr(server, "metrics", lambda: text)
    assert server.forward_seconds() == 1.75
    monkeypatch.setattr(server, "metrics", lambda: 'sglang:spec_accept_length{model_name="m"} 4.0\n')
    assert server.forward_seconds() is None                               # the timer was off
    assert servers.SERVER_ENV["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"

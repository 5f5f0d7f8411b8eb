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
    out = run("bench/train_pair.py", "--out", str(tmp_path), "--minutes", "0.05", "--batch", "4", "--seq", "64",
              "--prompts", "3", "--device", "cpu")
    assert "held-out" in out
    report = json.loads((tmp_path / "train.json").read_text())
    assert report["heldout_files"] and set(report["drafts"]) == {"b8", "b16"}
    assert len(report["drafts"]["b16"]["heldout_top1_by_depth"]) == 15
    prompts = json.loads((tmp_path / "heldout_prompts.json").read_text())
    assert len(prompts) == 3 and all(p[0] == 256 and len(p) == 257 for p in prompts)
    e2e = ("bench/e2e.py", "--device", "cpu", "--modes", "eager", "--in-process", "--pair", str(tmp_path / "b8"),
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
    out = run("bench/e2e.py", "--render", str(tmp_path / "e2e.json"), "--out", str(tmp_path / "e2e.md"),
              "--png", str(tmp_path / "e2e.png"))
    assert "| ddtree | 8 | 8 | 1 | 0.7 | eager |" in (tmp_path / "e2e.md").read_text()
    assert {(r["method"], r["budget"], r["cap"]) for r in rows} >= {("ar", 1, 1), ("dflash", 7, 1), ("ddtree", 4, 2),
                                                                     ("ddtree", 8, 8)}
    checked = [r for r in rows if r["offline_tokens_per_step"] is not None]
    assert checked and all(r["temperature"] == 0 for r in checked)
    for r in checked:   # the engine's own count and the offline count agree (float32 on the CPU)
        assert r["offline_tokens_per_step"] == pytest.approx(r["tokens_per_step"], rel=1e-9)
    assert (tmp_path / "e2e.png").stat().st_size > 10_000

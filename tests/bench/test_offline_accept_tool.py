"""training/offline_accept.py: a draft's offline accept lengths counted here for a pair whose train.json has none (a
snapshot put over its pair) are the ones train_pair.py counts at the end of a training, and best_draft.py then
ranks the folder; a folder that is no trained pair, or a snapshot without its target, is refused by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import speed_sweep_train

ROOT = Path(__file__).resolve().parents[2]


def tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training.offline_accept", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})


def test_counted_here_equals_the_trainings_own_count_and_best_draft_ranks_it(tmp_path):
    speed_sweep_train(tmp_path / "speed")
    report_file = tmp_path / "speed/pair/train.json"
    report = json.loads(report_file.read_text())
    counted = report["drafts"]["b8"].pop("offline_accept")           # the helper's training: 2 prompts x 6 tokens
    report_file.write_text(json.dumps(report))
    r = tool(tmp_path / "speed", "--prompts", 2, "--tokens", 6)
    assert r.returncode == 0, r.stderr
    assert json.loads(report_file.read_text())["drafts"]["b8"]["offline_accept"] == counted
    assert "b8: chain b7 c1" in r.stdout
    r = subprocess.run([sys.executable, "-m", "training.best_draft", str(tmp_path / "speed")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == str(tmp_path / "speed"), r.stdout + r.stderr

    # wider trees before a sweep: the chain and b32 as counted before, b128 beside them
    r = tool(tmp_path / "speed", "--prompts", 2, "--tokens", 6, "--budgets", "32,128")
    assert r.returncode == 0, r.stderr
    wide = {a["tree"]: a for a in json.loads(report_file.read_text())["drafts"]["b8"]["offline_accept"]}
    assert list(wide) == ["chain b7 c1", "b32 c8", "b128 c8"]
    assert wide["chain b7 c1"] == counted[0] and wide["b32 c8"] == counted[1]
    assert 1.0 <= wide["b128 c8"]["accept_length"] <= 6


def test_no_pair_or_a_snapshot_alone_is_refused(tmp_path):
    r = tool(tmp_path)
    assert r.returncode == 1 and f"{tmp_path} is not a trained speed pair" in r.stderr and "train.json" in r.stderr
    speed_sweep_train(tmp_path / "speed")
    shutil.rmtree(tmp_path / "speed/pair/b8/target")
    r = tool(tmp_path / "speed", "--prompts", 2, "--tokens", 6)
    assert r.returncode == 1 and "a snapshot alone has no target" in r.stderr
    r = tool(tmp_path / "speed", "--prompts", 0)
    assert r.returncode == 2 and "--prompts 0 / --tokens 192 is invalid" in r.stderr
    for bad in ("64,wide", "1", "2048"):
        r = tool(tmp_path / "speed", "--budgets", bad)
        assert r.returncode == 2 and f"--budgets {bad} is invalid" in r.stderr, r.stderr

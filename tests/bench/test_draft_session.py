"""training/draft_session.sh on the CPU with the small size: a fresh pair packed for carrying, then three drafts trained
on copies of its target side by side (A and B block 8 on from the pair's draft, B with its own depth decay and batch,
C a new block-16 draft), one file of greedy continuations, snapshots of each, best_draft's pick on the last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def draft_session(tmp: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "training/draft_session.sh"], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "ROOT": str(tmp / "speed"),
             "OUT": str(tmp / "out"), "TRAIN_DEVICE": "cpu", "TRAIN_SIZE": "small", "PAIR_MINUTES": "0.03",
             "DRAFT_MINUTES": "0.03", "SNAPSHOT_EVERY": "0.001", "DISTILL_WINDOWS": "8", "WIDE_BATCH": "8",
             "TRAIN_ARGS": "--batch 4 --seq 64 --distill-windows 8 --accept-prompts 2 --accept-tokens 6", **env})


@pytest.mark.extended      # ~3 min in make test's CPU lane; its stages have siblings there (put_draft, speed_sweep train)
def test_a_fresh_pair_then_three_drafts_on_its_target(tmp_path):
    (tmp_path / "out").mkdir()
    r = draft_session(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "out").glob("pair.tgz.part*"))[0] == "pair.tgz.partaa"
    fresh = json.loads((tmp_path / "speed-P/pair/train.json").read_text())
    assert fresh["distill"] == 1.0 and fresh["target_from"] is None
    target = (tmp_path / "speed-P/pair/b8/target/model.safetensors").read_bytes()
    for name, block, decay, batch in (("A", 8, 0.0, 4), ("B", 8, 4.0, 8), ("C", 16, 7.0, 8)):
        pair = tmp_path / f"speed-{name}/pair"
        report = json.loads((pair / "train.json").read_text())
        assert report["target_from"] and report["distill"] == 1.0, name
        assert (report["depth_decay"], report["batch"]) == (decay, batch), name
        assert report["distill_windows"] == 8, name
        draft = report["drafts"][f"b{block}"]
        assert draft["steps"] > 0 and "offline_accept" in draft, name
        assert (draft["warm_start"] is not None) == (block == 8), name       # A, B on from the pair's draft; C new
        assert (pair / f"b{block}/target/model.safetensors").read_bytes() == target, name   # the one target
        assert (tmp_path / f"speed-{name}/snapshot/current/pair/b{block}/draft/model.safetensors").is_file(), name
    assert (tmp_path / "speed-distill.safetensors").is_file()
    last = r.stdout.strip().splitlines()[-1]
    assert any(last.endswith(f"speed-{x}") for x in "ABC"), last


def test_a_failed_fresh_pair_stops_before_the_drafts(tmp_path):
    r = draft_session(tmp_path, PAIR_MINUTES="0")
    assert r.returncode != 0
    assert "stage 1 failed (rc 2)" in r.stdout
    assert "--minutes 0.0 is invalid" in (tmp_path / "speed-P/train.log").read_text()
    assert not os.path.exists(tmp_path / "speed-A")

"""bench/speed_sweep.sh train on the CPU with the small size: a pair is trained once; DISTILL trains the draft of a
pair already there again on its own target (a carried pair's), and is not repeated once done unless REDRAFT=1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def train(tmp: Path, **env: str) -> str:
    r = subprocess.run(["bash", "bench/speed_sweep.sh", "train"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                            "SPEED_DIR": str(tmp / "speed"), "TRAIN_DEVICE": "cpu", "TRAIN_SIZE": "small",
                            "TRAIN_MINUTES": "0.03", "TRAIN_ARGS": "--batch 4 --seq 64 --distill-windows 8", **env})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout


def test_a_carried_pair_gets_a_distilled_draft_on_its_own_target_once(tmp_path):
    pair = tmp_path / "speed/pair"
    first = train(tmp_path)
    assert "training ended (rc 0)" in first
    target = (pair / "b8/target/model.safetensors").read_bytes()
    draft = (pair / "b8/draft/model.safetensors").read_bytes()
    assert "pair already trained" in train(tmp_path)                         # nothing asked: kept as it is
    out = train(tmp_path, DISTILL="0.5")
    assert "distill: 8 greedy continuations" in out and "training ended (rc 0)" in out
    report = json.loads((pair / "train.json").read_text())
    assert report["distill"] == 0.5 and report["target_from"] == str(pair / "b8")
    assert (pair / "b8/target/model.safetensors").read_bytes() == target        # the carried target kept
    assert (pair / "b8/draft/model.safetensors").read_bytes() != draft          # its draft trained again
    assert "pair already trained" in train(tmp_path, DISTILL="0.5")          # done once
    redrafted = (pair / "b8/draft/model.safetensors").read_bytes()
    again = train(tmp_path, DISTILL="0.5", REDRAFT="1")                      # asked for: trained on once more
    assert "training ended (rc 0)" in again and "pair already trained" not in again
    assert (pair / "b8/target/model.safetensors").read_bytes() == target
    assert (pair / "b8/draft/model.safetensors").read_bytes() != redrafted

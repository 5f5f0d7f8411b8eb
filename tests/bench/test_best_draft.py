"""training/best_draft.py: the draft chosen among trainings side by side is the one whose DFLASH chain accepts most
(issue 45's bar is DFLASH's), DDTREE b64 breaking a tie; folders without a draft's accept lengths are listed and
never chosen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def trained(folder: Path, block: int, chain: float, b64: float, steps: int | None = None) -> Path:
    (folder / "pair").mkdir(parents=True)
    accept = [{"tree": f"chain b{block - 1} c1", "accept_length": chain, "seen": chain, "heldout": chain},
              {"tree": "b32 c8", "accept_length": b64 - 0.2, "seen": 0, "heldout": 0},
              {"tree": "b64 c8", "accept_length": b64, "seen": 0, "heldout": 0}]
    (folder / "pair/train.json").write_text(json.dumps({
        "distill": 1.0, "depth_decay": 4.0, "batch": 128, "minutes": 13.0,
        "drafts": {f"b{block}": {"offline_accept": accept, **({"steps": steps} if steps else {})}}}))
    return folder


def pick(*folders: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training.best_draft", *map(str, folders)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_the_draft_whose_chain_accepts_most_is_chosen(tmp_path):
    a = trained(tmp_path / "A", 8, 3.95, 5.30, steps=12000)
    b = trained(tmp_path / "B", 16, 4.10, 5.10)
    c = trained(tmp_path / "C", 8, 4.10, 5.40)                      # B's chain, a wider tree that accepts more
    (tmp_path / "D/pair").mkdir(parents=True)                       # a training that died before train.json
    r = pick(a, b, c, tmp_path / "D")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == str(c)
    assert f"| {a} | 8 | 1 | 4 | 128 | 13 | 12000 | 3.950 | 5.100 | 5.300 |" in lines
    assert f"| {b} | 16 | 1 | 4 | 128 | 13 | - | 4.100 | 4.900 | 5.100 |" in lines
    assert any(line.startswith(f"| {tmp_path / 'D'} | no train.json") for line in lines)


def test_no_draft_to_choose_is_an_error(tmp_path):
    (tmp_path / "E/pair").mkdir(parents=True)
    (tmp_path / "E/pair/train.json").write_text(json.dumps({"drafts": {"b8": {"heldout_loss": 2.0}}}))
    r = pick(tmp_path / "E")
    assert r.returncode == 1 and "none of the folders has a draft with an offline accept length" in r.stderr
    assert "no offline accept length" in r.stdout

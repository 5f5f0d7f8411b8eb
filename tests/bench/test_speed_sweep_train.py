"""testbed/speed_sweep.sh train on the CPU with the small size: a pair is trained once; DISTILL trains the draft of a
pair already there again on its own target (a carried pair's), and is not repeated once done unless REDRAFT=1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import speed_sweep_train

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def train(tmp: Path, **env: str) -> str:
    return speed_sweep_train(tmp / "speed", **env)


def test_a_carried_pair_gets_a_distilled_draft_on_its_own_target_once(tmp_path):
    pair = tmp_path / "speed/pair"
    first = train(tmp_path)
    assert "training ended (rc 0)" in first
    # each draft judged offline on the sweep's 1-request prompts: the chain and two trees
    assert "draft b8 offline accept length on the speed sweep's 2 1-request prompts x 6 tokens" in first
    accepts = json.loads((pair / "train.json").read_text())["drafts"]["b8"]["offline_accept"]
    assert [a["tree"] for a in accepts] == ["chain b7 c1", "b32 c8", "b64 c8"]
    assert all(1 <= a["accept_length"] <= 6 for a in accepts)
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


def test_pack_draft_brings_back_only_the_draft_and_its_report(tmp_path):
    """PACK=draft: b8/draft and train.json in draft.tgz parts (the carried target is not sent back again); PACK=1 the
    whole pair; any other value is refused before anything runs."""
    out = tmp_path / "out"
    out.mkdir()
    train(tmp_path, PACK="draft", OUT=str(out))
    parts = sorted(out.iterdir())
    assert [p.name for p in parts] == ["draft.tgz.partaa"]
    listed = subprocess.run(["tar", "tzf", "-"], input=b"".join(p.read_bytes() for p in parts), capture_output=True,
                            check=True).stdout.decode().split()
    assert set(listed) >= {"pair/b8/draft/model.safetensors", "pair/train.json"}
    assert not [n for n in listed if "target" in n]
    r = subprocess.run(["bash", "testbed/speed_sweep.sh", "train"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PACK": "yes", "SPEED_DIR": str(tmp_path / "never")})
    assert r.returncode == 2 and "PACK=yes is invalid: expected 0 (nothing), 1 (the whole pair) or draft" in r.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.extended      # make test-cpu-extended; make test keeps the block-8 trainings on a kept target
def test_block_16_trains_a_new_draft_on_the_kept_target(tmp_path):
    """BLOCK=16 on a block-8 pair: a block-16 draft (a draft of another block cannot be trained on) on the same
    target, in pair/b16; a block size the sweep does not know is refused."""
    pair = tmp_path / "speed/pair"
    train(tmp_path)
    out = train(tmp_path, BLOCK="16")
    assert "training ended (rc 0)" in out and "chain b15 c1" in out
    report = json.loads((pair / "train.json").read_text())
    assert report["target_from"] == str(pair / "b8") and report["drafts"]["b16"]["warm_start"] is None
    assert json.loads((pair / "b16/draft/config.json").read_text())["dflash_config"]["block_size"] == 16
    assert (pair / "b16/target/model.safetensors").read_bytes() == (pair / "b8/target/model.safetensors").read_bytes()
    # exported as the sweep's run exports it, the pair's chain is DFLASH's block-16 chain: budget 15
    subprocess.run([sys.executable, "-m", "ddtree.reference.export", "--pair", str(pair / "b16"), "--out",
                    str(tmp_path / "exported")], cwd=ROOT, check=True, capture_output=True, timeout=300,
                   env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    from bench import sglang_speed
    assert sglang_speed.chain_of(tmp_path / "exported") == (15, 1)
    r = subprocess.run(["bash", "testbed/speed_sweep.sh", "train"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "BLOCK": "12", "SPEED_DIR": str(tmp_path / "never")})
    assert r.returncode == 2 and "BLOCK=12 is invalid: expected 8 or 16" in r.stderr
    assert not (tmp_path / "never").exists()

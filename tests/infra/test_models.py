"""playbooks/stage_models.yml on the sandbox host (issue 47, item 2): a small model served over HTTP on the loopback
from this machine (the sandbox shares its network; tests/file_source.py: Range requests, a token, a cut transfer)
staged at its digests, owned root:k26 and readable by the service, idempotent, repaired when a file is damaged, a
transfer cut half way continued inside the file, a gated source served with the vault's token that no output shows,
refused when a digest does not match or the folder is one the unit cannot see."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from tests.file_source import Source

from .conftest import CACHE, deploy, guest

MODEL = CACHE / "models" / "tiny-seed0" / "draft"        # the sandbox's own tiny draft (a few files)
DEST = "/srv/models/staged-test"


@pytest.fixture(scope="module")
def served():
    """The model folder served on a free loopback port for the module's tests."""
    server = Source(MODEL).start()
    yield server
    server.stop()


@pytest.fixture
def source(served):
    served.token, served.cut_after = None, {}
    return served.url


def digests(tmp: Path, bad: str | None = None) -> Path:
    lines = []
    for f in sorted(p for p in MODEL.rglob("*") if p.is_file()):
        sha = hashlib.sha256(f.read_bytes()).hexdigest()
        rel = f.relative_to(MODEL).as_posix()
        lines.append(f"{'0' * 64 if rel == bad else sha}  {rel}")
    out = tmp / "draft.sha256"
    out.write_text("\n".join(lines) + "\n")
    return out


def stage(tmp: Path, source: str, dest: str = DEST, bad: str | None = None, token: str = ""):
    models = [{"name": "draft", "source": source, "dest": dest, "digests": str(digests(tmp, bad))}]
    extra = {"k26_models": models, **({"k26_models_token": token} if token else {})}
    return deploy("-e", json.dumps(extra), tmp=tmp, playbook="playbooks/stage_models.yml")


def test_a_model_is_staged_at_its_digests_then_nothing_changes(converged, source, tmp_path):
    guest(f"rm -rf {DEST}")
    first = stage(tmp_path, source)
    assert first.rc == 0, first.out[-3000:]
    files = sorted(p.relative_to(MODEL).as_posix() for p in MODEL.rglob("*") if p.is_file())
    for rel in files:
        sha = hashlib.sha256((MODEL / rel).read_bytes()).hexdigest()
        assert guest(f"sha256sum {DEST}/{rel}").stdout.split()[0] == sha, rel
        assert guest(f"stat -c '%U:%G %a' {DEST}/{rel}").stdout.strip() == "root:k26 640", rel
    assert guest(f"stat -c '%U:%G %a' {DEST}").stdout.strip() == "root:k26 750"
    assert guest(f"sudo -u k26 cat {DEST}/config.json >/dev/null", check=False).returncode == 0   # the service reads it
    again = stage(tmp_path, source)
    assert again.rc == 0 and again.recap()["changed"] == 0, again.out[-3000:]


def test_a_damaged_file_is_fetched_again(converged, source, tmp_path):
    guest(f"truncate -s 10 {DEST}/config.json")
    play = stage(tmp_path, source)
    assert play.rc == 0 and play.recap()["changed"] >= 1, play.out[-3000:]
    assert guest(f"sha256sum {DEST}/config.json").stdout.split()[0] == \
        hashlib.sha256((MODEL / "config.json").read_bytes()).hexdigest()


def test_a_digest_that_does_not_match_fails_naming_the_file(converged, source, tmp_path):
    guest(f"rm -f {DEST}/config.json")
    play = stage(tmp_path, source, bad="config.json")
    out = re.sub(r"\s+", " ", play.out)
    assert play.rc != 0 and "draft/config.json" in out and "where the digest list pins " + "0" * 64 in out, out[-2000:]
    assert guest(f"test -e {DEST}/config.json", check=False).returncode != 0      # nothing left under the name
    assert guest(f"test -e {DEST}/config.json.part", check=False).returncode != 0


def test_a_cut_transfer_is_continued_inside_the_file(converged, served, source, tmp_path):
    guest(f"rm -f {DEST}/model.safetensors {DEST}/model.safetensors.part")
    size = (MODEL / "model.safetensors").stat().st_size
    served.cut_after["/model.safetensors"] = size // 3
    cut = stage(tmp_path, source)
    out = re.sub(r"\s+", " ", cut.out)
    assert cut.rc != 0 and f"stopped after {size // 3} bytes" in out and "run the play again" in out, out[-2000:]
    assert guest(f"stat -c %s {DEST}/model.safetensors.part").stdout.strip() == str(size // 3)
    assert guest(f"test -e {DEST}/model.safetensors", check=False).returncode != 0
    again = stage(tmp_path, source)
    assert again.rc == 0, again.out[-3000:]
    last = [s for s in served.seen if s.path == "/model.safetensors"][-1]
    assert last.range == f"bytes={size // 3}-" and last.sent == size - size // 3
    assert guest(f"sha256sum {DEST}/model.safetensors").stdout.split()[0] == \
        hashlib.sha256((MODEL / "model.safetensors").read_bytes()).hexdigest()


def test_a_gated_source_takes_the_vault_token_and_no_output_shows_it(converged, served, source, tmp_path):
    marker = "hf_sandbox_marker_5b8e1f"
    served.token = marker
    guest(f"rm -f {DEST}/config.json")
    refused = stage(tmp_path, source)
    out = re.sub(r"\s+", " ", refused.out)
    assert refused.rc != 0 and "HTTP 401" in out and "k26_models_token" in out, out[-2000:]
    ok = stage(tmp_path, source, token=marker)
    assert ok.rc == 0 and marker not in ok.out, ok.out[-3000:]
    assert [s.token for s in served.seen if s.path == "/config.json"][-1] == marker
    guest(f"rm -f {DEST}/config.json")
    wrong = stage(tmp_path, source, token="hf_wrong_marker_77aa")
    assert wrong.rc != 0 and "HTTP 401" in wrong.out and "hf_wrong_marker_77aa" not in wrong.out, wrong.out[-2000:]


def test_a_folder_the_unit_cannot_see_is_refused(converged, source, tmp_path):
    play = stage(tmp_path, source, dest="/home/k26/models/draft")
    out = re.sub(r"\s+", " ", play.out)
    assert play.rc != 0 and "dest=/home/k26/models/draft" in out and "ProtectHome" in out, out[-2000:]
    assert guest("test -e /home/k26/models", check=False).returncode != 0

"""playbooks/stage_models.yml on the sandbox host (issue 47, item 2): a small model served over HTTP on the loopback
from this machine (the sandbox shares its network) staged at its digests, owned root:k26 and readable by the service,
idempotent, repaired when a file is damaged, refused when a digest does not match or the folder is one the unit
cannot see."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import re
import socket
import threading
from pathlib import Path

import pytest

from .conftest import CACHE, deploy, guest

MODEL = CACHE / "models" / "tiny-seed0" / "draft"        # the sandbox's own tiny draft (a few files)
DEST = "/srv/models/staged-test"


@pytest.fixture(scope="module")
def source():
    """The model folder served on a free loopback port for the module's tests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(MODEL))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()


def digests(tmp: Path, bad: str | None = None) -> Path:
    lines = []
    for f in sorted(p for p in MODEL.rglob("*") if p.is_file()):
        sha = hashlib.sha256(f.read_bytes()).hexdigest()
        rel = f.relative_to(MODEL).as_posix()
        lines.append(f"{'0' * 64 if rel == bad else sha}  {rel}")
    out = tmp / "draft.sha256"
    out.write_text("\n".join(lines) + "\n")
    return out


def stage(tmp: Path, source: str, dest: str = DEST, bad: str | None = None):
    models = [{"name": "draft", "source": source, "dest": dest, "digests": str(digests(tmp, bad))}]
    return deploy("-e", json.dumps({"k26_models": models}), tmp=tmp, playbook="playbooks/stage_models.yml")


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
    assert play.rc != 0 and "draft/config.json" in out and "checksum" in out.lower(), out[-2000:]
    assert guest(f"test -e {DEST}/config.json", check=False).returncode != 0      # nothing left under the name


def test_a_folder_the_unit_cannot_see_is_refused(converged, source, tmp_path):
    play = stage(tmp_path, source, dest="/home/k26/models/draft")
    out = re.sub(r"\s+", " ", play.out)
    assert play.rc != 0 and "dest=/home/k26/models/draft" in out and "ProtectHome" in out, out[-2000:]
    assert guest("test -e /home/k26/models", check=False).returncode != 0

"""roles/models/files/k26_fetch_model.py run as the play runs it (a subprocess) against a real HTTP source on loopback
(tests/file_source.py): a file staged at its digest, a transfer cut half way continued with a Range request from
where it stopped, a source that ignores Range, a digest that does not match, a token sent only to the source's own
host and never printed (issue 47, item 2)."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.file_source import Source

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "roles/models/files/k26_fetch_model.py"
TOKEN = "hf_marker_7c1d0e55"
GROUP = grp.getgrgid(os.getgid()).gr_name
BODY = bytes(range(256)) * 4096 + b"tail"          # 1 MiB and 4 bytes


@pytest.fixture
def folder(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "model.safetensors").write_bytes(BODY)
    return src


@pytest.fixture
def source(folder):
    s = Source(folder).start()
    yield s
    s.stop()


def run(url: str, dest: Path, sha: str, token: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "K26_HUB_TOKEN"}
    if token:
        env["K26_HUB_TOKEN"] = token
    return subprocess.run([sys.executable, str(TOOL), "--url", url, "--dest", str(dest), "--sha256", sha,
                           "--group", GROUP, "--mode", "0640"], capture_output=True, text=True, env=env, timeout=60)


def outcome(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


SHA = hashlib.sha256(BODY).hexdigest()
PATH = "/sub/model.safetensors"


def test_a_file_is_fetched_checked_and_placed_then_left_alone(source, tmp_path):
    dest = tmp_path / "dest.safetensors"
    first = outcome(run(source.url + PATH, dest, SHA))
    assert first == {"changed": True, "resumed_from": None, "fetched": len(BODY)}
    assert dest.read_bytes() == BODY and oct(dest.stat().st_mode & 0o777) == "0o640"
    assert not dest.with_name(dest.name + ".part").exists()
    asked = len(source.seen)
    assert outcome(run(source.url + PATH, dest, SHA)) == {"changed": False, "resumed_from": None, "fetched": 0}
    assert len(source.seen) == asked, "a file already at its digest was requested again"


def test_a_cut_transfer_is_continued_from_where_it_stopped(source, tmp_path):
    dest = tmp_path / "dest.safetensors"
    source.cut_after[PATH] = 300_000
    cut = run(source.url + PATH, dest, SHA)
    assert cut.returncode == 1 and "run the play again" in cut.stderr, cut.stderr
    assert not dest.exists(), "a partial file was placed at the destination"
    part = dest.with_name(dest.name + ".part")
    assert part.stat().st_size == 300_000
    again = outcome(run(source.url + PATH, dest, SHA))
    assert again == {"changed": True, "resumed_from": 300_000, "fetched": len(BODY) - 300_000}
    assert source.seen[-1].range == "bytes=300000-" and source.seen[-1].sent == len(BODY) - 300_000
    assert dest.read_bytes() == BODY


def test_a_source_that_ignores_range_is_fetched_again_from_the_start(source, tmp_path):
    dest = tmp_path / "dest.safetensors"
    dest.with_name(dest.name + ".part").write_bytes(b"x" * 1000)      # a stale part: its bytes are wrong
    source.ranges = False
    assert outcome(run(source.url + PATH, dest, SHA)) == {"changed": True, "resumed_from": None, "fetched": len(BODY)}
    assert dest.read_bytes() == BODY


def test_a_whole_part_left_before_its_rename_is_checked_without_a_transfer(source, tmp_path):
    dest = tmp_path / "dest.safetensors"
    dest.with_name(dest.name + ".part").write_bytes(BODY)
    assert outcome(run(source.url + PATH, dest, SHA)) == {"changed": True, "resumed_from": len(BODY), "fetched": 0}
    assert dest.read_bytes() == BODY


def test_other_bytes_than_pinned_are_removed_and_named(source, tmp_path):
    dest = tmp_path / "dest.safetensors"
    wrong = "0" * 64
    p = run(source.url + PATH, dest, wrong)
    assert p.returncode == 1
    assert f"sha256 {SHA} where the digest list pins {wrong}" in p.stderr and str(dest) in p.stderr
    assert not dest.exists() and not dest.with_name(dest.name + ".part").exists()


def test_a_gated_source_names_the_token_variable_and_no_output_holds_the_token(source, tmp_path):
    dest = tmp_path / "dest.safetensors"
    source.token = TOKEN
    refused = run(source.url + PATH, dest, SHA)
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr and "k26_models_token" in refused.stderr
    wrong = run(source.url + PATH, dest, SHA, token="hf_wrong_marker_1234")
    assert wrong.returncode == 1 and "hf_wrong_marker_1234" not in wrong.stdout + wrong.stderr
    ok = run(source.url + PATH, dest, SHA, token=TOKEN)
    assert outcome(ok)["changed"] and TOKEN not in ok.stdout + ok.stderr
    assert source.seen[-1].token == TOKEN


def test_a_redirect_to_another_host_goes_without_the_token(folder, tmp_path):
    cdn = Source(folder, host="127.0.0.2").start()
    hub = Source(folder, redirect_to=None).start()
    hub.redirect_to = cdn.url
    try:
        dest = tmp_path / "dest.safetensors"
        assert outcome(run(hub.url + PATH, dest, SHA, token=TOKEN))["changed"]
        assert hub.seen[-1].token == TOKEN
        assert [s.token for s in cdn.seen] == [None], "the token went to another host"
        assert dest.read_bytes() == BODY
    finally:
        cdn.stop()
        hub.stop()


def test_bad_arguments_are_named():
    p = subprocess.run([sys.executable, str(TOOL), "--url", "http://127.0.0.1:9/x", "--dest", "/tmp/x",
                        "--sha256", "ABC"], capture_output=True, text=True)
    assert p.returncode == 2 and "--sha256 'ABC': expected 64 lowercase hex digits" in p.stderr

"""decide.sh's trained pairs carried between GPU machines (issue 44 item 5): PACK=1 writes the pairs of SIZES in
15 MiB parts without their SGLang exports, UNPACK=DIR restores them on a fresh machine, a machine that already holds
them keeps its own, and a folder without parts says the pairs will be trained. The two shell functions are taken from
the script itself and run in bash."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "testbed/decide.sh").read_text()


def functions() -> str:
    """unpack_pairs and pack_pairs as the script defines them, after the carry helper it sources."""
    found = [m.group(0) for name in ("unpack_pairs", "pack_pairs")
             for m in [re.search(rf"^{name}\(\) {{.*?^}}$", SCRIPT, re.S | re.M)] if m]
    assert len(found) == 2, "decide.sh no longer defines unpack_pairs and pack_pairs"
    assert re.search(r"^\. testbed/carry\.sh$", SCRIPT, re.M), "decide.sh no longer sources testbed/carry.sh"
    return "\n".join([(ROOT / "testbed/carry.sh").read_text(), *found])


def bash(tmp: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp / "run.sh"
    script.write_text(f"set -u\n{functions()}\n{body}\n")
    return subprocess.run(["bash", str(script)], env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def trained(root: Path, size: str, payload: bytes) -> Path:
    model = root / size / "pair/b8/draft/model.safetensors"
    model.parent.mkdir(parents=True)
    model.write_bytes(payload)
    (root / size / "sglang-pair").mkdir()
    (root / size / "sglang-pair/export.bin").write_bytes(b"x" * 1000)
    return model


def test_pairs_packed_in_parts_come_back_whole_without_their_exports(tmp_path):
    first, out, second = tmp_path / "first", tmp_path / "out", tmp_path / "second"
    out.mkdir()
    big = trained(first, "kimi", os.urandom(20 * 1024 * 1024))         # incompressible: two 15 MiB parts
    trained(first, "kimi-dense", b"small")
    r = bash(tmp_path, "pack_pairs", ROOT=str(first), OUT=str(out), SIZES="kimi kimi-dense", PACK="1")
    assert r.returncode == 0, r.stderr
    parts = sorted(p.name for p in out.iterdir())
    assert parts == ["pairs.tgz.partaa", "pairs.tgz.partab"] and "in 2 parts" in r.stdout
    assert all(p.stat().st_size <= 15 * 1024 * 1024 for p in out.iterdir())
    second.mkdir()
    r = bash(tmp_path, "unpack_pairs", ROOT=str(second), UNPACK=str(out), SIZES="kimi kimi-dense")
    assert r.returncode == 0 and "pairs unpacked" in r.stdout, r.stderr
    assert (second / "kimi/pair/b8/draft/model.safetensors").read_bytes() == big.read_bytes()
    assert (second / "kimi-dense/pair/b8/draft/model.safetensors").read_bytes() == b"small"
    assert not (second / "kimi/sglang-pair").exists()


def test_without_pack_nothing_is_written(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    trained(tmp_path / "root", "kimi", b"m")
    r = bash(tmp_path, "pack_pairs", ROOT=str(tmp_path / "root"), OUT=str(out), SIZES="kimi", PACK="0")
    assert r.returncode == 0 and list(out.iterdir()) == []


def test_a_machine_that_holds_the_pairs_keeps_its_own(tmp_path):
    root, out = tmp_path / "root", tmp_path / "out"
    out.mkdir()
    trained(tmp_path / "other", "kimi", b"carried")
    bash(tmp_path, "pack_pairs", ROOT=str(tmp_path / "other"), OUT=str(out), SIZES="kimi", PACK="1")
    own = trained(root, "kimi", b"trained here")
    r = bash(tmp_path, "unpack_pairs", ROOT=str(root), UNPACK=str(out), SIZES="kimi")
    assert r.returncode == 0 and r.stdout == "" and own.read_bytes() == b"trained here"


def test_a_folder_without_parts_says_the_pairs_are_trained_here(tmp_path):
    (tmp_path / "root").mkdir()
    r = bash(tmp_path, "unpack_pairs", ROOT=str(tmp_path / "root"), UNPACK=str(tmp_path / "empty"), SIZES="kimi")
    assert r.returncode == 0 and f"UNPACK={tmp_path / 'empty'} holds no pairs.tgz.part*: the pairs are trained here" \
        in r.stderr

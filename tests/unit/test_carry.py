"""testbed/carry.sh: files carried back from the GPU machine in 15 MiB parts and put together on the next one (the
pairs and JIT caches of run.sh, decide.sh and speed_sweep.sh), run in bash on made-up folders."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bash(tmp: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp / "run.sh"
    script.write_text(f"set -u\n. {ROOT / 'testbed/carry.sh'}\n{body}\n")
    return subprocess.run(["bash", str(script)], env={**os.environ, "TMPDIR": str(tmp), **env}, capture_output=True,
                          text=True, timeout=60)


def test_a_tree_goes_in_parts_of_15_mib_and_comes_back_whole(tmp_path):
    src, out, dst = tmp_path / "src", tmp_path / "out", tmp_path / "dst"
    (src / "pair/b8").mkdir(parents=True)
    out.mkdir()
    payload = os.urandom(17 * 1024 * 1024)                      # incompressible: two parts
    (src / "pair/b8/model.safetensors").write_bytes(payload)
    (src / "other").write_text("left behind")
    r = bash(tmp_path, f"carry_pack pair {src} 0 pair missing", OUT=str(out))
    assert r.returncode == 0, r.stderr
    parts = sorted(p.name for p in out.iterdir())
    assert parts == ["pair.tgz.partaa", "pair.tgz.partab"] and "pair packed" in r.stdout and "in 2 parts" in r.stdout
    assert max(p.stat().st_size for p in out.iterdir()) == 15 * 1024 * 1024
    assert not list(tmp_path.glob("carry-*"))                   # the whole tarball is not left behind
    r = bash(tmp_path, f"carry_unpack pair {out} {dst}")
    assert r.returncode == 0 and f"pair unpacked from {out} into {dst}" in r.stdout, r.stderr
    assert (dst / "pair/b8/model.safetensors").read_bytes() == payload and not (dst / "other").exists()


def test_a_second_pack_replaces_the_first_ones_parts(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "a").write_bytes(os.urandom(16 * 1024 * 1024))
    assert bash(tmp_path, f"carry_pack x {src} 0 a", OUT=str(out)).returncode == 0
    (src / "a").write_bytes(b"small now")
    assert bash(tmp_path, f"carry_pack x {src} 0 a", OUT=str(out)).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["x.tgz.partaa"]      # no stale second part to corrupt the join
    assert bash(tmp_path, f"carry_unpack x {out} {tmp_path / 'dst'}").returncode == 0
    assert (tmp_path / "dst/a").read_bytes() == b"small now"


def test_over_its_limit_or_with_nothing_present_nothing_is_packed_and_it_says_so(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    (src / ".cache/sglang").mkdir(parents=True)
    out.mkdir()
    (src / ".cache/sglang/kernel.so").write_bytes(os.urandom(2 * 1024 * 1024))
    r = bash(tmp_path, f"carry_pack jit {src} 1 .cache/sglang", OUT=str(out))
    assert r.returncode == 1 and "jit: 2 MiB is over its limit of 1 MiB: not packed" in r.stdout
    r = bash(tmp_path, f"carry_pack jit {src} 0 .triton", OUT=str(out))
    assert r.returncode == 1 and f"none of .triton in {src}: nothing packed" in r.stdout
    assert list(out.iterdir()) == [] and not list(tmp_path.glob("carry-*"))


def test_unpacking_from_a_folder_without_parts_says_so_and_changes_nothing(tmp_path):
    dst = tmp_path / "dst"
    r = bash(tmp_path, f"carry_unpack pair {tmp_path / 'empty'} {dst}")
    assert r.returncode == 1 and f"{tmp_path / 'empty'} holds no pair.tgz.part*: nothing unpacked" in r.stderr
    assert not dst.exists()


def test_every_gpu_script_carries_through_the_helper():
    for script in ("testbed/run.sh", "testbed/decide.sh", "testbed/speed_sweep.sh"):
        text = (ROOT / script).read_text()
        assert ". testbed/carry.sh" in text, script
        assert "split -b" not in text, f"{script} splits files itself instead of through testbed/carry.sh"


def packed_in_three_parts(tmp: Path) -> tuple[Path, bytes]:
    src, out = tmp / "src", tmp / "out"
    src.mkdir()
    out.mkdir()
    payload = os.urandom(40 * 1024 * 1024)                      # incompressible: parts aa, ab, ac
    (src / "model.safetensors").write_bytes(payload)
    assert bash(tmp, f"carry_pack pair {src} 0 model.safetensors", OUT=str(out)).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["pair.tgz.partaa", "pair.tgz.partab", "pair.tgz.partac"]
    return out, payload


def test_a_middle_part_that_did_not_arrive_is_named_and_nothing_is_unpacked(tmp_path):
    out, _ = packed_in_three_parts(tmp_path)
    (out / "pair.tgz.partab").unlink()                           # one of the carrying calls failed
    dst = tmp_path / "dst"
    r = bash(tmp_path, f"carry_unpack pair {out} {dst}")
    assert r.returncode == 1 and "has no pair.tgz.partab (found pair.tgz.partac in its place)" in r.stderr, r.stderr
    assert not dst.exists()


def test_a_last_part_missing_or_cut_short_unpacks_nothing(tmp_path):
    out, payload = packed_in_three_parts(tmp_path)
    last = out / "pair.tgz.partac"
    whole = last.read_bytes()
    last.write_bytes(whole[: len(whole) // 2])                   # a copy cut short
    dst = tmp_path / "dst"
    r = bash(tmp_path, f"carry_unpack pair {out} {dst}")
    assert r.returncode == 1 and "do not make a whole tarball" in r.stderr and not dst.exists(), r.stderr
    last.unlink()                                                # the last part never came
    r = bash(tmp_path, f"carry_unpack pair {out} {dst}")
    assert r.returncode == 1 and "do not make a whole tarball" in r.stderr and not dst.exists(), r.stderr
    last.write_bytes(whole)                                      # carried again: whole
    r = bash(tmp_path, f"carry_unpack pair {out} {dst}")
    assert r.returncode == 0 and (dst / "model.safetensors").read_bytes() == payload, r.stderr


def test_run_sh_collects_the_gpu_directory_unless_a_test_file_is_named(tmp_path):
    """testbed/targets.sh, which run.sh's pytest call takes its targets from."""
    def targets(*args: str) -> str:
        script = tmp_path / "t.sh"
        script.write_text(f"set -u\n. {ROOT / 'testbed/targets.sh'}\ngpu_test_targets \"$@\"\n")
        return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, check=True).stdout.strip()

    assert targets() == "tests/gpu_sglang"
    assert targets("-k", "chain_setting or b32-c8") == "tests/gpu_sglang"
    assert targets("tests/gpu_sglang/test_width_policy.py") == ""
    assert targets("-x", "tests/gpu_sglang/test_widths.py::test_one") == ""
    assert 'pytest $(gpu_test_targets "$@")' in (ROOT / "testbed/run.sh").read_text()

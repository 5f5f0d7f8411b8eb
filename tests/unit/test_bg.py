"""testbed/bg.sh: a GPU job in its own process session, and the waits that bring back what it has written,
each file once and no more than the device returns in one call (8 files: running.tgz and MAX_FILES more)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BG_SH = ROOT / "testbed/bg.sh"


def bg(tmp: Path, *args: str, out: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "BG": str(tmp / "bg")}
    env.pop("OUT", None)
    if out is not None:
        out.mkdir(exist_ok=True)
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(BG_SH), *args], env=env, capture_output=True, text=True, timeout=60)


def job_writing(tmp: Path, names: list[str]) -> None:
    """Start a job that writes `names` into its OUT, oldest first, and wait for it to end."""
    writes = "; ".join(f'echo {n} > "$OUT/{n}"; touch -d "@{1_700_000_000 + i}" "$OUT/{n}"'
                       for i, n in enumerate(names))
    assert bg(tmp, "start", "bash", "-c", writes).returncode == 0
    r = bg(tmp, "wait", "20")
    assert r.returncode == 0 and "[bg] ended, rc 0" in r.stdout, r.stdout + r.stderr


def test_waits_send_each_file_once_oldest_first_and_at_most_seven_a_call(tmp_path):
    names = [f"f{i}" for i in range(9)]
    job_writing(tmp_path, names)
    first = bg(tmp_path, "wait", "1", out=tmp_path / "out1")
    assert sorted(p.name for p in (tmp_path / "out1").iterdir()) == names[:7]
    assert "[bg] f7 and later files wait for the next call" in first.stdout
    bg(tmp_path, "wait", "1", out=tmp_path / "out2")
    assert sorted(p.name for p in (tmp_path / "out2").iterdir()) == names[7:]
    bg(tmp_path, "wait", "1", out=tmp_path / "out3")
    assert list((tmp_path / "out3").iterdir()) == []


def test_a_file_the_job_changed_after_it_was_sent_is_sent_again(tmp_path):
    job_writing(tmp_path, ["table.md", "logs.tgz"])
    bg(tmp_path, "wait", "1", out=tmp_path / "out1")
    (tmp_path / "bg/out/table.md").write_text("a longer table than before\n")
    bg(tmp_path, "wait", "1", out=tmp_path / "out2")
    assert [p.name for p in (tmp_path / "out2").iterdir()] == ["table.md"]
    assert (tmp_path / "out2/table.md").read_text() == "a longer table than before\n"


def test_a_wait_on_a_machine_without_the_job_says_so_at_once(tmp_path):
    r = bg(tmp_path, "wait", "30", out=tmp_path / "out")
    assert r.returncode == 3 and "no job on this machine" in r.stderr


def parts_of_15_mib(tmp: Path, names: str) -> None:
    """A finished job whose OUT holds 15 MiB parts (as carry.sh writes them) named by `names`, oldest first."""
    job_writing(tmp, list(names))
    for i, name in enumerate(names):
        part = tmp / "bg/out" / name
        part.write_bytes(b"\0" * 15 * 1048576)
        os.utime(part, (1_700_000_000 + i, 1_700_000_000 + i))


def test_a_call_carries_no_more_than_max_mib_and_the_rest_follow(tmp_path):
    parts_of_15_mib(tmp_path, "abc")
    bg(tmp_path, "wait", "1", out=tmp_path / "out1")
    assert sorted(p.name for p in (tmp_path / "out1").iterdir()) == ["a", "b", "c"]          # 45 MiB <= 48
    parts_of_15_mib(tmp_path, "abcd")
    r = bg(tmp_path, "wait", "1", out=tmp_path / "out2")
    assert sorted(p.name for p in (tmp_path / "out2").iterdir()) == ["a", "b", "c"]
    assert "[bg] d and later files wait for the next call" in r.stdout
    bg(tmp_path, "wait", "1", out=tmp_path / "out3")
    assert [p.name for p in (tmp_path / "out3").iterdir()] == ["d"]


def test_a_folder_goes_as_one_archive_and_again_only_when_a_file_in_it_changed(tmp_path):
    import tarfile

    job_writing(tmp_path, ["results.md"])
    logs = tmp_path / "bg/out/logs"
    logs.mkdir()
    (logs / "sglang-none.log").write_text("captured width 1\n")
    first = bg(tmp_path, "wait", "1", out=tmp_path / "out1")
    assert sorted(p.name for p in (tmp_path / "out1").iterdir()) == ["logs.tgz", "results.md"], first.stderr
    with tarfile.open(tmp_path / "out1/logs.tgz") as tar:
        assert tar.extractfile("logs/sglang-none.log").read() == b"captured width 1\n"
    bg(tmp_path, "wait", "1", out=tmp_path / "out2")
    assert list((tmp_path / "out2").iterdir()) == []
    (logs / "sglang-auto.log").write_text("DDTREE width policy: none, chain, b8\n")
    bg(tmp_path, "wait", "1", out=tmp_path / "out3")
    assert [p.name for p in (tmp_path / "out3").iterdir()] == ["logs.tgz"]
    with tarfile.open(tmp_path / "out3/logs.tgz") as tar:
        assert sorted(tar.getnames()) == ["logs", "logs/sglang-auto.log", "logs/sglang-none.log"]

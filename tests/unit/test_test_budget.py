"""tools/test_budget.py: make test's lanes timed and logged, the report with each lane's slowest tests and a
warning past the budget (issue 43)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "test_budget.py"
PYTEST_TAIL = """
============================= slowest 3 durations ==============================
12.50s call     tests/a.py::test_slow
3.10s setup    tests/b.py::test_fixture
0.20s call     tests/c.py::test_fast
============================== 3 passed in 16.00s ==============================
"""


def lane(name: str, logdir: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "run", name, str(logdir), "--", sys.executable, "-c", code],
                          capture_output=True, text=True)


def test_a_lane_passes_its_output_and_exit_code_through_and_is_logged(tmp_path):
    ok = lane("cpu", tmp_path, f"print({PYTEST_TAIL!r})")
    failed = lane("cpu", tmp_path, "import sys; print('boom'); sys.exit(3)")
    assert ok.returncode == 0 and "slowest 3 durations" in ok.stdout
    assert failed.returncode == 3 and "boom" in failed.stdout
    assert "boom" in (tmp_path / "cpu.log").read_text()
    assert [line.split()[0::2] for line in (tmp_path / "lanes.txt").read_text().splitlines()] == \
        [["cpu", "0"], ["cpu", "3"]]


def test_the_report_adds_a_lanes_commands_lists_its_slowest_tests_and_warns_past_the_budget(tmp_path):
    lane("sandbox", tmp_path, f"print({PYTEST_TAIL!r})")
    (tmp_path / "lanes.txt").write_text("sandbox 1500 0\ncpu 600 0\ncpu 700 1\n")
    r = subprocess.run([sys.executable, str(TOOL), "report", str(tmp_path), str(time.time() - 2500), "2400"],
                       capture_output=True, text=True)
    out = r.stdout
    assert r.returncode == 0
    assert "cpu: 21 min 40 s (exit 1)" in out and "sandbox: 25 min 0 s (passed)" in out
    slow = out.index("12.50s call     tests/a.py::test_slow")
    assert slow < out.index("3.10s setup    tests/b.py::test_fixture") < out.index("0.20s call")
    assert "WARNING: make test took 41 min, past its 40-minute budget" in out
    calm = subprocess.run([sys.executable, str(TOOL), "report", str(tmp_path), str(time.time() - 60), "2400"],
                          capture_output=True, text=True).stdout
    assert "WARNING" not in calm and "make test: 1 min" in calm

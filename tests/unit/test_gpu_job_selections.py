"""Every pytest run a GPU job script starts selects tests: a `-k` expression that matches nothing (a test renamed, a
typo) makes a part pass on the GPU machine having run nothing, and the device time is gone. The scripts' pytest
commands are read here (backslash continuations joined, `${VAR:-default}` and decide.sh's
`$(echo "$VAR" | sed 's/,/ or /g')` resolved to the script's defaults, `${VAR:+...}` left out) and collected with pytest on the CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["testbed/decide.sh", "testbed/kimi.sh", "testbed/widths_overlap.sh"]
PYTEST = re.compile(r"python3 -m pytest ((?:tests/gpu_sglang/\S+\.py *)+)(.*)")
DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")
JOINED = re.compile(r"\$\(echo \"\$(\w+)\" \| sed 's/,/ or /g'\)")
OPTIONAL = re.compile(r"\$\{\w+:\+[^}]*\}")
ASSIGNED = re.compile(r"^\s*(\w+)=\$\{\1:-([^}]*)\}", re.M)


def commands(script: str) -> list[str]:
    text = (ROOT / script).read_text().replace("\\\n", " ")
    return [ln for ln in text.splitlines() if "python3 -m pytest tests/gpu_sglang/" in ln and not ln.lstrip().startswith("#")]


def selection(script: str, line: str) -> tuple[list[str], str | None]:
    """The test files and the resolved -k expression (None: no -k) of one pytest command."""
    defaults = dict(ASSIGNED.findall((ROOT / script).read_text()))
    line = JOINED.sub(lambda m: defaults[m.group(1)].replace(",", " or "), line)
    files, rest = PYTEST.search(line).groups()
    rest = OPTIONAL.sub("", rest)                      # ${VAR:+-k "$VAR"}: no -k unless the caller sets VAR
    k = re.search(r'-k "([^"]*)"', rest)
    if k is None:
        return files.split(), None
    expr = DEFAULT.sub(lambda m: m.group(2), k.group(1))
    assert "$" not in expr, f"{script}: cannot resolve -k {k.group(1)!r}"
    return files.split(), expr


def cases():
    return [pytest.param(script, line, id=f"{Path(script).name}:{i}") for script in SCRIPTS
            for i, line in enumerate(commands(script))]


def test_the_scripts_start_pytest_at_all():
    assert len(cases()) >= 9, [c.values[1][:80] for c in cases()]


@pytest.mark.parametrize("script,line", cases())
def test_each_gpu_pytest_run_selects_tests(script, line):
    files, expr = selection(script, line)
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files]
    if expr is not None:
        cmd += ["-k", expr]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    got = re.search(r"(\d+)(?:/\d+)? tests? collected", r.stdout)
    assert r.returncode == 0 and got and int(got.group(1)) > 0, \
        f"{script}: pytest {' '.join(files)} -k {expr!r} selects nothing:\n{r.stdout[-800:]}{r.stderr[-800:]}"


def test_a_selection_that_matches_nothing_is_caught():
    line = 'python3 -m pytest tests/gpu_sglang/test_widths.py -p no:cacheprovider -k "test_no_such_test"'
    files, expr = selection("testbed/decide.sh", line)
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files,
                        "-k", expr], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert not re.search(r"[1-9]\d*(?:/\d+)? tests? collected", r.stdout)

"""Fixtures of the SGLang GPU tests: the staged test bed, the trained pair, a fleet of servers.

Needs (testbed/run.sh sets them): the SGLang test bed on PYTHONPATH, a CUDA GPU, and
  SGLANG_DDTREE_PAIR     the pair in SGLang's formats (python -m ddtree.reference.export)
  SGLANG_DDTREE_REF      the same pair as the reference engine loads it (training/train_pair.py)
  SGLANG_DDTREE_PROMPTS  held-out prompts (train_pair's heldout_prompts.json)
  SGLANG_DDTREE_START    configurations to start together first (comma list, "warm" or "all")
  SGLANG_DDTREE_OUT      where server logs and the results table go
  SGLANG_DDTREE_BASE_PORT the first server's port (default 31000)
Without them every test here is skipped. At the end a PASS/FAIL table is printed and written
(results.json, results.md) with what each test measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch


from testbed import servers as harness

RESULTS: list[dict] = []


def _missing() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if importlib.util.find_spec("sglang") is None:
        return "needs the staged SGLang test bed on PYTHONPATH"
    for name in ("SGLANG_DDTREE_PAIR", "SGLANG_DDTREE_REF", "SGLANG_DDTREE_PROMPTS"):
        if not os.environ.get(name):
            return f"needs {name} (testbed/run.sh sets it)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _missing()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "sglang_gpu" in item.keywords:
            item.add_marker(skip)


def _out() -> Path:
    return Path(os.environ.get("SGLANG_DDTREE_OUT", "/tmp/sglang-gpu"))


@pytest.fixture(scope="session")
def pair() -> Path:
    return Path(os.environ["SGLANG_DDTREE_PAIR"])


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """16 held-out prompts of different lengths: <bos> + the first 16, 31, ..., 241 bytes."""
    raw = json.loads(Path(os.environ["SGLANG_DDTREE_PROMPTS"]).read_text())
    return [p[: 1 + 16 + 15 * i] for i, p in enumerate(raw[:16])]


@pytest.fixture(scope="session")
def fleet(pair):
    # SGLANG_DDTREE_BASE_PORT: a second session on the same machine takes ports of its own
    fleet = harness.Fleet(pair, _out() / "logs", base_port=int(os.environ.get("SGLANG_DDTREE_BASE_PORT", "31000")))
    wanted = os.environ.get("SGLANG_DDTREE_START", "warm")
    names = {"warm": list(harness.WARM), "all": list(harness.CONFIGS)}.get(wanted, wanted.split(","))
    fleet.start([n for n in names if n], timeout=900)
    yield fleet
    fleet.stop_all()


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        RESULTS.append({"test": report.nodeid.split("::", 1)[-1], "outcome": report.outcome.upper(),
                        "measured": dict(report.user_properties),
                        "message": (str(report.longrepr).splitlines()[-1][:300] if report.failed else "")})


def pytest_runtest_logfinish(nodeid, location):
    _write_table()                       # after every test: a run cut short keeps what it measured


def _write_table() -> str:
    rows = ["| test | result | measured |", "|---|---|---|"]
    for r in RESULTS:
        measured = ", ".join(f"{k} {v}" for k, v in r["measured"].items())
        result = {"PASSED": "PASS", "FAILED": "FAIL"}.get(r["outcome"], r["outcome"])
        rows.append(f"| {r['test']} | {result} | {measured}{' / ' + r['message'] if r['message'] else ''} |")
    table = "\n".join(rows)
    out = _out()
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(RESULTS, indent=1))
    return table


def pytest_terminal_summary(terminalreporter):
    if RESULTS:
        terminalreporter.write_line("")
        terminalreporter.write_line(_write_table())

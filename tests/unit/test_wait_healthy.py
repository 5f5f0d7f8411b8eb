"""The verify role's health wait (roles/verify/files/k26_wait_healthy.py): when a unit's start has failed, and
/health read over real HTTP on loopback. The wait against a real systemd unit runs on the sandbox
(tests/infra/test_sandbox_host.py: a server that cannot start is reported in under 2 minutes)."""

from __future__ import annotations

import importlib.util
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "roles" / "verify" / "files" / "k26_wait_healthy.py"
spec = importlib.util.spec_from_file_location("k26_wait_healthy", PATH)
waiter = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = waiter          # its dataclass resolves annotations through the module
spec.loader.exec_module(waiter)

LOADING = waiter.UnitState(active="activating", sub="start", restarts=0, result="success", main_status="0",
                           invocation="a")
RUNNING = waiter.UnitState(active="active", sub="running", restarts=0, result="success", main_status="0",
                           invocation="a")


def state(**changes) -> waiter.UnitState:
    return waiter.UnitState(**{**RUNNING.__dict__, **changes})


@pytest.mark.parametrize("now", [RUNNING, LOADING])
def test_a_unit_that_is_coming_up_keeps_the_wait_going(now):
    assert waiter.start_failed(RUNNING, now) is None


@pytest.mark.parametrize("now,says", [
    (state(active="failed", sub="failed", result="exit-code", main_status="1"), "the unit failed (Result=exit-code"),
    (state(active="activating", sub="auto-restart", main_status="1"), "exit status 1); systemd is about to restart it"),
    (state(restarts=1, invocation="b"), "systemd restarted it (1 automatic restarts while waiting)"),
    (state(active="inactive", sub="dead"), "not running"),
])
def test_a_start_that_failed_ends_the_wait_naming_why(now, says):
    assert says in waiter.start_failed(RUNNING, now)


def test_restarts_before_the_wait_began_do_not_count():
    before = state(restarts=2)
    assert waiter.start_failed(before, before) is None
    assert waiter.start_failed(before, state(restarts=3)) is not None


@pytest.fixture()
def server():
    status = {"code": 503}

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status["code"])
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/health", status
    httpd.shutdown()
    httpd.server_close()


def test_health_is_read_over_http(server):
    url, status = server
    assert waiter.health_status(url) == 503
    status["code"] = 200
    assert waiter.health_status(url) == 200
    assert waiter.health_status("http://127.0.0.1:9/health") is None      # nothing listens: still loading


def test_bad_arguments_are_refused_with_the_usage(capsys):
    assert waiter.main(["http://x/health", "k26-ddtree.service"]) == 2
    assert "usage: k26_wait_healthy.py URL UNIT TIMEOUT JOURNAL_LINES" in capsys.readouterr().err


# --- issue 71: a load that makes no progress ends the wait ------------------------------------------------------

def test_a_load_that_logs_or_fills_memory_is_progress_and_a_silent_one_stalls():
    progress = waiter.Progress(since=0.0)
    progress.saw(100.0, lines=3, memory=1000)            # log lines: progress
    progress.saw(400.0, lines=0, memory=5000)            # the weights coming onto the GPUs: progress
    progress.saw(700.0, lines=0, memory=5030)            # within 64 MiB: not progress
    assert progress.since == 400.0
    assert progress.stalled(1000.0, stall=900) is None
    says = progress.stalled(1301.0, stall=900)
    assert says.startswith("the load made no progress for 901 s (k26_health_stall_timeout 900 s)")
    assert "unchanged at 5030 MiB" in says and "NCCL" in says
    assert progress.stalled(1e9, stall=0) is None        # 0: never


def test_without_nvidia_smi_the_journal_alone_decides():
    progress = waiter.Progress(since=0.0)
    progress.saw(50.0, lines=0, memory=None)
    assert progress.since == 0.0 and "no GPU memory to read" in progress.stalled(901.0, stall=900)


def test_a_stalled_load_ends_the_wait_with_its_reason_and_the_journal(monkeypatch, server):
    """The wait itself, on a clock of its own: /health never answers 200, the unit stays activating, the journal
    stops growing after the first minute; the wait ends at the stall, not at the 3600 s timeout."""
    url, _ = server
    clock = {"t": 0.0}
    monkeypatch.setattr(waiter.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(waiter.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + s))
    monkeypatch.setattr(waiter, "unit_state", lambda unit: LOADING)
    monkeypatch.setattr(waiter, "new_journal_lines", lambda unit, cursor: (2 if clock["t"] < 60 else 0, "c"))
    monkeypatch.setattr(waiter, "gpu_memory_mib", lambda: 70000)
    monkeypatch.setattr(waiter, "journal", lambda unit, lines: ["NCCL INFO Init START"])
    result = waiter.wait(url, "k26-ddtree.service", timeout=3600, lines=10, stall=300)
    assert not result["healthy"] and result["journal"] == ["NCCL INFO Init START"]
    assert result["reason"].startswith("the load made no progress for 30") and 355 <= result["seconds"] <= 365

"""Wait until a systemd-run server answers /health 200, watching its unit meanwhile (standard library only).

  python3 k26_wait_healthy.py URL UNIT TIMEOUT JOURNAL_LINES [STALL_SECONDS]

A 1T model loads for tens of minutes, so the wait is long; a server that cannot start must not keep it going
that long. Every 5 seconds: /health (200: done), else the unit's state from `systemctl show`. The wait stops at
once, with the unit's last journal lines, when the unit failed, is inactive, or systemd restarted its process
(NRestarts above what it was when the wait began, or the unit waiting out RestartSec): the start failed and the
journal says why. It also stops when the load makes no progress for STALL_SECONDS (0: never): no new line in the
unit's journal and the GPUs' used memory unchanged (nvidia-smi; on a host without it the journal alone) - a load
stuck in an NCCL init or a hung rank would otherwise hold the deploy for the whole TIMEOUT. Prints one JSON line: {"healthy": bool, "seconds": float, "reason": str, "unit": {...},
"journal": [str]}; exit status 0 when healthy, 1 otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

POLL_SECONDS = 5.0
FIELDS = ("ActiveState", "SubState", "NRestarts", "Result", "ExecMainStatus", "InvocationID")


@dataclass(frozen=True)
class UnitState:
    """What systemd says of the unit (systemctl show)."""

    active: str         # ActiveState: active | activating | deactivating | inactive | failed
    sub: str            # SubState: running | start | auto-restart | dead | failed ...
    restarts: int       # NRestarts: automatic restarts since the last manual start
    result: str         # Result: success | exit-code | signal | start-limit-hit ...
    main_status: str    # ExecMainStatus: the main process's exit status
    invocation: str     # InvocationID: this run's journal field _SYSTEMD_INVOCATION_ID


def unit_state(unit: str) -> UnitState:
    out = subprocess.run(["systemctl", "show", unit, *(f"--property={f}" for f in FIELDS)],
                         capture_output=True, text=True, check=True).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return UnitState(active=values.get("ActiveState", ""), sub=values.get("SubState", ""),
                     restarts=int(values.get("NRestarts", "0") or 0), result=values.get("Result", ""),
                     main_status=values.get("ExecMainStatus", ""), invocation=values.get("InvocationID", ""))


def start_failed(first: UnitState, now: UnitState) -> str | None:
    """Why the unit's start has failed, or None while it may still come up."""
    if now.active == "failed":
        return f"the unit failed (Result={now.result}, exit status {now.main_status})"
    if now.active == "inactive":
        return f"the unit is not running (inactive, Result={now.result})"
    if now.sub == "auto-restart":
        return f"the server process exited (exit status {now.main_status}); systemd is about to restart it"
    if now.restarts > first.restarts:
        return (f"the server process exited (exit status {now.main_status}) and systemd restarted it "
                f"({now.restarts - first.restarts} automatic restarts while waiting)")
    return None


def health_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return None


def journal(unit: str, lines: int) -> list[str]:
    out = subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "short-iso"],
                         capture_output=True, text=True, check=False)
    return out.stdout.splitlines()


def new_journal_lines(unit: str, cursor: str | None) -> tuple[int, str | None]:
    """(lines the unit's journal gained after `cursor`, the new cursor); None: from now on."""
    argv = ["journalctl", "-u", unit, "--no-pager", "-o", "cat", "--show-cursor", "-q"]
    argv += [f"--after-cursor={cursor}"] if cursor else ["-n", "0"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.splitlines()
    marks = [line for line in out if line.startswith("-- cursor: ")]
    new_cursor = marks[-1].removeprefix("-- cursor: ") if marks else cursor
    return len([line for line in out if not line.startswith("-- cursor: ")]), new_cursor


def gpu_memory_mib() -> int | None:
    """The GPUs' used memory, summed (None without nvidia-smi or when it fails)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return sum(int(x) for x in out.stdout.split()) if out.returncode == 0 else None
    except ValueError:
        return None


@dataclass
class Progress:
    """When the load last moved: a new journal line, or the GPUs' used memory changing by more than 64 MiB."""

    since: float
    memory: int | None = None
    cursor: str | None = None

    def saw(self, now: float, lines: int, memory: int | None) -> None:
        moved = lines > 0 or (memory is not None and (self.memory is None or abs(memory - self.memory) > 64))
        if memory is not None:
            self.memory = memory
        if moved:
            self.since = now

    def stalled(self, now: float, stall: float) -> str | None:
        if stall <= 0 or now - self.since < stall:
            return None
        memory = f"the GPUs' used memory unchanged at {self.memory} MiB" if self.memory is not None else \
            "no GPU memory to read"
        return (f"the load made no progress for {now - self.since:.0f} s (k26_health_stall_timeout {stall:.0f} s): no "
                f"new line in the unit's journal and {memory} - stuck (an NCCL init, a hung rank); the journal's "
                "last lines say where")


def wait(url: str, unit: str, timeout: float, lines: int, stall: float = 0.0) -> dict:
    start = time.monotonic()
    first = unit_state(unit)
    progress = Progress(since=start)
    _, progress.cursor = new_journal_lines(unit, None) if stall > 0 else (0, None)
    while True:
        if health_status(url) == 200:
            return {"healthy": True, "seconds": round(time.monotonic() - start, 1), "reason": "", "unit": {},
                    "journal": []}
        now = unit_state(unit)
        reason = start_failed(first, now)
        if reason is None and stall > 0:
            added, progress.cursor = new_journal_lines(unit, progress.cursor)
            progress.saw(time.monotonic(), added, gpu_memory_mib())
            reason = progress.stalled(time.monotonic(), stall)
        if reason is None and time.monotonic() - start >= timeout:
            reason = f"no 200 from {url} within {timeout:.0f} s (k26_health_timeout) while the unit is {now.active}"
        if reason is not None:
            return {"healthy": False, "seconds": round(time.monotonic() - start, 1), "reason": reason,
                    "unit": asdict(now), "journal": journal(unit, lines)}
        time.sleep(POLL_SECONDS)


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print("usage: k26_wait_healthy.py URL UNIT TIMEOUT JOURNAL_LINES [STALL_SECONDS]", file=sys.stderr)
        return 2
    url, unit, timeout, lines = argv[0], argv[1], float(argv[2]), int(argv[3])
    result = wait(url, unit, timeout, lines, float(argv[4]) if len(argv) == 5 else 0.0)
    print(json.dumps(result))
    return 0 if result["healthy"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Wait until a systemd-run server answers /health 200, watching its unit meanwhile (standard library only).

  python3 k26_wait_healthy.py URL UNIT TIMEOUT JOURNAL_LINES

A 1T model loads for tens of minutes, so the wait is long; a server that cannot start must not keep it going
that long. Every 5 seconds: /health (200: done), else the unit's state from `systemctl show`. The wait stops at
once, with the unit's last journal lines, when the unit failed, is inactive, or systemd restarted its process
(NRestarts above what it was when the wait began, or the unit waiting out RestartSec): the start failed and the
journal says why. Prints one JSON line: {"healthy": bool, "seconds": float, "reason": str, "unit": {...},
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


def wait(url: str, unit: str, timeout: float, lines: int) -> dict:
    start = time.monotonic()
    first = unit_state(unit)
    while True:
        if health_status(url) == 200:
            return {"healthy": True, "seconds": round(time.monotonic() - start, 1), "reason": "", "unit": {},
                    "journal": []}
        now = unit_state(unit)
        reason = start_failed(first, now)
        if reason is None and time.monotonic() - start >= timeout:
            reason = f"no 200 from {url} within {timeout:.0f} s (k26_health_timeout) while the unit is {now.active}"
        if reason is not None:
            return {"healthy": False, "seconds": round(time.monotonic() - start, 1), "reason": reason,
                    "unit": asdict(now), "journal": journal(unit, lines)}
        time.sleep(POLL_SECONDS)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: k26_wait_healthy.py URL UNIT TIMEOUT JOURNAL_LINES", file=sys.stderr)
        return 2
    url, unit, timeout, lines = argv[0], argv[1], float(argv[2]), int(argv[3])
    result = wait(url, unit, timeout, lines)
    print(json.dumps(result))
    return 0 if result["healthy"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

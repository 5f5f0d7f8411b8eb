"""Kill a playbook at a task boundary, run it again, check the host (see the package's docstring)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..conftest import BIN, CACHE, ROOT, SINGLE_HOST, guest

PLUGINS = Path(__file__).resolve().parent / "callback_plugins"
UNIT = "/etc/systemd/system/k26-ddtree.service"
FILES = [UNIT, "/etc/k26/k26-ddtree.env", "/etc/k26/k26-ddtree.yaml", "/etc/k26/gpu-host.env"]


@dataclass
class CrashPoint:
    index: int         # the task start the first run was killed at (1-based)
    task: str          # its name
    killed: bool       # the first run died by SIGKILL there
    rerun_rc: int      # the second run's exit status
    problems: list[str]

    @property
    def ok(self) -> bool:
        return self.killed and self.rerun_rc == 0 and not self.problems

    @property
    def detail(self) -> str:
        if not self.killed:
            return "the first run was not killed there (it ended first)"
        if self.rerun_rc != 0:
            return f"the re-run failed (rc {self.rerun_rc})"
        return "; ".join(self.problems) or "the host holds every invariant"


def _env(scratch: Path, **extra: str) -> dict:
    env = os.environ.copy()
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", ANSIBLE_HOME=str(scratch / "home"),
               ANSIBLE_LOCAL_TEMP=str(scratch / "tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_PLUGINS=str(PLUGINS), ANSIBLE_CALLBACKS_ENABLED="k26_crash")
    env.update(extra)
    return env


def _play(playbook: str, extra: list[str], scratch: Path, **env: str) -> subprocess.CompletedProcess:
    """One ansible-playbook run on the first sandbox server (no gateway), in its own process group."""
    scratch.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(BIN / "ansible-playbook"), playbook, *SINGLE_HOST, *extra], cwd=ROOT,
                          env=_env(scratch, **env), capture_output=True, text=True, timeout=1800,
                          start_new_session=True)


def task_starts(playbook: str, extra: list[str]) -> list[str]:
    """The names of the tasks one whole run starts, in order (the run itself changes the host as the
    playbook does)."""
    scratch = Path(tempfile.mkdtemp(prefix="k26-crash-count-", dir=CACHE))
    names = scratch / "names"
    r = _play(playbook, extra, scratch, K26_CRASH_NAMES=str(names))
    if r.returncode != 0:
        raise RuntimeError(f"the counting run of {playbook} failed: {r.stdout[-2000:]}")
    return names.read_text().splitlines()


def crash_and_rerun(playbook: str, extra: list[str], index: int = 0, name: str = "", at_name: str = "") -> CrashPoint:
    """Kill a run at task start `index` (or at the first task named like `at_name`), run it again,
    check the host."""
    scratch = Path(tempfile.mkdtemp(prefix=f"k26-crash-{index or 'named'}-", dir=CACHE))
    where = {"K26_CRASH_AT_NAME": at_name} if at_name else {"K26_CRASH_AT": str(index)}
    first = _play(playbook, extra, scratch / "killed", **where)
    killed = first.returncode == -signal.SIGKILL
    found = re.search(r"k26_crash: killed at task start (\d+): (.*)", first.stdout)
    second = _play(playbook, extra, scratch / "rerun")
    problems = invariants() if second.returncode == 0 else [second.stdout[-1500:]]
    return CrashPoint(int(found.group(1)) if found else index, found.group(2).strip() if found else name or at_name,
                      killed, second.returncode, problems)


def invariants() -> list[str]:
    """What must hold on the host after any interrupted run was followed by a whole one."""
    problems = []
    if guest("systemctl is-active k26-ddtree", check=False).stdout.strip() != "active":
        problems.append("the service is not active")
    if guest("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health", check=False).stdout != "200":
        problems.append("/health does not answer 200")
    current = guest("readlink -f /opt/k26/current", check=False).stdout.strip()
    unit = guest(f"cat {UNIT}", check=False).stdout
    if not current or f"ExecStart={current}/venv/bin/" not in unit:
        problems.append(f"the unit does not run the current release {current or '(none)'}")
    pid = guest("systemctl show -p MainPID --value k26-ddtree", check=False).stdout.strip()
    cmdline = guest(f"tr '\\0' ' ' < /proc/{pid}/cmdline", check=False).stdout if pid not in ("", "0") else ""
    if current and current not in cmdline:
        problems.append(f"the running process ({cmdline[:120]!r}) is not the current release's")
    started = guest("systemctl show -p ActiveEnterTimestamp --timestamp=unix --value k26-ddtree",
                    check=False).stdout.strip().lstrip("@")
    newest = guest("stat -c %Y " + " ".join(FILES) + " 2>/dev/null | sort -n | tail -1", check=False).stdout.strip()
    if started.isdigit() and newest.isdigit() and int(newest) > int(started):
        problems.append("the service started before its files were last written (it does not run what they say)")
    if guest(f"cmp -s {UNIT} /var/lib/k26-rollback/k26-ddtree.service", check=False).returncode != 0:
        problems.append("the rollback record is not the running unit (the running state was never recorded healthy)")
    if guest("ls /run/k26-deploy/ 2>/dev/null | grep -c '^token\\.' || true", check=False).stdout.strip() != "0":
        problems.append("the host lock is still held")
    marks = guest("ls /var/lib/k26-rollback/ | grep -- '-in-progress$' || true", check=False).stdout.split()
    if marks:
        problems.append(f"marked in progress: {marks}")
    return problems

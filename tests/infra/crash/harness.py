"""Interrupt a playbook at a task boundary, run it again, check the host (see the package's docstring)."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..conftest import BIN, CACHE, ROOT, guest

PLUGINS = Path(__file__).resolve().parent / "callback_plugins"
UNIT = "/etc/systemd/system/k26-ddtree.service"


@dataclass(frozen=True)
class Target:
    """A sandbox server host the harness runs on and checks."""
    name: str = "sandbox"            # its inventory name
    guest: str = "k26-sandbox"       # its ssh name (tools/sandbox.sh)
    port: int = 30000


TARGETS = {"sandbox": Target(), "sandbox2": Target("sandbox2", "k26-sandbox-2", 30001)}
# non-default folders (issue 48): every run of the harness deploys into these instead of the roles' defaults
ALT_FOLDERS = {"k26_prefix": "/opt/k26-alt", "k26_config_dir": "/etc/k26-alt", "k26_state_dir": "/var/lib/k26-alt"}


@dataclass
class Settings:
    """What every run of the harness targets (the CLI's --hosts and --folders)."""
    targets: tuple[Target, ...] = (Target(),)
    folders: dict = field(default_factory=dict)      # empty: the roles' defaults; else ALT_FOLDERS

    @property
    def prefix(self) -> str:
        return self.folders.get("k26_prefix", "/opt/k26")

    @property
    def config_dir(self) -> str:
        return self.folders.get("k26_config_dir", "/etc/k26")


SETTINGS = Settings()
GATEWAY_TOOL = ("/opt/k26-gateway/venv/bin/python /opt/k26-gateway/bin/k26_gateway.py pool "
                "--config /etc/k26-gateway/gateway.yaml status")
MODES = ("kill", "ssh-drop")


def drop_command() -> str:
    """Kill every root SSH session on the first server and on the gateway host (their listeners
    stay): the controller's connections end mid-task, as when the network between them fails."""
    kill = "tools/sandbox.sh exec pkill -KILL -f '^sshd: root@'"
    return "bash -c " + shlex.quote(f"K26_SANDBOX_HOST=k26-sandbox {kill}; K26_SANDBOX_HOST=k26-gateway {kill}; true")


@dataclass
class Before:
    """What the host ran before the interrupted run."""
    unit: str
    pid: str
    budget: int


@dataclass
class Scenario:
    """One playbook under the harness: its arguments for point k, what to do before each point, and
    what must hold after the re-run beyond the common invariants."""
    playbook: str
    args: Callable[[int, Before], list[str]]
    expect: Callable[[int, Before], list[str]] = lambda k, before: []
    prepare: Callable[[], None] = lambda: None
    # what must hold when this playbook is the whole run after ANOTHER playbook's interrupted one (sweep and
    # validate cannot know which unit ran before them then: the common invariants judge)
    expect_after_other: Callable[[int, Before], list[str]] | None = None
    # a run that may refuse to start from what another playbook's interrupted run left (sweep and validate refuse
    # files no deploy verified): the words of that refusal and the fix it names, run whole next
    refusal: str = ""
    fix: "Scenario | None" = None


@dataclass
class CrashPoint:
    index: int          # the task start the first run was interrupted at (1-based)
    task: str           # its name
    mode: str           # kill or ssh-drop (kill after item N: a looped task killed mid-loop)
    interrupted: bool   # the first run died there (SIGKILL) or ended failed or unreachable (ssh-drop)
    rerun_rc: int       # the second run's exit status
    problems: list[str] = field(default_factory=list)

    reached: bool = True   # the first run started that many tasks (a run's count varies with what it changes)
    note: str = ""         # what happened between the interrupted run and the checks (a refusal and its fix)

    @property
    def ok(self) -> bool:
        # a dropped connection that hit no running command leaves a run that ended well: still checked
        return self.reached and (self.interrupted or self.mode == "ssh-drop") and self.rerun_rc == 0 and not self.problems

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "NOT REACHED" if not self.reached else "FAIL"

    @property
    def detail(self) -> str:
        if not self.reached:
            return "the first run ended before this task start (it started fewer tasks than the counting run)"
        if not self.interrupted and self.mode == "kill":
            return "the first run was not killed there (it ended first)"
        if self.rerun_rc != 0:
            return f"the re-run failed (rc {self.rerun_rc})"
        survived = "" if self.interrupted else " (the drop hit no command: the first run ended well)"
        return self.note + ("; ".join(self.problems) or "the host holds every invariant") + survived


def _env(scratch: Path, **extra: str) -> dict:
    env = os.environ.copy()
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", ANSIBLE_HOME=str(scratch / "home"),
               ANSIBLE_LOCAL_TEMP=str(scratch / "tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_PLUGINS=str(PLUGINS), ANSIBLE_CALLBACKS_ENABLED="k26_crash")
    env.update(extra)
    return env


def scope(pool: bool) -> list[str]:
    """The harness's hosts (the first sandbox server unless --hosts says more) and folders; with `pool` their
    take-out and put-back go to the sandbox gateway (which must be deployed: `make deploy`)."""
    folders = ["-e", json.dumps(SETTINGS.folders)] if SETTINGS.folders else []
    return (["--limit", ":".join(t.name for t in SETTINGS.targets)] + ([] if pool else ["-e", "k26_gateway_pool=false"])
            + folders)


def play(playbook: str, extra: list[str], scratch: Path, pool: bool = False, **env: str) -> subprocess.CompletedProcess:
    """One ansible-playbook run in its own process group."""
    scratch.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(BIN / "ansible-playbook"), playbook, *scope(pool), *extra], cwd=ROOT,
                          env=_env(scratch, **env), capture_output=True, text=True, timeout=3600,
                          start_new_session=True)
    (scratch / "out.log").write_text(f"rc {done.returncode}\n{done.stdout}{done.stderr}")  # read after a failure
    return done


def task_starts(scenario: Scenario, pool: bool) -> list[str]:
    """The names of the tasks one whole run starts, in order (the run changes the host as the
    playbook does)."""
    scratch = Path(tempfile.mkdtemp(prefix="k26-crash-count-", dir=CACHE))
    names = scratch / "names"
    scenario.prepare()
    r = play(scenario.playbook, scenario.args(0, before()), scratch, pool, K26_CRASH_NAMES=str(names))
    if r.returncode != 0:
        raise RuntimeError(f"the counting run of {scenario.playbook} failed: {r.stdout[-2000:]}")
    return names.read_text().splitlines()


def before() -> Before:
    unit = guest(f"cat {UNIT}", check=False).stdout
    found = re.search(r"--speculative-ddtree-budget (\d+)", unit)
    return Before(unit, main_pid(), int(found.group(1)) if found else 0)


def main_pid() -> str:
    return guest("systemctl show -p MainPID --value k26-ddtree", check=False).stdout.strip()


CRASHED = re.compile(r"k26_crash: (?:killed at|killed after item \d+ of|dropping the SSH sessions [\d.]+ s into) "
                     r"task start (\d+): (.*)")


def interrupt_and_rerun(scenario: Scenario, k: int = 0, mode: str = "kill", at_name: str = "", name: str = "",
                        pool: bool = False, at_item: int = 0, then: Scenario | None = None) -> CrashPoint:
    """Interrupt a run at task start `k` (or at the first task named like `at_name`; with `at_item`, after that
    looped task's item `at_item`), run the same command again - or `then`, another playbook's whole run (a deploy
    after a killed sweep, a sweep after a killed deploy) - and check the host."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(MODES)}")
    if at_item and mode != "kill":
        raise ValueError(f"at_item={at_item} with mode={mode!r}: a loop is interrupted by kill only")
    scratch = Path(tempfile.mkdtemp(prefix=f"k26-crash-{mode}-{k or 'named'}-", dir=CACHE))
    scenario.prepare()
    if then is not None:
        then.prepare()
    was = before()
    extra = scenario.args(k, was)
    where = {"K26_CRASH_AT_NAME": at_name} if at_name else {"K26_CRASH_AT": str(k)}
    if at_item:
        where["K26_CRASH_AT_ITEM"] = str(at_item)
    first = play(scenario.playbook, extra, scratch / "first", pool, K26_CRASH_MODE=mode,
                 K26_CRASH_DROP_CMD=drop_command(), **where)
    interrupted = first.returncode == -signal.SIGKILL if mode == "kill" else first.returncode != 0
    found = CRASHED.search(first.stdout)
    if found is None and first.returncode == 0 and not at_name:      # the chosen task start never came
        return CrashPoint(k, name, mode, False, 0, reached=False)
    rerun = then or scenario
    expect = (rerun.expect_after_other or rerun.expect) if then is not None else rerun.expect
    left = guest(f"cat {UNIT}", check=False).stdout
    second = play(rerun.playbook, rerun.args(k, was) if then is not None else extra, scratch / "rerun", pool)
    note = ""
    if second.returncode != 0 and rerun.refusal and rerun.fix and rerun.refusal in " ".join(second.stdout.split()):
        # the run refused what the interrupted one left and named its fix: nothing may have changed, and the fix,
        # run whole, must make the host whole
        changed = guest(f"cat {UNIT}", check=False).stdout != left
        note = (f"{rerun.playbook} refused and named {rerun.fix.playbook}"
                + (" BUT CHANGED THE UNIT" if changed else ", nothing changed") + f"; after {rerun.fix.playbook}: ")
        if changed:
            return CrashPoint(k, name or at_name, mode, interrupted, 1, ["the refusing run changed the unit"], note=note)
        second = play(rerun.fix.playbook, rerun.fix.args(k, was), scratch / "fix", pool)
        expect = rerun.fix.expect
    problems = invariants(pool) + expect(k, was) if second.returncode == 0 else [second.stdout[-1500:]]
    return CrashPoint(int(found.group(1)) if found else k, found.group(2).strip() if found else name or at_name,
                      mode, interrupted, second.returncode, problems, note=note)


def invariants(pool: bool = False) -> list[str]:
    """What must hold on every target host after any interrupted run was followed by a whole one."""
    problems = []
    for target in SETTINGS.targets:
        named = f"{target.name}: " if len(SETTINGS.targets) > 1 else ""
        problems += [named + p for p in host_invariants(target)]
    if pool:
        problems += pool_problems()
    return problems


def host_invariants(target: Target) -> list[str]:
    """What must hold on one host (see invariants)."""
    on_host = functools.partial(guest, check=False, host=target.guest)
    prefix, config = SETTINGS.prefix, SETTINGS.config_dir
    files = [UNIT, f"{config}/k26-ddtree.env", f"{config}/k26-ddtree.yaml", f"{config}/gpu-host.env"]
    problems = []
    if on_host("systemctl is-active k26-ddtree", check=False).stdout.strip() != "active":
        problems.append("the service is not active")
    if on_host(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{target.port}/health").stdout != "200":
        problems.append("/health does not answer 200")
    current = on_host(f"readlink -f {prefix}/current").stdout.strip()
    unit = on_host(f"cat {UNIT}").stdout
    if not current or f"ExecStart={current}/venv/bin/" not in unit:
        problems.append(f"the unit does not run the current release {current or '(none)'}")
    pid = on_host("systemctl show -p MainPID --value k26-ddtree").stdout.strip()
    cmdline = on_host(f"tr '\\0' ' ' < /proc/{pid}/cmdline", check=False).stdout if pid not in ("", "0") else ""
    if current and current not in cmdline:
        problems.append(f"the running process ({cmdline[:120]!r}) is not the current release's")
    started = on_host("systemctl show -p ActiveEnterTimestamp --timestamp=unix --value k26-ddtree",
                    check=False).stdout.strip().lstrip("@")
    newest = on_host("stat -c %Y " + " ".join(files) + " 2>/dev/null | sort -n | tail -1").stdout.strip()
    if started.isdigit() and newest.isdigit() and int(newest) > int(started):
        problems.append("the service started before its files were last written (it does not run what they say)")
    if on_host(f"cmp -s {UNIT} /var/lib/k26-rollback/state/k26-ddtree.service", check=False).returncode != 0:
        problems.append("the rollback record is not the running unit (the running state was never recorded healthy)")
    sets = on_host("ls -d /var/lib/k26-rollback/state.* 2>/dev/null || true", check=False).stdout.split()
    if len(sets) > 2:          # the one `state` names, and at most one a killed save left (the next save removes it)
        problems.append(f"saved sets pile up: {sets}")
    if on_host("ls /run/k26-deploy/ 2>/dev/null | grep -c '^token\\.' || true", check=False).stdout.strip() != "0":
        problems.append("the host lock is still held")
    marks = on_host("ls /var/lib/k26-rollback/ | grep -- '-in-progress$' || true", check=False).stdout.split()
    if marks:
        problems.append(f"marked in progress: {marks}")
    return problems


def pool_problems() -> list[str]:
    """Every target server is in the gateway's pool, healthy, ready and takes the gateway's key; the fleet lock is
    free."""
    out = guest(GATEWAY_TOOL, check=False, host="k26-gateway").stdout
    try:
        workers = {w["url"]: w for w in json.loads(out)}
    except ValueError:
        return [f"the gateway's pool status could not be read: {out[:200]!r}"]
    problems = []
    for target in SETTINGS.targets:
        url = f"http://127.0.0.1:{target.port}"       # the server as the sandbox gateway's file names it
        w = workers.get(url)
        if not w or not (w["healthy"] and w["status"] == "ready" and w["authorized"]):
            problems.append(f"{url} is not back in the gateway's pool, healthy, ready and authorized: {w}")
    if guest("ls /run/k26-fleet/ 2>/dev/null | grep -c '^token\\.' || true", check=False,
             host="k26-gateway").stdout.strip() != "0":
        problems.append("the fleet lock is still held")
    return problems

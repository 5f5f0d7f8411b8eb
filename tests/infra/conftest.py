"""The sandbox host, converged with `ansible-playbook deploy.yml` once per session.

Needs root, systemd-nspawn and debootstrap (`make test` brings the sandbox up first).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("K26_CACHE", Path.home() / ".cache" / "k26-ddtree"))
SANDBOX = Path(os.environ.get("K26_SANDBOX_DIR", CACHE / "sandbox"))


@dataclass
class Play:
    rc: int
    out: str
    seconds: float

    def recap(self) -> dict[str, int]:
        line = re.search(r"sandbox\s+:\s+(ok=.*)", self.out)
        assert line, self.out[-2000:]
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line.group(1))}


# The sandbox inventory is a fleet (two server hosts behind a gateway host); the single-host tests
# deploy to the first server only and leave the gateway alone; tests/infra/test_fleet.py rolls the fleet.
SINGLE_HOST = ("--limit", "sandbox", "-e", "k26_gateway_pool=false")


def deploy(*extra: str, tmp: Path | None = None, playbook: str = "deploy.yml", fleet: bool = False,
           monitoring: bool = False) -> Play:
    """Run a playbook against the sandbox. deploy.yml's monitoring play (on by default for operators)
    is left out unless asked for: test_monitoring.py deploys it and tests it; every other deploy
    here would only re-check it unchanged (~8 s a host), which `make test` cannot afford ~40 times."""
    env = os.environ.copy()
    scratch = tmp or CACHE / "ansible-test"
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", ANSIBLE_HOME=str(scratch / "home"),
               ANSIBLE_LOCAL_TEMP=str(scratch / "tmp"), ANSIBLE_NOCOLOR="1")
    t0 = time.perf_counter()
    scope = () if fleet else SINGLE_HOST
    scope += () if monitoring or playbook != "deploy.yml" else ("-e", "k26_monitoring=false")
    r = subprocess.run([str(BIN / "ansible-playbook"), playbook, *scope, *extra], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1800)
    return Play(r.returncode, r.stdout + r.stderr, time.perf_counter() - t0)


def guest(cmd: str, check: bool = True, host: str = "k26-sandbox") -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(SANDBOX / "ssh_config"), host, cmd], capture_output=True,
                          text=True, timeout=120, check=check)


def not_waited_for(play: Play, host: str = "k26-sandbox", lock_dir: str = "/run/k26-deploy") -> bool:
    """A play refused by a held lock gave up instead of waiting its holder out: it failed, and the lock was
    still held when it ended (what "fails fast" means, with no bound on how fast this machine is today)."""
    held = guest(f"flock -n {lock_dir}/lock true", host=host, check=False).returncode != 0
    return play.rc != 0 and held


def current_release(host) -> str:
    """The release folder `/opt/k26/current` points at (the last one that passed health and smoke)."""
    return host.check_output("readlink -f /opt/k26/current")


JOURNAL: dict[str, str] = {}   # the guest journal's cursor before this session's first converge


def journal_cursor() -> str:
    out = guest("journalctl -n 0 --show-cursor -q --no-pager", check=False).stdout
    found = re.search(r"-- cursor: (\S+)", out)
    return found.group(1) if found else ""


def journal_since_session() -> str:
    """Everything the guest logged since this test session's first converge (a reused sandbox keeps
    older sessions' entries, written by older code)."""
    start = JOURNAL.get("start", "")
    after = f"--after-cursor='{start}'" if start else ""
    return guest(f"journalctl --no-pager -o cat {after}").stdout


@pytest.fixture(scope="session")
def sandbox_up():
    r = subprocess.run([str(ROOT / "tools" / "sandbox.sh"), "fleet", "status"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"the sandbox fleet is not running ({r.stdout.strip()}): run `make sandbox` (make test does it)")
    return SANDBOX


SERVICE_STARTS: dict[str, str] = {}   # the service's main PID and start time after each converge


def service_start() -> str:
    """k26-ddtree's main PID and the monotonic time it started: a restart changes both."""
    return guest("systemctl show k26-ddtree -p MainPID -p ExecMainStartTimestampMonotonic --value", check=False).stdout


@pytest.fixture(scope="session")
def converged(sandbox_up) -> tuple[Play, Play]:
    JOURNAL["start"] = journal_cursor()
    first = deploy()
    assert first.rc == 0, first.out[-5000:]
    SERVICE_STARTS["first"] = service_start()
    second = deploy()
    assert second.rc == 0, second.out[-5000:]
    SERVICE_STARTS["second"] = service_start()
    return first, second


@pytest.fixture(scope="session")
def fleet_deployed(converged) -> Play:
    """The whole sandbox fleet deployed once, with deploy.yml's monitoring play: the gateway host and the second
    server join the converged first one, every host gets its node exporter and the monitor host Prometheus and
    Alertmanager. test_monitoring.py (first) and test_fleet.py share it (one fleet deploy instead of two: issue 43);
    the fleet's later rolls leave the monitoring play out, and it keeps running."""
    play = deploy(fleet=True, monitoring=True)
    assert play.rc == 0, play.out[-5000:]
    assert "gateway healthy on port 30080: 2 workers ready" in play.out
    return play


@pytest.fixture(scope="session")
def host(converged):
    import testinfra

    return testinfra.get_host("ssh://k26-sandbox", ssh_config=str(SANDBOX / "ssh_config"))


def pytest_collection_modifyitems(config, items):
    """The single-host tests first, the crash sample last among them (the fleet deploy after it renders the
    inventory's settings on its host again); then tests/infra/test_monitoring.py (on the freshly deployed fleet)
    and test_fleet.py (its rolls change the first server's settings), sharing one fleet deploy (fleet_deployed);
    and test_secrets.py last: it searches everything the other tests left behind (the journal after deploys,
    verifies, sweeps, validations and rolls; the snapshot and rollback folders)."""
    order = {"test_crash.py": 0.5, "test_monitoring.py": 1, "test_fleet.py": 2, "test_secrets.py": 3}
    items.sort(key=lambda item: order.get(item.fspath.basename, 0))

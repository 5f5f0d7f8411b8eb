"""testinfra on the sandbox fleet: two server hosts behind the gateway host (smg), rolled one at a time.

The fleet's converge (`deploy.yml` without a limit, as `make deploy` runs it) is this module's
fixture; every test then sends its requests through the gateway on 127.0.0.1:30080, as a client
of the fleet would, while the playbooks change the hosts behind it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from .conftest import BIN, ROOT, deploy, guest

GATEWAY = "http://127.0.0.1:30080"
API_KEY = "sandbox-demo-key"
NEXT_KEY = "sandbox-next-demo-key"        # listed ahead in the sandbox gateway's k26_gateway_api_keys
ADMIN_KEY = "sandbox-gateway-admin-key"
SERVERS = {"sandbox": ("k26-sandbox", "http://127.0.0.1:30000"), "sandbox2": ("k26-sandbox-2", "http://127.0.0.1:30001")}
HEALTH_INTERVAL, FAILURES = 1, 2          # inventory/sandbox/group_vars/k26_gateway/gateway.yml
TOOL = "/opt/k26-gateway/venv/bin/python /opt/k26-gateway/bin/k26_gateway.py"


@dataclass
class Traffic:
    """`clients` threads sending short completions through the gateway with `key` until stopped."""
    clients: int = 4
    key: str = API_KEY
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                try:
                    r = client.post(GATEWAY + "/v1/completions", headers={"Authorization": f"Bearer {self.key}"},
                                    json={"model": "k26-sandbox-tiny", "prompt": "roll", "max_tokens": 4})
                    good = r.status_code == 200 and isinstance(r.json()["choices"][0]["text"], str)
                    outcome = None if good else f"{r.status_code}: {r.text[:200]}"
                except (httpx.HTTPError, ValueError, KeyError) as err:
                    outcome = f"{type(err).__name__}: {err}"
                with self._lock:
                    if outcome is None:
                        self.ok += 1
                    else:
                        self.failures.append(outcome)

    def __enter__(self) -> Traffic:
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.clients)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=90)


def pool() -> dict[str, dict]:
    """The gateway's pool by worker URL (through the tool on the gateway host, with its admin key)."""
    r = guest(f"{TOOL} pool --config /etc/k26-gateway/gateway.yaml status", host="k26-gateway", check=False)
    return {w["url"]: w for w in json.loads(r.stdout)} if r.returncode == 0 else {}


def ready(url: str) -> bool:
    w = pool().get(url)
    return bool(w and w["healthy"] and w["status"] == "ready")


def budget(name: str) -> int:
    unit = guest("cat /etc/systemd/system/k26-ddtree.service", host=SERVERS[name][0]).stdout
    return int(re.search(r"--speculative-ddtree-budget (\d+)", unit).group(1))


def wait_until(ok, timeout: float, what: str) -> float:
    """Seconds until ok() held; fails after timeout."""
    t0 = time.monotonic()
    while not ok():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout} s (pool: {pool()})")
        time.sleep(0.2)
    return time.monotonic() - t0


def gateway_pid() -> str:
    return guest("systemctl show -p MainPID --value k26-gateway", host="k26-gateway").stdout.strip()


def through_gateway(key: str) -> int:
    r = httpx.post(GATEWAY + "/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                   json={"model": "k26-sandbox-tiny", "prompt": "key", "max_tokens": 2})
    return r.status_code


def fleet_lock_free() -> bool:
    """No token left AND the flock itself free: a holder loop notices its removed token only at its next
    one-second tick and holds the flock until then (a planted lock right after a token check alone found it
    held: CI 2026-12-04, exit 75)."""
    lock = "/run/k26-fleet/lock"
    state = guest(f"n=$(ls /run/k26-fleet/ | grep -c '^token\\.'); "
                  f"{{ [ ! -e {lock} ] || flock -n {lock} true; }} && echo \"$n\" || echo held",
                  host="k26-gateway").stdout.strip()
    return state == "0"


def run_on_gateway(out: str) -> list[tuple[str, str]]:
    """(task name, server host) of each task a play ran on the gateway for a server host, in order."""
    rows = []
    for chunk in out.split("\nTASK [")[1:]:
        task = chunk.split("]", 1)[0]
        rows += [(task, host) for host in re.findall(r"(?:changed|ok): \[(sandbox2?) -> gateway", chunk)]
    return rows


@pytest.fixture(scope="module")
def fleet(fleet_deployed):
    # the session's one fleet deploy (conftest.fleet_deployed): the gateway and the second server joined the first
    return fleet_deployed


def test_the_gateway_unit_verifies_and_its_keys_stay_in_its_file(fleet):
    assert guest("systemd-analyze verify /etc/systemd/system/k26-gateway.service", host="k26-gateway",
                 check=False).returncode == 0
    assert guest("stat -c '%a %U %G' /etc/k26-gateway/gateway.yaml", host="k26-gateway").stdout.split() == \
        ["640", "root", "k26gw"]
    pid = guest("systemctl show -p MainPID --value k26-gateway", host="k26-gateway").stdout.strip()
    seen = guest(f"cat /proc/{pid}/cmdline /proc/{pid}/environ | tr '\\0' ' '", host="k26-gateway").stdout
    exec_start = guest("systemctl show -p ExecStart --value k26-gateway", host="k26-gateway").stdout
    assert "k26_gateway.py serve --config /etc/k26-gateway/gateway.yaml" in exec_start   # (smg retitles its process)
    assert API_KEY not in exec_start and ADMIN_KEY not in exec_start
    assert API_KEY not in seen and ADMIN_KEY not in seen
    assert guest("ps -o user= -p " + pid, host="k26-gateway").stdout.strip() == "k26gw"
    assert httpx.post(GATEWAY + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 401
    assert httpx.get(GATEWAY + "/workers", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 401
    assert all(ready(url) for _, url in SERVERS.values()), pool()
    assert fleet_lock_free()


def test_a_rolling_deploy_changes_both_hosts_with_no_failed_request(fleet):
    start = {name: budget(name) for name in SERVERS}
    new = 12 if start["sandbox"] != 12 else 20
    with Traffic() as traffic:
        play = deploy("-e", f"k26_ddtree_budget={new}", fleet=True)
    assert play.rc == 0, play.out[-5000:]
    assert traffic.failures == [] and traffic.ok > 50, (traffic.ok, traffic.failures[:5])
    assert {name: budget(name) for name in SERVERS} == {"sandbox": new, "sandbox2": new}
    # one host at a time: the pool commands run on the gateway for sandbox (take-out, put-back),
    # and only then for sandbox2
    on_gateway = run_on_gateway(play.out)
    order = [host for task, host in on_gateway if not task.startswith("host_lock :")]
    assert order == ["sandbox", "sandbox", "sandbox2", "sandbox2"], order
    # each host re-checked the roll's fleet lock on the gateway before its restart and before its promotion (issue 48)
    rechecks = [host for task, host in on_gateway if task == "host_lock : Check that this run still holds the lock"]
    assert rechecks == ["sandbox", "sandbox", "sandbox2", "sandbox2"], on_gateway
    assert all(ready(url) for _, url in SERVERS.values()) and fleet_lock_free()


@pytest.mark.extended
def test_a_second_host_that_fails_its_smoke_rolls_back_alone_and_both_keep_serving(fleet, tmp_path):
    before = {name: budget(name) for name in SERVERS}
    new = 24 if before["sandbox"] != 24 else 28
    extra = tmp_path / "second-host-fails.yml"
    # the smoke asks sandbox2 for more tokens than the tiny model's context: its server answers 400
    extra.write_text(f"k26_ddtree_budget: {new}\n"
                     "k26_smoke_max_tokens: \"{{ 4096 if inventory_hostname == 'sandbox2' else 32 }}\"\n")
    with Traffic() as traffic:
        play = deploy("-e", f"@{extra}", fleet=True)
    assert play.rc != 0
    text = re.sub(r"\s+", " ", play.out)
    assert "deploy of sandbox2 failed at" in text and "the roll stops here" in text, text[-3000:]
    assert {name: budget(name) for name in SERVERS} == {"sandbox": new, "sandbox2": before["sandbox2"]}
    assert traffic.failures == [] and traffic.ok > 20, (traffic.ok, traffic.failures[:5])
    assert all(ready(url) for _, url in SERVERS.values()), pool()
    assert fleet_lock_free()
    with httpx.Client(timeout=60) as client:                        # both hosts serve through the gateway
        answers = [client.post(GATEWAY + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                               json={"model": "k26-sandbox-tiny", "prompt": "after", "max_tokens": 2})
                   for _ in range(4)]
    assert [a.status_code for a in answers] == [200] * 4


def test_a_host_stopped_by_hand_leaves_rotation_within_the_health_checks_and_returns(fleet):
    name, url = "k26-sandbox-2", SERVERS["sandbox2"][1]
    assert ready(url)
    with Traffic() as traffic:
        guest("systemctl stop --no-block k26-ddtree", host=name)
        try:
            gone = wait_until(lambda: not (pool().get(url) or {}).get("healthy", False), 30, "marked unhealthy")
        finally:
            # the drain ends within seconds (a draining server closes kept-alive connections)
            wait_until(lambda: guest("systemctl is-active k26-ddtree", host=name, check=False).stdout.strip()
                       in ("inactive", "failed"), 60, "the stop")
            guest("systemctl start k26-ddtree", host=name)
        back = wait_until(lambda: ready(url), 120, "healthy again after the restart")
    # marked by the gateway's own health checks (nothing else here tells it), every client request answered
    # meanwhile; the time is printed, not bounded: a busy CI machine stretches it (issue 43)
    print(f"marked unhealthy after {gone:.1f} s (health checks: {FAILURES} x {HEALTH_INTERVAL} s)")
    assert traffic.failures == [] and traffic.ok > 10, (traffic.ok, traffic.failures[:5])
    assert back < 120


@pytest.mark.extended     # make test's time: sweep.yml's take-out and put-back are held by tests/ansible/test_static.py
def test_a_sweep_takes_its_host_out_of_the_pool_and_puts_it_back(fleet, tmp_path):
    one = json.dumps({"sweep_budgets": [4], "sweep_topk_caps": [4], "sweep_references": [],
                      "sweep_temperatures": [0.0], "sweep_max_tokens": 8, "sweep_results_root": str(tmp_path)})
    before = budget("sandbox2")
    with Traffic() as traffic:
        play = deploy("--limit", "sandbox2", "-e", one, playbook="playbooks/sweep.yml", fleet=True)
    assert play.rc == 0, play.out[-4000:]
    order = [m.group(1) for m in re.finditer(r"TASK \[(Take the host out|Put the restored host back)", play.out)]
    assert order == ["Take the host out", "Put the restored host back"], order
    assert "changed: [sandbox2 -> gateway" in play.out                          # it was in the pool, and left it
    assert traffic.failures == [] and traffic.ok > 10, (traffic.ok, traffic.failures[:5])
    assert budget("sandbox2") == before and ready(SERVERS["sandbox2"][1])


def test_a_second_roll_fails_fast_while_the_fleet_lock_is_held(fleet, tmp_path):
    # a roll of another controller holds the fleet lock (its holder started as try_lock starts one); its TTL
    # outlasts this play however slow the machine (the play's input check of every host runs first: 87-150 s
    # on CI, which outran the 8 s TTL this test once had); the finally below ends it by removing its token
    lock = "/run/k26-fleet"
    guest(f"exec 9>>{lock}/lock; flock -n 9 || exit 75; : > {lock}/token.beef; "
          f"echo 'beef other-operator@elsewhere controller-pid 1 since now ttl 900' > {lock}/holder; "
          f"setsid bash -c 'end=$((SECONDS + 900)); while [ -e {lock}/token.beef ] && [ $SECONDS -lt $end ]; "
          f"do sleep 1 9>&-; done' </dev/null >/dev/null 2>&1 &", host="k26-gateway")
    try:
        play = deploy("-e", "k26_ddtree_budget=8", fleet=True)
        assert play.rc != 0 and f"another play holds {lock}/lock" in play.out and "other-operator@elsewhere" in play.out
        assert "Take the host deploy lock" not in play.out and budget("sandbox") != 8 and budget("sandbox2") != 8
    finally:
        guest(f"rm -f {lock}/token.beef", host="k26-gateway")
    wait_until(fleet_lock_free, 15, "the other roll's lock gone")


def test_maintenance_takes_the_fleet_lock_for_its_host_and_fails_fast_while_a_roll_holds_it(fleet, tmp_path):
    """Issue 48: every playbook that drains a host takes the fleet lock for that host's turn, so a maintenance
    restart while another controller's roll holds it is refused before the host leaves the pool (nothing
    restarted); once the roll is gone the same restart runs and frees the lock again."""
    lock = "/run/k26-fleet"
    pid = guest("systemctl show -p MainPID --value k26-ddtree", host="k26-sandbox-2").stdout.strip()
    guest(f"exec 9>>{lock}/lock; flock -n 9 || exit 75; : > {lock}/token.cafe; "
          f"echo 'cafe other-operator@elsewhere controller-pid 1 since now ttl 900' > {lock}/holder; "
          f"setsid bash -c 'end=$((SECONDS + 900)); while [ -e {lock}/token.cafe ] && [ $SECONDS -lt $end ]; "
          f"do sleep 1 9>&-; done' </dev/null >/dev/null 2>&1 &", host="k26-gateway")
    try:
        refused = deploy("--limit", "sandbox2", "-e", "maintenance_action=restart", playbook="playbooks/maintenance.yml",
                         fleet=True, tmp=tmp_path / "refused")
        assert refused.rc != 0 and f"another play holds {lock}/lock" in refused.out, refused.out[-4000:]
        assert "TASK [Take the host out" not in refused.out.split("Take the fleet lock for this host's turn", 1)[-1]
        assert guest("systemctl show -p MainPID --value k26-ddtree", host="k26-sandbox-2").stdout.strip() == pid
        assert ready(SERVERS["sandbox2"][1])
    finally:
        guest(f"rm -f {lock}/token.cafe", host="k26-gateway")
    wait_until(fleet_lock_free, 15, "the other roll's lock gone")
    with Traffic() as traffic:
        done = deploy("--limit", "sandbox2", "-e", "maintenance_action=restart", playbook="playbooks/maintenance.yml",
                      fleet=True, tmp=tmp_path / "done")
    assert done.rc == 0, done.out[-4000:]
    assert guest("systemctl show -p MainPID --value k26-ddtree", host="k26-sandbox-2").stdout.strip() != pid
    assert traffic.failures == [] and fleet_lock_free() and ready(SERVERS["sandbox2"][1])


def test_a_run_whose_fleet_lock_ended_under_it_stops_before_its_restart(fleet, tmp_path):
    """Issue 48: the holder re-checks the fleet lock beside its host lock before a restart or a promotion; a fleet lock
    that ended under the run (here its token removed during the run's wait, as a takeover does) stops it, naming the
    lock and what it would have done, and both locks end free; a held one lets it go on."""
    held = deploy("--limit", "sandbox2", "-e", "lock_wait=0", playbook="tests/infra/plays/lock_check.yml", fleet=True,
                  tmp=tmp_path / "held")
    assert held.rc == 0, held.out[-3000:]
    assert ("host_lock : Check that this run still holds the lock", "sandbox2") in run_on_gateway(held.out)
    assert fleet_lock_free()
    lost = deploy("--limit", "sandbox2", "-e", "lock_drop=fleet", playbook="tests/infra/plays/lock_check.yml",
                  fleet=True, tmp=tmp_path / "lost")
    said = re.sub(r"\s+", " ", lost.out)
    assert lost.rc != 0 and "sandbox2: this run no longer holds the lock /run/k26-fleet" in said, said[-3000:]
    assert "stops before it restarts the test's service" in said
    assert fleet_lock_free()
    assert guest("flock -n /run/k26-deploy/lock true", host="k26-sandbox-2", check=False).returncode == 0


@pytest.mark.extended     # make test's time: the plays' serial and max_fail_percentage are held by tests/ansible/test_static.py
def test_a_first_host_that_fails_stops_the_roll_before_the_second(fleet, tmp_path):
    before = {name: budget(name) for name in SERVERS}
    pid_2 = guest("systemctl show -p MainPID --value k26-ddtree", host="k26-sandbox-2").stdout.strip()
    extra = tmp_path / "first-host-fails.yml"
    extra.write_text("k26_ddtree_budget: 30\n"
                     "k26_smoke_max_tokens: \"{{ 4096 if inventory_hostname == 'sandbox' else 32 }}\"\n")
    with Traffic() as traffic:
        play = deploy("-e", f"@{extra}", fleet=True)
    assert play.rc != 0 and "deploy of sandbox failed at" in re.sub(r"\s+", " ", play.out)
    roll = play.out.split("PLAY [Deploy k26-ddtree]", 1)[-1]     # after the input check of every host
    assert "[sandbox2]" not in roll and "sandbox2 ->" not in roll          # never reached
    assert {name: budget(name) for name in SERVERS} == before
    assert guest("systemctl show -p MainPID --value k26-ddtree", host="k26-sandbox-2").stdout.strip() == pid_2
    assert traffic.failures == [] and all(ready(url) for _, url in SERVERS.values()) and fleet_lock_free()


@pytest.mark.extended
def test_a_rollback_takes_its_host_out_of_the_pool_and_puts_it_back(fleet, tmp_path):
    repo = tmp_path / "snapshots"
    snap = deploy("--limit", "sandbox2", "-e", f"k26_snapshot_repo={repo}", "-e", "snapshot_tag=fleet-base",
                  playbook="snapshot.yml", fleet=True)
    assert snap.rc == 0, snap.out[-4000:]
    before = budget("sandbox2")
    with Traffic() as traffic:
        play = deploy("--limit", "sandbox2", "-e", f"k26_snapshot_repo={repo}", "-e", "snapshot_tag=fleet-base",
                      playbook="playbooks/rollback.yml", fleet=True)
    assert play.rc == 0, play.out[-4000:]
    order = [m.group(1) for m in re.finditer(r"TASK \[(Take the host out|Restore the snapshot's files|Put the host back)",
                                             play.out)]
    assert order == ["Take the host out", "Restore the snapshot's files", "Put the host back"], order
    assert "changed: [sandbox2 -> gateway" in play.out                          # it was in the pool, and left it
    assert traffic.failures == [] and traffic.ok > 10, (traffic.ok, traffic.failures[:5])
    assert budget("sandbox2") == before and ready(SERVERS["sandbox2"][1])


def test_a_host_that_fails_its_checks_releases_the_fleet_lock_and_changes_nothing(fleet, tmp_path):
    """A preflight failure on the host (a model folder without config.json passes the input rules and
    fails on the host) ends the roll with the fleet lock released, before any change (issue 29)."""
    before = {name: budget(name) for name in SERVERS}
    pid = guest("systemctl show -p MainPID --value k26-ddtree").stdout.strip()
    play = deploy("-e", "k26_ddtree_budget=30", "-e", "k26_model_path=/srv/models/none/target", fleet=True)
    text = re.sub(r"\s+", " ", play.out)
    assert play.rc != 0 and "sandbox failed" in text and "before any change" in text, text[-3000:]
    assert "the fleet lock was released" in text and "Take the host out of the gateway's pool" not in play.out
    assert fleet_lock_free() and {name: budget(name) for name in SERVERS} == before
    assert guest("systemctl show -p MainPID --value k26-ddtree").stdout.strip() == pid


def test_an_unreachable_host_stops_the_roll_before_any_change_and_frees_the_fleet_lock(fleet, tmp_path):
    """sandbox2 pointed at a port nothing answers on: the gateway play names it, releases the fleet
    lock, and no k26 host is touched (issue 29)."""
    overlay = tmp_path / "unreachable.yml"
    overlay.write_text("k26:\n  hosts:\n    sandbox2:\n      ansible_host: 127.0.0.1\n      ansible_port: 9\n")
    before = {name: budget(name) for name in SERVERS}
    play = deploy("-i", "inventory/sandbox", "-i", str(overlay), "-e", "k26_ddtree_budget=30", fleet=True)
    text = re.sub(r"\s+", " ", play.out)
    assert play.rc != 0 and "cannot reach sandbox2" in text, text[-3000:]
    assert "Take the host deploy lock" not in play.out and "Check the host and the settings" not in play.out
    assert fleet_lock_free() and {name: budget(name) for name in SERVERS} == before
    assert all(ready(url) for _, url in SERVERS.values())


@pytest.mark.extended
def test_a_key_rotation_behind_the_gateway_fails_no_request_and_restarts_no_gateway(fleet):
    """The README's rotation, the gateway listing the next key ahead: (1) every host takes the new
    key and still the old one, host by host, while clients send the old key; (2) clients move to the
    new key; (3) the old key is retired host by host. No request fails, the gateway keeps its
    process, and afterwards the old key is refused through the gateway."""
    pid = gateway_pid()
    try:
        with Traffic(key=API_KEY) as old_clients:
            both = deploy("-e", f"k26_api_key={NEXT_KEY}", "-e", f"k26_api_key_previous={API_KEY}", fleet=True)
        assert both.rc == 0, both.out[-5000:]
        assert old_clients.failures == [] and old_clients.ok > 20, (old_clients.ok, old_clients.failures[:5])
        assert through_gateway(NEXT_KEY) == 200 and through_gateway(API_KEY) == 200
        with Traffic(key=NEXT_KEY) as new_clients:
            retired = deploy("-e", f"k26_api_key={NEXT_KEY}", fleet=True)
        assert retired.rc == 0, retired.out[-5000:]
        assert new_clients.failures == [] and new_clients.ok > 20, (new_clients.ok, new_clients.failures[:5])
        assert through_gateway(NEXT_KEY) == 200 and through_gateway(API_KEY) == 401
        assert gateway_pid() == pid, "the gateway was restarted by the rotation"
        assert NEXT_KEY not in both.out + retired.out and API_KEY not in both.out + retired.out
        assert all(ready(url) for _, url in SERVERS.values()) and fleet_lock_free()
    finally:
        back = deploy(fleet=True)                   # the inventory's key again, for the tests after this one
        assert back.rc == 0, back.out[-5000:]


@pytest.mark.extended
def test_a_host_lost_mid_roll_is_reported_out_and_the_next_roll_puts_it_back(fleet, tmp_path):
    """The second host's SSH sessions die while it waits for its restarted server: Ansible calls it
    unreachable and ends the run with no rescue and no always (it does for any host lost mid-roll).
    What that leaves, and what heals it: the gateway's pool names the host as out and who took it out;
    the next roll from this controller takes the dead run's fleet lock over and puts the host back;
    clients never see a failed request."""
    from .crash.harness import PLUGINS

    drop = ("bash -c \"K26_SANDBOX_HOST=k26-sandbox-2 tools/sandbox.sh exec pkill -KILL -f '^sshd: root@'; true\"")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_HOME": str(tmp_path / "home"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_CALLBACK_PLUGINS": str(PLUGINS),
           "ANSIBLE_CALLBACKS_ENABLED": "k26_crash", "K26_CRASH_MODE": "ssh-drop", "K26_CRASH_DROP_CMD": drop,
           "K26_CRASH_AT_NAME": "Send smoke chat completions", "K26_CRASH_AT_NAME_NTH": "2"}
    new = 20 if budget("sandbox") != 20 else 16
    with Traffic() as traffic:
        lost = subprocess.run([str(BIN / "ansible-playbook"), "deploy.yml", "-e", f"k26_ddtree_budget={new}",
                               "-e", "k26_monitoring=false"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=1800)
        assert lost.returncode != 0 and "UNREACHABLE" in lost.stdout, lost.stdout[-3000:]
        out = {w["url"]: w for w in pool_with_record() if w["status"] == "out"}
        assert SERVERS["sandbox2"][1] in out and "Deploy k26-ddtree by " in out[SERVERS["sandbox2"][1]]["reason"], out
        assert not fleet_lock_free()                             # the dead run's: the next roll takes it over
        healed = deploy("-e", f"k26_ddtree_budget={new}", fleet=True)
    assert healed.rc == 0, healed.out[-4000:]
    said = re.sub(r"\s+", " ", healed.out)                  # the YAML callback folds long messages
    assert re.search(r"is out of the pool: Deploy k26-ddtree by \S+ at \S+, not put back since", said), said[-4000:]
    assert {name: budget(name) for name in SERVERS} == {"sandbox": new, "sandbox2": new}
    assert all(ready(url) for _, url in SERVERS.values()) and fleet_lock_free()
    assert not [w for w in pool_with_record() if w["status"] == "out"]
    assert traffic.failures == [] and traffic.ok > 20, (traffic.ok, traffic.failures[:5])


def pool_with_record() -> list[dict]:
    r = guest(f"{TOOL} pool --config /etc/k26-gateway/gateway.yaml --record /opt/k26-gateway/state/out status",
              host="k26-gateway", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else []


@pytest.mark.extended
def test_a_gateway_folder_of_another_program_is_refused_before_the_gateway_changes(fleet, tmp_path):
    """Issue 48: the gateway role's folders are judged like a server host's (new, or the project's by owner and
    contents): another program's folder named as k26_gateway_prefix is refused on the gateway host before anything
    is installed there, naming it; the gateway keeps serving, its unit unchanged, the fleet lock free."""
    guest("mkdir -p /srv/otherapp && touch /srv/otherapp/data.db && chown -R nobody /srv/otherapp", host="k26-gateway")
    unit = guest("sha256sum /etc/systemd/system/k26-gateway.service", host="k26-gateway").stdout
    pid = guest("systemctl show -p MainPID --value k26-gateway", host="k26-gateway").stdout.strip()
    try:
        play = deploy("-e", "k26_gateway_prefix=/srv/otherapp", fleet=True, tmp=tmp_path)
        text = re.sub(r"\s+", " ", play.out)
        assert play.rc != 0 and ("k26_gateway_prefix=/srv/otherapp is a folder of this host that is not the project's "
                                 "(owner nobody, 1 entry: data.db)") in text, text[-3000:]
        assert "Create the installation and configuration folders" not in play.out        # the install never began
        assert guest("stat -c %U /srv/otherapp", host="k26-gateway").stdout.strip() == "nobody"
        assert guest("sha256sum /etc/systemd/system/k26-gateway.service", host="k26-gateway").stdout == unit
        assert guest("systemctl show -p MainPID --value k26-gateway", host="k26-gateway").stdout.strip() == pid
        assert fleet_lock_free() and all(ready(url) for _, url in SERVERS.values())
    finally:
        guest("rm -rf /srv/otherapp", host="k26-gateway")

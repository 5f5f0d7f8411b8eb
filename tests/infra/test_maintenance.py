"""playbooks/maintenance.yml on the sandbox host (issue 47, item 5): a hand restart / stop / start under the host
lock (so the availability alerts stay silent: tests/monitoring's rules hold every one `unless k26_maintenance`), the
same fail-fast health wait as a deploy, the lock released after."""

from __future__ import annotations

import re

from .conftest import deploy, guest


def main_pid() -> str:
    return guest("systemctl show -p MainPID --value k26-ddtree").stdout.strip()


def lock_free() -> bool:
    return guest("flock -n /run/k26-deploy/lock true", check=False).returncode == 0


def maintenance(action: str, tmp):
    return deploy("-e", f"maintenance_action={action}", tmp=tmp, playbook="playbooks/maintenance.yml")


def test_a_bad_action_is_refused_before_anything(converged, tmp_path):
    before = main_pid()
    play = maintenance("reboot", tmp_path)
    out = re.sub(r"\s+", " ", play.out)
    assert play.rc != 0 and "maintenance_action" in out and "reboot" in out, out[-2000:]
    assert main_pid() == before and lock_free()


def test_restart_under_the_lock_waits_for_health(converged, tmp_path):
    before = main_pid()
    play = maintenance("restart", tmp_path)
    assert play.rc == 0, play.out[-3000:]
    assert "Take the host lock" in play.out and "Release the host lock" in play.out
    assert main_pid() not in ("0", before) and lock_free()
    assert guest("curl -sf -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"


def test_stop_then_start(converged, tmp_path):
    try:
        stopped = maintenance("stop", tmp_path)
        assert stopped.rc == 0, stopped.out[-3000:]
        assert guest("systemctl is-active k26-ddtree", check=False).stdout.strip() == "inactive" and lock_free()
        # the stop's marker: the host's availability alerts stay silent with the lock released (issue 71)
        assert "stopped by playbooks/maintenance.yml" in guest("cat /run/k26-deploy/stopped").stdout
    finally:
        started = maintenance("start", tmp_path)
    assert started.rc == 0, started.out[-3000:]
    assert guest("systemctl is-active k26-ddtree", check=False).stdout.strip() == "active" and lock_free()
    assert guest("test -e /run/k26-deploy/stopped", check=False).returncode != 0

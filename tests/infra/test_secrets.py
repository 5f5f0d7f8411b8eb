"""The API key on the sandbox host: never on a command line, in an environment, a log or a saved
state; rotation replaces it everywhere and a rollback never brings an old one back.

Runs after the other infra tests (conftest orders it last), so the journal and the folders it
searches hold what every deploy, verify, snapshot, rollback, sweep and validation wrote.
"""

from __future__ import annotations

import re

from .conftest import deploy, guest, journal_since_session

API_KEY = "sandbox-demo-key"
NEW_KEY = "rotated-key-7f3a9c21e8d4"
NEXT_KEY = "sandbox-next-demo-key"


def status(key: str) -> str:
    """HTTP status of an authenticated request with `key` (/model_info needs the key)."""
    return guest(f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {key}' "
                 "http://127.0.0.1:30000/model_info").stdout


def test_the_key_is_in_no_process_list_or_command_line(converged):
    pid = guest("systemctl show -p MainPID --value k26-ddtree").stdout.strip()
    listing = guest("runuser -u nobody -- ps -eo pid,args --no-headers").stdout    # an unprivileged user
    assert f"{pid} " in listing and "--config /etc/k26/k26-ddtree.yaml" in listing
    assert API_KEY not in listing
    assert API_KEY not in guest(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    assert API_KEY not in guest(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout          # root sees it: not there
    assert API_KEY not in guest("systemctl show k26-ddtree").stdout


def test_the_key_is_in_no_log_and_no_saved_state(converged):
    journal = journal_since_session()
    assert "k26-ddtree" in journal
    # the rotation test of tests/infra/test_fleet.py ran the fleet's next key as key and as previous key
    for key in (API_KEY, NEXT_KEY):
        assert key not in journal
        found = guest(f"grep -rlF '{key}' /var/lib/k26-rollback /var/lib/k26 /opt/k26 2>/dev/null || true").stdout
        assert found.strip() == "", f"the key was saved in {found}"


def test_key_rotation_then_a_failed_deploy_keeps_the_new_key(converged, tmp_path):
    try:
        rotated = deploy("-e", f"k26_api_key={NEW_KEY}", tmp=tmp_path / "a")
        assert rotated.rc == 0, rotated.out[-3000:]
        assert NEW_KEY not in rotated.out
        assert status(NEW_KEY) == "200" and status(API_KEY) == "401"
        # a deploy with the original key that cannot start is rolled back: the unit returns, the key does not
        failed = deploy("-e", f"k26_api_key={API_KEY}", "-e", '{"k26_extra_args": ["--no-such-flag"]}',
                        "-e", "k26_health_timeout=20", tmp=tmp_path / "b")
        assert failed.rc != 0 and "rolled back" in re.sub(r"\s+", " ", failed.out)
        assert guest("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"
        assert status(API_KEY) == "200" and status(NEW_KEY) == "401"
    finally:
        restored = deploy(tmp=tmp_path / "c")
        assert restored.rc == 0, restored.out[-3000:]
    assert status(API_KEY) == "200"

"""testinfra: what an interrupted playbook leaves is repaired by the next run (issue 29).

A deploy killed after it wrote new files and before its restart handler ran leaves a service that
runs the old files; the next run renders nothing new, and must still restart, so that what it
health-checks and promotes is what the files say. (The sweep's interrupted runs: test_sweep.py.)
"""

from __future__ import annotations

import re

from .conftest import deploy, guest


def main_pid() -> str:
    return guest("systemctl show -p MainPID --value k26-ddtree").stdout.strip()


def test_a_service_older_than_its_files_is_restarted_by_the_next_deploy(converged, tmp_path):
    before = main_pid()
    # what a killed deploy leaves: the env file rewritten after the running process started
    guest("touch /etc/k26/k26-ddtree.env")
    play = deploy(tmp=tmp_path)
    text = re.sub(r"\s+", " ", play.out)
    assert play.rc == 0, text[-3000:]
    assert re.search(r"TASK \[service : Restart a service older than its files[^\]]*\] \*+ changed", text), text[-3000:]
    after = main_pid()
    assert after not in ("", "0", before)
    assert guest("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"

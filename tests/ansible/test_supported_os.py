"""One supported production OS (issue 47, item 1): Debian 12. Preflight's first check refuses any other OS or
release naming the supported one (roles/k26_defaults/filter_plugins/k26_host_os.py k26_os_refusal, read from the
host's /etc/os-release by roles/preflight/tasks/os.yml); the roles' metadata, the production lock's Python and the
README say the same. The sandbox (Debian 12 too) runs the check for real on every deploy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, load_filters

k26_host_os = load_filters("k26_host_os")

DEBIAN_12 = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'
OTHERS = {
    "Ubuntu 24.04": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n',
    "Debian 13": 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nVERSION_ID="13"\nID=debian\n',
    "Debian 11": "PRETTY_NAME='Debian GNU/Linux 11 (bullseye)'\nVERSION_ID='11'\nID=debian\n",
    "Rocky 9 (no PRETTY_NAME)": 'NAME="Rocky Linux"\nVERSION_ID="9.4"\nID="rocky"\nID_LIKE="rhel centos fedora"\n',
    "no fields": "",
}


def test_debian_12_passes():
    assert k26_host_os.k26_os_refusal(DEBIAN_12) == ""
    # this machine and the sandbox run it: preflight passes here (tests/ansible/test_static.py's preflight cases)
    assert k26_host_os.k26_os_refusal(Path("/etc/os-release").read_text()) == ""


@pytest.mark.parametrize("name", OTHERS)
def test_another_os_or_release_is_refused_naming_what_is_supported(name):
    message = k26_host_os.k26_os_refusal(OTHERS[name], "gpu-01")
    assert message.startswith("gpu-01 runs ")
    assert "supports Debian 12 (bookworm) only" in message and "Install Debian 12" in message
    fields = k26_host_os._os_release(OTHERS[name])
    found = fields.get("PRETTY_NAME") or " ".join(filter(None, (fields.get("ID"), fields.get("VERSION_ID"))))
    assert (found or "an OS without /etc/os-release fields") in message


def test_the_os_check_is_preflights_first():
    tasks = yaml.safe_load((ROOT / "roles/preflight/tasks/main.yml").read_text())
    assert tasks[0]["ansible.builtin.import_tasks"] == "os.yml"
    os_tasks = yaml.safe_load((ROOT / "roles/preflight/tasks/os.yml").read_text())
    assert os_tasks[0]["ansible.builtin.slurp"]["src"] == "/etc/os-release"
    assert "k26_os_refusal" in os_tasks[1]["vars"]["__preflight_os_refusal"]


def test_every_role_claims_debian_12_only():
    for meta in sorted((ROOT / "roles").glob("*/meta/main.yml")):
        platforms = yaml.safe_load(meta.read_text())["galaxy_info"]["platforms"]
        assert platforms == [{"name": "Debian", "versions": ["bookworm"]}], meta


def test_the_production_lock_is_for_debian_12s_python():
    first = (ROOT / "requirements/sglang.lock").read_text().splitlines()[0]
    assert first.startswith("# k26-lock: python=3.11 "), first           # Debian 12's python3 is 3.11


def test_the_readme_names_the_supported_os():
    readme = (ROOT / "docs/operations.md").read_text()
    assert "## Supported OS" in readme and k26_host_os.SUPPORTED_OS["name"] in readme


def test_every_play_of_a_gateway_monitor_or_grafana_host_checks_its_os_first():
    """Issue 71: the server hosts' preflight read /etc/os-release, the gateway and monitor hosts never did. Each play
    of deploy.yml that runs on them begins with preflight's os entry point (a monitor or Grafana host that is also a
    server or gateway host was checked in that play)."""
    plays = [p for p in yaml.safe_load((ROOT / "playbooks/deploy.yml").read_text()) if "hosts" in p]
    for play in plays:
        hosts = str(play["hosts"])
        if not any(group in hosts for group in ("k26_gateway", "k26_monitor", "k26_grafana")) or "Verify" in play["name"]:
            continue
        first = play["tasks"][0]
        assert first["ansible.builtin.include_role"] == {"name": "preflight", "tasks_from": "os"}, play["name"]
    checked = [p["name"] for p in plays if p["tasks"][0].get("ansible.builtin.include_role", {}).get("tasks_from") == "os"]
    assert checked == ["Take the fleet lock and deploy the gateway", "Monitor the fleet"]

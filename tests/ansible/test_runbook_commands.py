"""docs/runbook.md against the alert rules and the rendered production example (issue 71, item 4): every paging
alert's runbook_url lands on a section of the runbook; the runbook's commands use the address and port the
production unit binds (read from K26_URL in the env file the unit loads), files the deploy renders, no release path
that is absent after a failed first deploy, and settings as inventory changes rather than one-off `-e` values."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from .conftest import ROOT
from .test_static import exec_flags, render

RUNBOOK = (ROOT / "docs/runbook.md").read_text()
RULES = ROOT / "roles/monitoring/files/k26-alerts.rules.yml"
ENV_FILE = "/etc/k26/k26-ddtree.env"
RENDERED = {ENV_FILE: "env", "/etc/k26/gpu-host.env": None, "/etc/k26/k26-ddtree.yaml": "yaml"}   # the deploy's files
ASKED = {"maintenance_action", "snapshot_tag"}     # what a playbook is asked to do: the only `-e` values


def slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule: lower case, punctuation dropped, spaces to -)."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


ANCHORS = {slug(h) for h in re.findall(r"^#+ (.+)$", RUNBOOK, flags=re.M)}


def paging_alerts() -> list[dict]:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    return [r for r in rules if r["labels"].get("severity") == "page"]


def command_lines() -> list[str]:
    """Every line of every ```bash block of the runbook."""
    blocks = re.findall(r"```bash\n(.*?)```", RUNBOOK, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_every_paging_alert_has_a_runbook_url_to_its_own_section_with_a_command():
    alerts = paging_alerts()
    assert len(alerts) >= 7
    for a in alerts:
        url = a["annotations"].get("runbook_url", "")
        assert url == f"docs/runbook.md#{a['alert'].lower()}", (a["alert"], url)
        anchor = url.split("#", 1)[1]
        assert anchor in ANCHORS, f"{a['alert']}: docs/runbook.md has no section #{anchor}"
        section = RUNBOOK.split(f"### {a['alert']}\n", 1)[1].split("\n### ", 1)[0]
        assert "```bash\n" in section, f"{a['alert']}'s section gives no command"
    assert not [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if "alert" in r and r["labels"].get("severity") != "page" and "runbook_url" in r["annotations"]]


def test_the_runbooks_own_links_resolve():
    for target in re.findall(r"\]\(#([^)]+)\)", RUNBOOK):
        assert target in ANCHORS, f"docs/runbook.md links to #{target}, which is no heading"


def test_no_command_names_loopback_a_port_or_the_current_release():
    """The production server binds the host's address (`--host 192.0.2.10` in the example); `/opt/k26/current` does
    not exist until a deploy has passed health and smoke."""
    for line in command_lines():
        assert not re.search(r"127\.0\.0\.1|localhost|:30000\b|/opt/k26/current", line), line


def test_settings_are_inventory_changes_and_playbooks_exist():
    for line in command_lines():
        if not line.startswith("ansible-playbook"):
            continue
        words = shlex.split(line)
        assert words[1:3] == ["-i", "inventory/site"], line
        playbook = next(w for w in words[3:] if w.endswith(".yml"))
        assert (ROOT / playbook).is_file(), line
        values = [words[i + 1] for i, w in enumerate(words) if w == "-e"]
        assert all(v.split("=", 1)[0] in ASKED for v in values), f"a setting given with -e (the next deploy reverts it): {line}"


def test_every_file_a_command_reads_is_one_the_deploy_renders():
    for line in command_lines():
        for path in re.findall(r"/etc/k26/[\w./-]+", line):
            assert path in RENDERED, f"{path} in {line!r} is not a file the deploy writes"


@pytest.fixture(scope="module")
def production(tmp_path_factory, vault_pass):
    return render("production", tmp_path_factory.mktemp("runbook"), vault_pass)


def test_the_address_the_commands_read_is_the_one_the_production_unit_binds(production):
    unit, env = production["k26-gpu-01.service"], production["k26-gpu-01.env"]
    flags = dict(f.split(" ", 1) for f in exec_flags(unit) if " " in f)
    urls = [line.split("=", 1)[1] for line in env.splitlines() if line.startswith("K26_URL=")]
    assert urls == [f"http://{flags['--host']}:{flags['--port']}"] == ["http://192.0.2.10:30000"]
    assert f"EnvironmentFile={ENV_FILE}" in unit.splitlines()
    reads = [line for line in command_lines() if "K26_URL" in line]
    assert len(reads) >= 3
    assert all(f"sed -n 's/^K26_URL=//p' {ENV_FILE}" in line for line in reads), reads


def test_the_nccl_smoke_runs_as_the_unit_does(production):
    """Its user and env files are the unit's, its python the venv the unit starts."""
    unit = production["k26-gpu-01.service"].splitlines()
    smoke = next(line for line in command_lines() if "nccl_smoke" in line)
    user = next(line.split("=", 1)[1] for line in unit if line.startswith("User="))
    assert f"--uid={user}" in smoke
    env_files = [line.split("=", 1)[1] for line in unit if line.startswith("EnvironmentFile=")]
    assert [f"EnvironmentFile={f}" for f in env_files] == re.findall(r"EnvironmentFile=\S+", smoke)
    assert any("systemctl show k26-ddtree -p ExecStart" in line for line in command_lines())

"""The alert rules (roles/monitoring/files/k26-alerts.rules.yml) with Debian 12's promtool (`make
promtool` unpacks it into the cache; make test sets K26_PROMTOOL): they load, and every alert fires
where it must and not where it must not (tests/monitoring/k26-alerts.test.yml)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RULES = ROOT / "roles/monitoring/files/k26-alerts.rules.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    tool = os.environ.get("K26_PROMTOOL", "")
    if not tool or not Path(tool).exists():
        pytest.skip("K26_PROMTOOL is not set: `make promtool` unpacks Debian's, make test sets it")
    return tool


def test_the_rules_load(promtool):
    r = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_alert_fires_where_it_must_and_nowhere_else(promtool):
    r = subprocess.run([promtool, "test", "rules", "k26-alerts.test.yml"], cwd=HERE, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_every_alert_has_a_test_and_says_what_to_do():
    alerts = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]
    tested = {t["alertname"] for case in yaml.safe_load((HERE / "k26-alerts.test.yml").read_text())["tests"]
              for t in case.get("alert_rule_test", [])}
    assert {a["alert"] for a in alerts} == tested
    for a in alerts:
        assert a["annotations"]["summary"] and len(a["annotations"]["description"]) > 60, a["alert"]


def test_every_alerts_runbook_pointer_resolves():
    """Each alert names its runbook: the README section that exists and whose table has the alert's row; a
    description that points to the README names a section that exists (issue 47: two pointed to "Operations")."""
    readme = (ROOT / "README.md").read_text()
    headings = {h.strip(): readme.index(h) for h in re.findall(r"^## (.+)$", readme, flags=re.M)}
    alerts = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]
    for a in alerts:
        target = re.fullmatch(r"README\.md#([a-z0-9-]+) \((\w+)\)", a["annotations"]["runbook"])
        assert target and target.group(2) == a["alert"], a["annotations"]["runbook"]
        section = next(h for h in headings if re.sub(r"[^a-z0-9]+", "-", h.lower()).strip("-") == target.group(1))
        body = readme[headings[section]:].split("\n## ", 1)[0]
        assert f"`{a['alert']}`" in body, f"{a['alert']} has no row in the README's {section}"
        for named in re.findall(r"\(README, ([^)]+)\)", a["annotations"]["description"]):
            assert named in headings, f"{a['alert']} points to README section {named!r}, which does not exist"

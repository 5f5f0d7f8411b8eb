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
    """Each alert names its runbook: the docs/monitoring.md section that exists and whose table has the alert's row;
    a description that points to it names a section that exists (issue 47: two pointed to "Operations")."""
    readme = (ROOT / "docs/monitoring.md").read_text()
    headings = {h.strip(): readme.index(h) for h in re.findall(r"^#{1,2} (.+)$", readme, flags=re.M)}
    alerts = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]
    for a in alerts:
        target = re.fullmatch(r"docs/monitoring\.md#([a-z0-9-]+) \((\w+)\)", a["annotations"]["runbook"])
        assert target and target.group(2) == a["alert"], a["annotations"]["runbook"]
        section = next(h for h in headings if re.sub(r"[^a-z0-9]+", "-", h.lower()).strip("-") == target.group(1))
        body = readme[headings[section]:] if readme.startswith(f"# {section}") else \
            readme[headings[section]:].split("\n## ", 1)[0]
        assert f"`{a['alert']}`" in body, f"{a['alert']} has no row in docs/monitoring.md's {section}"
        for named in re.findall(r"\(docs/monitoring\.md, ([^)]+)\)", a["annotations"]["description"]):
            assert named in headings, f"{a['alert']} points to docs/monitoring.md section {named!r}, which does not exist"


def _alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def _seconds(duration: str) -> int:
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[unit] for n, unit in re.findall(r"(\d+)([hms])", duration))


def test_every_alert_with_a_for_is_tested_still_pending_inside_it():
    """Issue 49: beside its firing case, an alert with `for:` has an earlier evaluation in the same case, less than
    its `for` (and a scrape's slack) before, that expects fewer of its alerts (pending, not yet firing)."""
    cases = yaml.safe_load((HERE / "k26-alerts.test.yml").read_text())["tests"]
    for alert in (a for a in _alerts() if "for" in a):
        pending = False
        for case in cases:
            evals = [(_seconds(t["eval_time"]), {frozenset(e["exp_labels"].items()) for e in t["exp_alerts"]})
                     for t in case.get("alert_rule_test", []) if t["alertname"] == alert["alert"]]
            pending |= any(0 < late - early < _seconds(alert["for"]) + 600 and before < after
                           for early, before in evals for late, after in evals)
        assert pending, f"{alert['alert']} (for {alert['for']}) has no test that expects it still pending"


def test_every_threshold_a_rule_reads_is_written_and_raises_its_own_alert_when_missing():
    """Issue 49: a rule that joins a threshold series goes silent without it, so each threshold name a rule reads
    is one the monitoring role writes on every host, has a clause of K26AlertThresholdMissing, and is expected
    missing by name in the promtool tests."""
    rules = RULES.read_text()
    missing = next(a for a in _alerts() if a["alert"] == "K26AlertThresholdMissing")["expr"]
    read = {name for a in _alerts() if a["alert"] != "K26AlertThresholdMissing"
            for name in re.findall(r'k26_alert_threshold\{name="(\w+)"\}', a["expr"])}
    clauses = set(re.findall(r'"name", "(\w+)", "", ""\) unless on\(host, name\) k26_alert_threshold > 0', missing))
    written = set(yaml.safe_load((ROOT / "roles/monitoring/vars/main.yml").read_text())
                  ["_monitoring_collector_config"]["thresholds"])
    tested = {t["exp_labels"]["name"] for case in yaml.safe_load((HERE / "k26-alerts.test.yml").read_text())["tests"]
              for e in case.get("alert_rule_test", []) if e["alertname"] == "K26AlertThresholdMissing"
              for t in e["exp_alerts"]}
    assert read and read == clauses == written == tested, (read, clauses, written, tested)
    assert len(re.findall(r"unless on\(host, name\)", missing)) == len(clauses) and "k26_alert_threshold" in rules


def test_the_tests_catch_a_rule_broken_on_purpose(promtool, tmp_path):
    """The promtool tests bite: the rules with one threshold's missing-clause dropped, or a down gateway no longer
    alerted (the job matcher narrowed), each fail them, naming the alert."""
    text = RULES.read_text()
    clause = next(line for line in text.splitlines() if '"name", "kv_usage_max"' in line)
    broken = {"K26AlertThresholdMissing": text.replace(clause + "\n", ""),
              "K26TargetDown": text.replace('up{job!="k26-server"} == 0', 'up{job=~"k26-node|k26-monitor"} == 0')}
    for alert, rules in broken.items():
        assert rules != text
        folder = tmp_path / alert
        (folder / "roles/monitoring/files").mkdir(parents=True)
        (folder / "roles/monitoring/files/k26-alerts.rules.yml").write_text(rules)
        (folder / "tests/monitoring").mkdir(parents=True)
        (folder / "tests/monitoring/k26-alerts.test.yml").write_text((HERE / "k26-alerts.test.yml").read_text())
        r = subprocess.run([promtool, "test", "rules", "k26-alerts.test.yml"], cwd=folder / "tests/monitoring",
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and f"alertname: {alert}" in r.stdout + r.stderr, (alert, r.stdout[-2000:])

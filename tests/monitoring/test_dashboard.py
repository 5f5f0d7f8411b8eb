"""The Grafana dashboard (roles/monitoring/files/k26-dashboard.json, issue 49): every panel's query names only
metrics the alert rules read or record (the node exporter's, Prometheus's `up` and `ALERTS`), the k26 textfile
collector writes, or SGLang 0.5.23 exports (the README's list, which tests/sglang/test_metric_names.py checks against the
pinned package); the panels an operator looks at first are there, per host."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "roles/monitoring/files/k26-dashboard.json"
RULES = ROOT / "roles/monitoring/files/k26-alerts.rules.yml"
# PromQL's words that are not metric names (functions, aggregations, modifiers, keywords)
WORDS = {"sum", "avg", "max", "min", "count", "rate", "irate", "increase", "histogram_quantile", "by", "without",
         "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "abs", "time", "timestamp", "vector",
         "label_replace", "avg_over_time", "max_over_time", "min_over_time", "offset", "bool", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: strings, label matchers, ranges and grouping lists taken out first."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set(re.findall(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:]*\s*\()", text))
    return {n for n in names if n.lower() not in WORDS and not re.fullmatch(r"\d+(e\d+)?", n)}


def sglang_exports() -> set[str]:
    readme = (ROOT / "docs/monitoring.md").read_text()
    section = readme.split("**SGLang 0.5.23's metrics the rules and the dashboard read**", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`(sglang:[a-z_:]+)`", section))


def rules_names() -> set[str]:
    names = {"ALERTS"}                       # Prometheus writes it for the rules' alerts
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            names |= metric_names(rule["expr"]) | ({rule["record"]} if "record" in rule else set())
    return names


def collector_names() -> set[str]:
    """The metric names the k26 textfile collector writes (its source's literal k26_* names)."""
    text = (ROOT / "roles/monitoring/files/k26_textfile_metrics.py").read_text()
    return set(re.findall(r'"(k26_[a-z_]+)"', text))


def panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def base(name: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", name)


def test_the_name_reader_reads_promql():
    assert metric_names('histogram_quantile(0.95, sum by (host, le) (rate(sglang:x_seconds_bucket{host=~"a"}[5m])))') \
        == {"sglang:x_seconds_bucket"}
    assert metric_names('up{job!="k26-server"} == 0 unless on(host) k26_maintenance == 1') == {"up", "k26_maintenance"}


def unknown(dashboard_panels: list[dict], known: set[str]) -> list[tuple[str, set[str]]]:
    """(panel title, names neither known nor a histogram part of a known name) for each query that reads any."""
    out = []
    for p in dashboard_panels:
        for t in p["targets"]:
            names = metric_names(t["expr"])
            bad = {n for n in names if n not in known and base(n) not in known} if names else {"<no metric>"}
            out += [(p["title"], bad)] if bad else []
    return out


def test_every_panel_query_names_a_metric_the_rules_the_collector_or_sglang_export():
    known = rules_names() | sglang_exports() | collector_names()
    assert "sglang:time_to_first_token_seconds" in known and "k26_gpu_power_watts" in known
    assert all(p["targets"] for p in panels())
    assert unknown(panels(), known) == []
    # a misspelt name in one panel is found, by panel
    broken = json.loads(json.dumps(panels()))
    broken[3]["targets"][0]["expr"] = broken[3]["targets"][0]["expr"].replace("time_to_first_token", "time_to_first_tokens")
    assert unknown(broken, known) == [(broken[3]["title"], {"sglang:time_to_first_tokens_seconds_bucket"})]


def test_the_first_panels_an_operator_needs_are_there_per_host():
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels()}
    wanted = {"sglang:generation_tokens_total", "sglang:spec_accept_length", "sglang:time_to_first_token_seconds_bucket",
              "sglang:num_queue_reqs", "sglang:token_usage", "k26_gpu_temperature_celsius", "k26_gpu_power_watts"}
    read = set().union(*(metric_names(e) for e in exprs.values()))
    assert wanted <= read, wanted - read
    for title, expr in exprs.items():          # every query follows the host picker
        assert '$host' in expr, title
    dash = json.loads(DASHBOARD.read_text())
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "host"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "k26-ddtree"

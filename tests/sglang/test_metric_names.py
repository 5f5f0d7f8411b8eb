"""docs/monitoring.md's list of SGLang 0.5.23's metrics that the alert rules and the dashboard read (issue 49), checked
against the pinned package's own metric definitions (this lane runs in the pinned SGLang's venv)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def defined() -> dict[str, str]:
    """name -> kind (Counter, Gauge, Histogram) of every metric SGLang's observability modules define."""
    out = {}
    for module in ("sglang.srt.observability.metrics_collector", "sglang.srt.observability.http_request_metrics"):
        text = Path(importlib.util.find_spec(module).origin).read_text()
        for kind, name in re.findall(r"\b(Counter|Gauge|Histogram)\(\s*name=\"(sglang:[a-z_]+)\"", text):
            out[name] = kind
    return out


def listed() -> set[str]:
    readme = (ROOT / "docs/monitoring.md").read_text()
    section = readme.split("**SGLang 0.5.23's metrics the rules and the dashboard read**", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`(sglang:[a-z_:]+)`", section))


def test_every_listed_metric_is_one_the_pinned_sglang_defines():
    found = defined()
    assert len(found) > 50, "the reader found too few of SGLang's metrics: its source changed shape"
    names = listed()
    assert "sglang:time_to_first_token_seconds" in names and "sglang:http_responses_total" in names
    missing = names - set(found)
    assert not missing, f"docs/monitoring.md lists metrics SGLang 0.5.23 does not define: {missing}"
    assert found["sglang:time_to_first_token_seconds"] == "Histogram" and found["sglang:token_usage"] == "Gauge"


def test_every_sglang_metric_the_rules_read_is_listed():
    rules = yaml.safe_load((ROOT / "roles/monitoring/files/k26-alerts.rules.yml").read_text())
    exprs = " ".join(rule["expr"] for group in rules["groups"] for rule in group["rules"])
    read = {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"(sglang:[a-z_]+)", exprs)}
    assert read <= listed(), read - listed()

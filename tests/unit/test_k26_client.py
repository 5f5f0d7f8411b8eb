"""roles/verify/files/k26_client.py's latency percentiles (issue 49): the sweep's TTFT and inter-token bounds
come from the server's own histograms, read as Prometheus reads them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("k26_client", ROOT / "roles/verify/files/k26_client.py")
client = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client)

INF = float("inf")


def test_the_quantile_is_prometheuss_histogram_quantile():
    # the values Prometheus itself rendered for the same buckets (tests/monitoring/k26-alerts.test.yml: "4.8s",
    # "192.5ms"): linear inside the bucket the rank falls in, the first bucket from 0
    assert client.quantile(0.95, {1.0: 0, 5.0: 10, INF: 10}) == 4.8
    assert round(client.quantile(0.95, {0.05: 0, 0.2: 100, INF: 100}), 6) == 0.1925
    assert client.quantile(0.5, {1.0: 10, INF: 10}) == 0.5
    assert client.quantile(0.95, {1.0: 1, 2.0: 1, INF: 10}) == 2.0         # in +Inf: the highest finite bound
    assert client.quantile(0.95, {1.0: 0, INF: 0}) is None and client.quantile(0.95, {}) is None


def test_the_load_reads_the_growth_of_each_histogram():
    before = {"sglang:generation_tokens_total": 100.0, "sglang:spec_verify_calls_total": 50.0,
              ("ttft", 1.0): 5.0, ("ttft", 5.0): 5.0, ("ttft", INF): 5.0}
    after = {"sglang:generation_tokens_total": 300.0, "sglang:spec_verify_calls_total": 100.0,
             ("ttft", 1.0): 5.0, ("ttft", 5.0): 15.0, ("ttft", INF): 15.0}
    side = client.server_side(before, after, 2.0)
    assert side == {"server_tokens_per_s": 100.0, "server_accept_length": 4.0, "ttft_p95_s": 4.8, "itl_p95_s": None}

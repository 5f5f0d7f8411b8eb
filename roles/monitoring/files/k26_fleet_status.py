#!/usr/bin/python3
"""One screen of the fleet's state from Prometheus: each k26 host up or down, in the gateway's pool,
its release and speculative settings, tokens/s, accept length, running and waiting requests, GPU
temperatures, and the alerts firing on it.

    k26-fleet-status [--prometheus URL] [--json]

On the monitor host (the monitoring role installs it as /usr/local/bin/k26-fleet-status), or from
the repository on a controller through a tunnel: ssh -fN -L 9090:127.0.0.1:9090 MONITOR_HOST, then
python3 roles/monitoring/files/k26_fleet_status.py.
Standard library only (the monitor host's python3).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field

QUERIES = {
    "up": 'up{job="k26-server"}',
    "info": "k26_service_info",
    "tokens_per_s": 'sum by (host) (rate(sglang:generation_tokens_total[2m]))',
    "accept_length": "max by (host) (sglang:spec_accept_length)",
    "running": "sum by (host) (sglang:num_running_reqs)",
    "queued": "sum by (host) (sglang:num_queue_reqs)",
    "gpu_temperature": "k26_gpu_temperature_celsius",
    "gpu_skipped": "k26_gpu_collector_skipped",
    "expected": "k26_gateway_expected_worker",
    "worker_health": "smg_worker_health",
    "maintenance": "k26_maintenance",
    "alerts": 'ALERTS{alertstate="firing"}',
}


@dataclass
class HostStatus:
    host: str
    up: bool = False
    in_pool: str = "-"                 # yes / no / - (no gateway)
    release: str = ""
    algorithm: str = ""
    budget: str = ""
    topk_cap: str = ""
    cuda_graph: str = ""
    tokens_per_s: float | None = None
    accept_length: float | None = None
    running: float | None = None
    queued: float | None = None
    gpu_temperatures: list[float] = field(default_factory=list)   # by GPU index
    gpus: str = ""                     # "no GPU (reason)" when the collector skipped
    maintenance: bool = False
    alerts: list[str] = field(default_factory=list)


def query(prometheus: str, expr: str) -> list[dict]:
    url = prometheus.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error')}")
    return body["data"]["result"]


def by_host(results: list[dict]) -> dict[str, float]:
    return {r["metric"].get("host", ""): float(r["value"][1]) for r in results}


def build(results: dict[str, list[dict]]) -> list[HostStatus]:
    """The hosts' rows from the queries' results (QUERIES' keys)."""
    hosts = {r["metric"]["host"]: HostStatus(r["metric"]["host"], up=r["value"][1] == "1") for r in results["up"]}
    for r in results["info"]:
        h = hosts.get(r["metric"].get("host"))
        if h:
            for k in ("release", "algorithm", "budget", "topk_cap", "cuda_graph"):
                setattr(h, k, r["metric"].get(k, ""))
    for name in ("tokens_per_s", "accept_length", "running", "queued"):
        for host, v in by_host(results[name]).items():
            if host in hosts:
                setattr(hosts[host], name, v)
    for r in sorted(results["gpu_temperature"], key=lambda r: int(r["metric"].get("gpu", "0"))):
        if r["metric"].get("host") in hosts:
            hosts[r["metric"]["host"]].gpu_temperatures.append(float(r["value"][1]))
    for r in results["gpu_skipped"]:
        if r["metric"].get("host") in hosts and r["value"][1] == "1":
            hosts[r["metric"]["host"]].gpus = f"none ({r['metric'].get('reason', '')})"
    health = {r["metric"]["worker"]: r["value"][1] == "1" for r in results["worker_health"]}
    for r in results["expected"]:
        if r["metric"].get("host") in hosts:
            hosts[r["metric"]["host"]].in_pool = "yes" if health.get(r["metric"]["worker"]) else "no"
    for host, v in by_host(results["maintenance"]).items():
        if host in hosts:
            hosts[host].maintenance = v == 1
    for r in results["alerts"]:
        if r["metric"].get("host") in hosts:
            hosts[r["metric"]["host"]].alerts.append(r["metric"]["alertname"])
    return [hosts[k] for k in sorted(hosts)]


def number(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(rows: list[HostStatus]) -> str:
    head = ["host", "up", "pool", "release", "algorithm", "budget/cap", "graphs", "tok/s", "accept", "run", "queue",
            "GPU °C", "alerts"]
    lines = [head]
    for h in rows:
        state = ("up" if h.up else "DOWN") + (" (maint.)" if h.maintenance else "")
        gpus = h.gpus or ("/".join(f"{t:.0f}" for t in h.gpu_temperatures) if h.gpu_temperatures else "-")
        lines.append([h.host, state, h.in_pool, h.release or "-", h.algorithm or "-",
                      f"{h.budget}/{h.topk_cap}" if h.budget else "-", h.cuda_graph or "-", number(h.tokens_per_s),
                      number(h.accept_length, 2), number(h.running, 0), number(h.queued, 0), gpus,
                      ", ".join(sorted(set(h.alerts))) or "-"])
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus's URL (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="the rows as JSON instead of the table")
    args = ap.parse_args(argv)
    try:
        results = {name: query(args.prometheus, expr) for name, expr in QUERIES.items()}
    except (urllib.error.URLError, OSError, RuntimeError) as err:
        print(f"cannot read Prometheus at {args.prometheus}: {err}; on a controller open a tunnel first "
              "(ssh -L 9090:127.0.0.1:9090 MONITOR_HOST) or give --prometheus", file=sys.stderr)
        return 2
    rows = build(results)
    if not rows:
        print(f"Prometheus at {args.prometheus} knows no k26 server (job k26-server): is this the fleet's monitor?",
              file=sys.stderr)
        return 1
    print(json.dumps([asdict(r) for r in rows], indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""roles/monitoring/files/k26_fleet_status.py's rows and table from Prometheus query results (the live command runs
against the sandbox's Prometheus in tests/infra/test_monitoring.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("k26_fleet_status", ROOT / "roles/monitoring/files/k26_fleet_status.py")
status = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("k26_fleet_status", status)
_spec.loader.exec_module(status)


def r(value, **labels):
    return {"metric": labels, "value": [0, str(value)]}


RESULTS = {
    "up": [r(1, host="gpu1", job="k26-server"), r(0, host="gpu2", job="k26-server")],
    "info": [r(1, host="gpu1", release="20261202T0500Z-ab", algorithm="DDTREE", budget="32", topk_cap="8", cuda_graph="true")],
    "tokens_per_s": [r(812.25, host="gpu1")],
    "accept_length": [r(5.5, host="gpu1")],
    "running": [r(40, host="gpu1")],
    "queued": [r(3, host="gpu1")],
    "gpu_temperature": [r(63, host="gpu1", gpu="1"), r(61, host="gpu1", gpu="0"), r(70, host="gpu1", gpu="10")],
    "gpu_skipped": [r(0, host="gpu1", reason=""), r(1, host="gw", reason="no nvidia-smi on this host")],
    "expected": [r(1, host="gpu1", worker="http://gpu1:30000"), r(1, host="gpu2", worker="http://gpu2:30000")],
    "worker_health": [r(1, worker="http://gpu1:30000")],
    "maintenance": [r(0, host="gpu1"), r(1, host="gpu2")],
    "alerts": [r(1, host="gpu2", alertname="K26ServerDown"), r(1, host="gpu2", alertname="K26GatewayWorkerNotReady"),
               r(1, host="gw", alertname="K26SnapshotDiskFull")],
}


def test_rows_join_every_query_by_host():
    gpu1, gpu2 = status.build(RESULTS)
    assert (gpu1.host, gpu1.up, gpu1.in_pool, gpu1.release, gpu1.budget, gpu1.tokens_per_s, gpu1.accept_length) == \
        ("gpu1", True, "yes", "20261202T0500Z-ab", "32", 812.25, 5.5)
    assert gpu1.gpu_temperatures == [61.0, 63.0, 70.0]             # by GPU index, 10 after 1
    assert (gpu2.up, gpu2.in_pool, gpu2.maintenance, sorted(gpu2.alerts)) == \
        (False, "no", True, ["K26GatewayWorkerNotReady", "K26ServerDown"])
    assert gpu2.tokens_per_s is None and gpu2.algorithm == ""       # a down server exports nothing


def test_the_table_is_one_line_per_host():
    lines = status.table(status.build(RESULTS)).splitlines()
    assert len(lines) == 3 and lines[0].split()[:3] == ["host", "up", "pool"]
    assert lines[1].split()[:7] == ["gpu1", "up", "yes", "20261202T0500Z-ab", "DDTREE", "32/8", "true"]
    assert "812.2" in lines[1] and "61/63/70" in lines[1]
    assert lines[2].split()[:3] == ["gpu2", "DOWN", "(maint.)"] and "K26GatewayWorkerNotReady, K26ServerDown" in lines[2]


def test_an_unreachable_prometheus_is_a_clear_error():
    p = subprocess.run([sys.executable, str(ROOT / "roles/monitoring/files/k26_fleet_status.py"), "--prometheus", "http://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "cannot read Prometheus at http://127.0.0.1:9" in p.stderr and "ssh -L" in p.stderr

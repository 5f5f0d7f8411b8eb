"""tools/sweep_report.py's thresholds.json: the monitoring role's two speculation floors from a sweep."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sweep_report", ROOT / "tools/sweep_report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def row(algorithm, tokens, accept=None, budget=None, cap=None, graphs=True, temperature=0.0, concurrency=4, server=True):
    return {"algorithm": algorithm, "budget": budget, "topk_cap": cap, "cuda_graph": graphs, "temperature": temperature,
            "concurrency": concurrency, "tokens_per_s": tokens * 0.9, "server_tokens_per_s": tokens if server else None,
            "accept_length": accept, "server_accept_length": accept if server else None, "status": "ok", "errors": 0}


ROWS = [row("DDTREE", 400.0, 5.0, 16, 4), row("DDTREE", 520.0, 6.25, 32, 8), row("DDTREE", 900.0, 7.0, 32, 8, graphs=False),
        row("DDTREE", 999.0, 9.0, 64, 8, temperature=0.7), row("DFLASH", 350.0, 4.0), row("NONE", 160.0, 1.0),
        row("NONE", 100.0, 1.0, graphs=False)]


def test_the_floors_come_from_the_best_configuration_and_none_with_the_same_graph_setting():
    t = report.thresholds(report.comparison(ROWS), ROWS)
    # best at temperature 0 is the graphs-off 900 tokens/s row: its accept length, NONE graphs-off per request
    assert t["accept_length_floor"] == round(0.8 * 7.0, 3)
    assert t["tokens_per_s_per_request_floor"] == 25.0
    assert t["from"] == {"budget": 32, "topk_cap": 8, "cuda_graph": False, "accept_length": 7.0, "none_tokens_per_s": 100.0}


def test_the_client_side_numbers_stand_in_when_the_server_did_not_answer():
    rows = [row("DDTREE", 300.0, 4.0, 8, 4, server=False), row("NONE", 120.0, 1.0, server=False)]
    t = report.thresholds(report.comparison(rows), rows)
    assert t["accept_length_floor"] == 3.2 and t["tokens_per_s_per_request_floor"] == round(120.0 * 0.9 / 4, 3)


def test_no_none_row_leaves_the_speed_floor_out_and_no_ddtree_row_gives_nothing():
    rows = [row("DDTREE", 300.0, 4.0, 8, 4)]
    assert "tokens_per_s_per_request_floor" not in report.thresholds(report.comparison(rows), rows)
    assert report.thresholds(report.comparison([row("NONE", 1.0, 1.0)]), [row("NONE", 1.0, 1.0)]) == {}


def test_the_command_writes_thresholds_json_beside_the_results(tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps(ROWS))
    r = subprocess.run([sys.executable, str(ROOT / "tools/sweep_report.py"), str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "thresholds.json").read_text())["accept_length_floor"] == 5.6
    assert {p.name for p in tmp_path.iterdir()} >= {"results.csv", "results.md", "plot.png", "thresholds.json"}

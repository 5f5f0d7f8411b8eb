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


def test_the_latency_bounds_are_the_best_configurations_worst_load_with_a_margin():
    """Issue 49: the TTFT and inter-token bounds of the alerts: 1.5 x the highest 95th percentile the best
    configuration measured at any load (not another configuration's, not a sampled row's); none without histograms."""
    rows = [dict(row("DDTREE", 900.0, 7.0, 32, 8, concurrency=1), ttft_p95_s=0.4, itl_p95_s=0.02),
            dict(row("DDTREE", 800.0, 7.0, 32, 8, concurrency=8), ttft_p95_s=1.2, itl_p95_s=0.03),
            dict(row("DDTREE", 500.0, 5.0, 16, 4, concurrency=8), ttft_p95_s=9.0, itl_p95_s=0.5),
            dict(row("DDTREE", 700.0, 7.0, 32, 8, concurrency=8, temperature=0.7), ttft_p95_s=7.0, itl_p95_s=0.4),
            row("NONE", 160.0, 1.0, concurrency=1)]
    t = report.thresholds(report.comparison(rows), rows)
    assert (t["ttft_p95_seconds_max"], t["itl_p95_seconds_max"]) == (1.8, 0.045)
    assert "ttft_p95_seconds_max" not in report.thresholds(report.comparison(ROWS), ROWS)     # no histograms


def test_the_command_writes_thresholds_json_beside_the_results(tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps(ROWS))
    r = subprocess.run([sys.executable, str(ROOT / "tools/sweep_report.py"), str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "thresholds.json").read_text())["accept_length_floor"] == 5.6
    assert {p.name for p in tmp_path.iterdir()} >= {"results.csv", "results.md", "plot.png", "thresholds.json"}


def grid() -> list[dict]:
    """Three loads: wide trees win alone, narrow ones at 8, and at 32 nothing beats NONE."""
    speeds = {1: {(64, 8): 900.0, (16, 4): 700.0, (8, 4): 600.0},
              8: {(64, 8): 2000.0, (16, 4): 2600.0, (8, 4): 2500.0},
              32: {(64, 8): 3000.0, (16, 4): 4800.0, (8, 4): 5200.0}}
    refs = {1: (300.0, 450.0), 8: (2100.0, 1900.0), 32: (6000.0, 5000.0)}       # NONE, DFLASH
    rows = []
    for c, configs in speeds.items():
        rows += [row("DDTREE", t, 4.0, b, cap, concurrency=c) for (b, cap), t in configs.items()]
        rows += [row("DDTREE", t * 3, 4.0, b, cap, concurrency=c, temperature=0.7) for (b, cap), t in configs.items()]
        rows += [row("DDTREE", t * 5, 4.0, b, cap, concurrency=c, graphs=False) for (b, cap), t in configs.items()]
        rows += [row("NONE", refs[c][0], 1.0, concurrency=c), row("DFLASH", refs[c][1], 3.0, concurrency=c)]
    return rows


def test_the_schedule_takes_the_fastest_width_at_each_load_with_the_graph_setting_of_the_best():
    rows = [r for r in grid() if r["cuda_graph"] is True]
    plan = report.schedule(report.comparison(rows), rows)
    assert (plan["k26_ddtree_budget"], plan["k26_ddtree_topk_cap"]) == ("1:64,8:16,32:8", "1:8,8:4")
    assert [(p["concurrency"], p["reference"], p["vs_reference"]) for p in plan["picks"]] == \
        [(1, "DFLASH", 2.0), (8, "NONE", round(2600 / 2100, 3)), (32, "NONE", round(5200 / 6000, 3))]
    assert plan["loses_at"] == [32]
    # the graphs-off rows are the fastest overall here, so the schedule is theirs
    everything = grid()
    assert report.schedule(report.comparison(everything), everything)["cuda_graph"] is False


def test_one_load_gives_one_value_and_the_command_writes_the_schedule(tmp_path):
    rows = [r for r in grid() if r["concurrency"] == 8 and r["cuda_graph"] is True]
    plan = report.schedule(report.comparison(rows), rows)
    assert (plan["k26_ddtree_budget"], plan["k26_ddtree_topk_cap"]) == ("16", "4")
    (tmp_path / "rows.json").write_text(json.dumps([r for r in grid() if r["cuda_graph"] is True]))
    subprocess.run([sys.executable, str(ROOT / "tools/sweep_report.py"), str(tmp_path)], check=True, capture_output=True)
    written = json.loads((tmp_path / "schedule.json").read_text())
    assert written["k26_ddtree_budget"] == "1:64,8:16,32:8"
    table = (tmp_path / "results.md").read_text()
    assert "budget `1:64,8:16,32:8`, top-k cap `1:8,8:4`" in table and "at concurrency 32" in table


def test_references_are_the_bar_at_their_fastest_overlap_setting_and_the_schedule_keeps_one_overlap_setting(tmp_path):
    """DFLASH with SGLang's overlap scheduler is faster than without: DDTREE is compared with that one. DDTREE's
    picks come from the best row's overlap setting only (one deploy renders one), and schedule.json says which."""
    rows = [{**row("DFLASH", 300.0, 3.0, concurrency=c), "overlap_schedule": "false"} for c in (1, 8)]
    rows += [{**row("DFLASH", 400.0 * c, 3.0, concurrency=c), "overlap_schedule": "auto"} for c in (1, 8)]
    rows += [{**row("DDTREE", 500.0 * c, 4.0, 32, 8, concurrency=c), "overlap_schedule": "auto"} for c in (1, 8)]
    rows += [{**row("DDTREE", 600.0, 4.0, 64, 8, concurrency=1), "overlap_schedule": "true"},
             {**row("DDTREE", 9000.0, 4.0, 8, 4, concurrency=8), "overlap_schedule": "auto"}]
    summary = report.comparison(rows)
    assert summary["best"]["budget"] == 8 and summary["vs_dflash"] == round(9000 / 3200, 3)
    plan = report.schedule(summary, rows)
    assert plan["overlap_schedule"] == "auto" and plan["k26_ddtree_budget"] == "1:32,8:8"   # not the 'true' row at 1
    assert [p["reference_tokens_per_s"] for p in plan["picks"]] == [400.0, 3200.0]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    subprocess.run([sys.executable, str(ROOT / "tools/sweep_report.py"), str(tmp_path)], check=True, capture_output=True)
    assert "overlap scheduler auto" in (tmp_path / "results.md").read_text()
    assert "overlap_schedule" in (tmp_path / "results.csv").read_text().splitlines()[0]
    assert report.overlap(row("NONE", 1.0)) == "auto"          # rows of sweeps before the setting


def test_the_width_policy_is_set_against_the_fastest_other_setting_at_each_load_and_kept_out_of_the_schedule(tmp_path):
    """sweep_width_policy's rows (budget auto): at 1 faster than every width, at 8 2% behind b16 c4 (keeps up, within
    3%), at 32 10% behind NONE (falls behind); the fixed schedule is what it was without them."""
    rows = [r for r in grid() if r["cuda_graph"] is True]
    policy = [row("DDTREE", t, 4.5, "auto", 8, concurrency=c) for c, t in ((1, 950.0), (8, 2548.0), (32, 5400.0))]
    plan = report.schedule(report.comparison(rows + policy), rows + policy)
    assert plan["k26_ddtree_budget"] == "1:64,8:16,32:8"
    assert [(c["concurrency"], c["fastest_other"], c["vs_fastest_other"], c["keeps_up"]) for c in plan["width_policy"]] \
        == [(1, "b64 c8 (overlap auto)", round(950 / 900, 3), True), (8, "b16 c4 (overlap auto)", 0.98, True),
            (32, "NONE (overlap auto)", 0.9, False)]
    (tmp_path / "rows.json").write_text(json.dumps(rows + policy))
    done = subprocess.run([sys.executable, str(ROOT / "tools/sweep_report.py"), str(tmp_path)], check=True,
                          capture_output=True, text=True)
    assert json.loads(done.stdout)["width_policy_behind_at"] == [32]
    table = (tmp_path / "results.md").read_text()
    assert "The width policy falls behind at concurrency 32 (overlap auto, x0.9)" in table
    assert json.loads((tmp_path / "schedule.json").read_text())["k26_ddtree_budget"] == "1:64,8:16,32:8"
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


def test_a_sweep_of_the_width_policy_alone_writes_no_schedule_and_says_where_it_keeps_up(tmp_path):
    rows = [row("NONE", 300.0, 1.0, concurrency=1), row("DFLASH", 450.0, 3.0, concurrency=1),
            row("DDTREE", 460.0, 4.5, "auto", 8, concurrency=1)]
    plan = report.schedule(report.comparison(rows), rows)
    assert "k26_ddtree_budget" not in plan and plan["width_policy"][0]["fastest_other"] == "DFLASH (overlap auto)"
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    done = subprocess.run([sys.executable, str(ROOT / "tools/sweep_report.py"), str(tmp_path)], check=True,
                          capture_output=True, text=True)
    assert json.loads(done.stdout)["schedule"] is None
    assert "keeps up at every load measured: `k26_ddtree_budget: auto` with `k26_ddtree_topk_cap: 8`" in \
        (tmp_path / "results.md").read_text()

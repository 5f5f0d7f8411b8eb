"""bench/sglang_speed.py's decisions, on rows made up here (the GPU run measures the real ones): the mixed prompt
set, the schedule it finds from the fixed budgets' rows, whether the schedule won, and the issue's targets."""

from __future__ import annotations

import pytest

from ddtree.settings import parse_schedule
from tests.helpers import import_bench

speed = import_bench("sglang_speed")


def row(config, algorithm, load, tps, budget=None, overlap=False, accept=None):
    return speed.SpeedRow(config=config, algorithm=algorithm, budget=budget, overlap=overlap, load=load,
                          tokens_per_s=tps, accept_length=accept, tokens_per_step=None, step_ms=None,
                          equal_to_none=None, walls=[1.0, 1.1])


def test_mixed_prompts_alternate_seen_and_heldout_vary_in_length_and_reuse_each_file_in_turn():
    seen = [[1000 + i] * 300 for i in range(3)]
    held = [[2000 + i] * 300 for i in range(10)]
    prompts = speed.mixed_prompts(held, seen, 12)
    assert [p[0] // 1000 for p in prompts] == [1, 2] * 6
    assert [len(p) for p in prompts] == [17 + 15 * i for i in range(12)]
    assert [p[0] % 1000 for p in prompts[::2]] == [0, 1, 2, 0, 1, 2]          # 3 seen prompts, reused in turn
    assert speed.prompts_per_load(1) == 24 and speed.prompts_per_load(48) == 384
    with pytest.raises(ValueError, match="need both kinds.*3 seen and 0 held-out"):
        speed.mixed_prompts([], seen, 4)


def test_switch_points_sit_between_measured_loads():
    assert speed.switch_points((1, 8, 16, 32, 48)) == [1, 3, 12, 23, 40]


def fixed_rows(best_by_load: dict[int, int], overlap=False):
    rows = []
    for load, best in best_by_load.items():
        for b in (8, 16, 32, 64):
            name = f"ddtree-b{b}-c8-graphs{'-overlap' if overlap else ''}-bs48"
            rows.append(row(name, "DDTREE", load, 1000 + (500 if b == best else b), budget=b, overlap=overlap))
    return rows


def test_found_schedule_takes_each_loads_fastest_budget_and_merges_equal_neighbours():
    rows = fixed_rows({1: 64, 8: 32, 16: 32, 32: 8, 48: 8}) + fixed_rows({1: 16, 8: 16, 16: 16, 32: 16, 48: 16}, True)
    found = speed.found_schedule(rows, (1, 8, 16, 32, 48), overlap=False)
    assert str(found) == "1:64,3:32,23:8"
    assert found.at(2) == 64 and found.at(20) == 32 and found.at(48) == 8
    assert str(speed.found_schedule(rows, (1, 8, 16, 32, 48), overlap=True)) == "16"


def test_found_schedule_names_the_missing_rows():
    with pytest.raises(ValueError, match="no fixed-budget DDTREE row at load 8"):
        speed.found_schedule(fixed_rows({1: 64}), (1, 8), overlap=False)


def test_the_schedule_wins_only_where_it_is_at_least_the_best_fixed_budget():
    rows = fixed_rows({1: 64, 8: 32})                # best 1500 at both loads
    rows += [row("ddtree-found", "DDTREE", 1, 1500, budget="1:64,3:32"),
             row("ddtree-found", "DDTREE", 8, 1499, budget="1:64,3:32")]
    assert speed.schedule_wins(rows, "ddtree-found", (1, 8), overlap=False) == {1: True, 8: False}


def test_scheduled_config_serves_the_schedule_with_the_switch_on():
    cfg = speed.scheduled_config(parse_schedule("1:64,12:16", "s"), overlap=True)
    assert cfg.name == "ddtree-found-overlap" and cfg.overlap and cfg.max_bs == 48
    assert ("SGLANG_DDTREE_SCHEDULE", "1") in cfg.env and ("SGLANG_DDTREE_OVERLAP", "1") in cfg.env
    from pathlib import Path
    args = cfg.args(Path("/pair"), 40000)
    assert args[args.index("--speculative-ddtree-budget") + 1] == "1:64,12:16"
    assert "--disable-overlap-schedule" not in args


def test_targets_hold_the_candidate_to_every_load_and_compute_step_efficiency():
    rows = [row("none-bs48", "NONE", 1, 300), row("none-overlap-bs48", "NONE", 1, 320, overlap=True),
            row("dflash-overlap-bs48", "DFLASH", 1, 800, overlap=True, accept=4.2),
            row("ddtree-found-overlap", "DDTREE", 1, 1300, budget="1:64,3:32", overlap=True, accept=5.5),
            row("none-overlap-bs48", "NONE", 8, 2500, overlap=True),
            row("dflash-overlap-bs48", "DFLASH", 8, 2400, overlap=True, accept=4.2),
            row("ddtree-found-overlap", "DDTREE", 8, 2450, budget="1:64,3:32", overlap=True, accept=5.1)]
    found = {t.what: t for t in speed.targets(rows, (1, 8), "ddtree-found-overlap")}
    ratio = found["DDTREE >= 1.5 x DFLASH at 1 request, overlap scheduler on both"]
    assert ratio.met and "1.62x" in ratio.measured
    assert found["ddtree-found-overlap >= max(NONE, DFLASH) at 1 running requests"].met
    at8 = found["ddtree-found-overlap >= max(NONE, DFLASH) at 8 running requests"]
    assert not at8.met and "none-overlap-bs48 2500" in at8.measured
    eff = found["step efficiency tokens/s / (accept length x NONE tokens/s) >= 0.7 at 1 request"]
    assert eff.met is True and "= 0.74" in eff.measured          # 1300 / (5.5 x 320)
    assert "**no**" in speed.target_table(list(found.values()))

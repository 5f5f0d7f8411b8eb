"""ddtree.settings' schedules by running batch size: parsing, lookup and the rules at each step."""

from __future__ import annotations

import pytest

from ddtree.settings import SERVER_FLAGS, DDTreeConfigError, Schedule, WidthSchedule, parse_schedule, schedule_problems


def test_a_plain_value_is_a_one_step_schedule():
    s = parse_schedule("32", "--speculative-ddtree-budget")
    assert s == Schedule(((1, 32),)) and s.at(1) == s.at(48) == 32 and str(s) == "32"
    assert parse_schedule(8, "budget").at(5) == 8


def test_each_batch_size_takes_the_last_step_at_or_below_it():
    s = parse_schedule("1:64,8:32,16:16,32:8", "budget")
    assert [s.at(b) for b in (1, 7, 8, 15, 16, 31, 32, 48)] == [64, 64, 32, 32, 16, 16, 8, 8]
    assert s.values == (8, 16, 32, 64) and str(s) == "1:64,8:32,16:16,32:8"


@pytest.mark.parametrize("text,why", [
    ("8:32", "the first at batch 1"), ("1:64,8:32,8:16", "increasing"), ("1:64,16:32,8:16", "increasing"),
    ("1:0", "0 is outside 1..1023"), ("1:64,8:2048", "2048 is outside 1..1023"), ("1:64;8:32", "expected one integer"),
    ("", "expected one integer"), ("1:64,", "expected one integer"), ("-4", "expected one integer"), ("x:1", "expected one"),
])
def test_a_bad_schedule_names_the_flag_the_value_and_the_rule(text, why):
    with pytest.raises(DDTreeConfigError) as err:
        parse_schedule(text, "--speculative-ddtree-budget")
    shown = text.strip() or "''"
    assert str(err.value).startswith(f"--speculative-ddtree-budget={shown} is invalid") and why in str(err.value)


def test_the_single_value_rules_hold_at_every_step_of_both_schedules():
    budget, cap = parse_schedule("1:64,16:16,32:4", "b"), parse_schedule("1:8,32:8", "c")
    problems = schedule_problems(budget, cap, block_size=8, names=SERVER_FLAGS)
    # at 32 the budget is 4 and the cap 8: cap above budget, and a block of 8 does not fit 4 + 1
    assert len(problems) == 2 and all(p.startswith("from batch size 32: ") for p in problems)
    assert "--speculative-ddtree-topk-cap=8 is invalid" in problems[0] and "block size 8" in problems[1]
    assert schedule_problems(budget, parse_schedule("1:8,32:4", "c"), 8, SERVER_FLAGS) == [
        "from batch size 32: --speculative-ddtree-budget=4 is invalid with block size 8: the draft's block must fit in "
        "the verify window (budget + 1 >= block size); use a budget >= 7 (7 with --speculative-ddtree-topk-cap 1 is "
        "the DFlash chain)"]
    assert schedule_problems(parse_schedule("1:64,32:8", "b"), parse_schedule("1:8,32:4", "c"), 8, SERVER_FLAGS) == []


# --- the one schedule type and the one finder (issue 73, item 2) ------------------------------------------------

def test_the_finder_holds_each_measured_loads_best_from_that_load_and_merges_equal_neighbours():
    found = WidthSchedule.found({8: (32, 8), 1: (64, 8), 16: (32, 8), 32: (7, 1), 48: (7, 1)})
    assert (str(found.budget), str(found.topk_cap)) == ("1:64,8:32,32:7", "1:8,32:1")
    assert [found.at(b) for b in (1, 7, 8, 31, 32, 100)] == [(64, 8), (64, 8), (32, 8), (32, 8), (7, 1), (7, 1)]
    assert found.steps == [(1, (64, 8)), (8, (32, 8)), (32, (7, 1))] and found.trees == [(7, 1), (32, 8), (64, 8)]
    assert str(WidthSchedule.found({4: (16, 4)}).budget) == "16"          # the lowest load measured holds from 1
    with pytest.raises(ValueError, match="no measured load"):
        WidthSchedule.found({})


def test_a_schedule_changing_only_its_cap_is_a_step_and_one_value_each_is_one_tree():
    s = WidthSchedule(parse_schedule("32", "b"), parse_schedule("1:8,16:4", "c"))
    assert s.steps == [(1, (32, 8)), (16, (32, 4))] and s.stepped
    one = WidthSchedule.of(16, 4)
    assert one.steps == [(1, (16, 4))] and not one.stepped and one.widest().verify_tokens == 17


def test_the_sweep_report_and_the_speed_benchmark_find_the_same_schedule_from_the_same_bests():
    """The two callers of the one finder (tools/sweep_report.py from a sweep's picks, bench/sglang_speed.py from its
    rows) agree, so a schedule found on the test bed reads as the one the sweep would deploy."""
    from bench import sglang_speed
    from tools import sweep_report as report
    picks = [{"concurrency": c, "budget": b, "topk_cap": k} for c, (b, k) in ((1, (64, 8)), (8, (32, 8)), (32, (7, 1)))]
    from_sweep = report.found_schedule(picks)
    rows = []
    for p in picks:
        for b, k in ((64, 8), (32, 8), (7, 1)):
            best = (b, k) == (p["budget"], p["topk_cap"])
            rows.append(sglang_speed.SpeedRow(f"ddtree-b{b}-c{k}-graphs-bs48", "DDTREE", b, False, p["concurrency"],
                                              2000.0 if best else 1000.0, None, None, None, None, [], cap=k))
    from_bench = sglang_speed.found_schedule(rows, (1, 8, 32), overlap=False)
    assert from_sweep == from_bench and from_sweep.steps == [(1, (64, 8)), (8, (32, 8)), (32, (7, 1))]


def test_the_settings_module_imports_no_torch():
    """tools/sweep_report.py reads the schedule type on the controller, where torch need not be installed."""
    import subprocess
    import sys
    code = "import sys, ddtree.settings; assert 'torch' not in sys.modules, 'torch was imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr

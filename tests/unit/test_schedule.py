"""ddtree.settings' schedules by running batch size: parsing, lookup and the rules at each step."""

from __future__ import annotations

import pytest

from ddtree.settings import SERVER_FLAGS, DDTreeConfigError, Schedule, parse_schedule, schedule_problems


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

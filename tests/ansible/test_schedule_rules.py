"""The budget / cap schedule rules exist twice: in ddtree.settings (the plugin's start-up, ddtree-serve) and in
the Ansible input filter (preflight, before anything is rendered). They must agree (issue 46): on a fixed list
of texts and on seeded random ones, the filter accepts a schedule exactly when ddtree.settings parses it, and at
every batch size where a schedule changes the filter flags a cap above the budget or a block that does not fit
exactly where ddtree.settings finds a problem."""

from __future__ import annotations

import functools
import random

import pytest
import yaml

from ddtree.settings import (AUTO_BUDGETS, MAX_BUDGET, DDTreeConfigError, auto_problems, parse_auto, parse_schedule,
                             schedule_problems)

from .conftest import ROOT, load_k26_inputs
FIXED = ["32", "1", "1023", "1024", "0", "", " 8 ", "1:64,8:32,32:8", "1:8", "2:8", "1:8,1:4", "1:8,4:2,3:1",
         "1:64,8:", "1:64;8:32", "a", "1:0", "1:1024", "-1", "1.5", "1:64, 8:32", "01:064"]


def filter_module():
    return load_k26_inputs()


@functools.lru_cache(maxsize=1)
def budget_rule() -> dict:
    rules = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())
    rule = next(v for k, v in rules.items() if isinstance(v, dict) and "k26_ddtree_budget" in v)["k26_ddtree_budget"]
    assert rule["kind"] == "budget" and rule["max"] == MAX_BUDGET
    return rule


def random_texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        steps = rng.randint(1, 4)
        batches = sorted(rng.sample(range(1, 64), steps))
        if rng.random() < 0.3:
            batches[0] = rng.randint(1, 3)
        else:
            batches[0] = 1
        if rng.random() < 0.15 and steps > 1:
            batches[1] = batches[0]                        # not increasing
        values = [rng.choice([0, 1, 2, 4, 7, 8, 16, 32, 64, 1023, 1024]) for _ in batches]
        out.append(",".join(f"{b}:{v}" for b, v in zip(batches, values)) if steps > 1 or rng.random() < 0.5
                   else str(values[0]))
    return out


def parses(text: str, parser=parse_schedule) -> bool:
    """Whether ddtree.settings' `parser` (parse_schedule, parse_auto) takes the text."""
    try:
        parser(text, "x")
        return True
    except DDTreeConfigError:
        return False


@pytest.mark.parametrize("text", FIXED + random_texts(0, 150))
def test_the_filter_accepts_a_schedule_exactly_when_ddtree_settings_parses_it(text):
    accepted = filter_module()._schedule(text, budget_rule()) is None
    assert accepted == parses(text), text


@pytest.mark.parametrize("seed", range(4))
def test_the_filter_flags_the_steps_ddtree_settings_finds_wrong(seed):
    module = filter_module()
    rng = random.Random(seed)
    good = [t for t in FIXED + random_texts(seed + 10, 200) if parses(t)]
    for _ in range(150):
        budget, cap, block = rng.choice(good), rng.choice(good), rng.choice([0, 2, 4, 8, 16, 17])
        steps = module.k26_schedule_steps(budget, cap, block)
        flagged = {s["batch"] for s in steps if s["cap_over_budget"] or s["block_short"]}
        problems = schedule_problems(parse_schedule(budget, "b"), parse_schedule(cap, "c"), block or None)
        found = {int(p.split(":")[0].removeprefix("from batch size ")) for p in problems}
        assert flagged == found, (budget, cap, block, steps, problems)


AUTO_TEXTS = ["auto", "AUTO", " auto ", "auto:8,16,32", "auto:1", "auto:1023", "auto:1024", "auto:0,8", "auto:16,8",
              "auto:8,8", "auto:", "auto:8,", "automatic", "auto 8", "auto:8;16", "auto:-1"]


@pytest.mark.parametrize("text", AUTO_TEXTS)
def test_the_filter_accepts_auto_exactly_when_ddtree_settings_parses_it(text):
    accepted = filter_module()._budget(text, budget_rule()) is None
    assert accepted == parses(text, parse_auto), text


def test_the_filters_auto_budgets_are_ddtree_settings():
    assert tuple(filter_module().AUTO_BUDGETS) == AUTO_BUDGETS


@pytest.mark.parametrize("budget, cap, block", [("auto", "8", 8), ("auto:4,16", "8", 8), ("auto:4,16", "8", 16),
                                                 ("auto:8,32", "1:8,8:4", 8), ("auto:2", "2", 0)])
def test_the_filter_flags_the_auto_budgets_ddtree_settings_finds_wrong(budget, cap, block):
    steps = filter_module().k26_schedule_steps(budget, cap, block)
    flagged = {s["budget"] for s in steps if s["block_short"]}
    cap_schedule = any(s["auto_cap_schedule"] for s in steps)
    problems = auto_problems(parse_auto(budget, "b"), parse_schedule(cap, "c"), block or None)
    assert cap_schedule == any("keeps one cap" in p for p in problems)
    if not cap_schedule:
        assert flagged == {int(p.split(":")[0].removeprefix("auto budget ")) for p in problems}

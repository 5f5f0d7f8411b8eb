"""ddtree.settings: one object for budget / top-k cap / block size, its ranges and messages."""

from __future__ import annotations

import pytest

from ddtree.reference.config import PRESETS
from ddtree.reference.engine import Decoder
from ddtree.reference.pair import init_pair
from ddtree.settings import (DEFAULT_BUDGET, DEFAULT_TOPK_CAP, MAX_BUDGET, PYTHON_NAMES, SERVER_FLAGS,
                             DDTreeConfigError, DDTreeSettings)


def test_the_defaults_and_the_chain_are_good():
    assert DDTreeSettings().problems() == []
    assert (DDTreeSettings().budget, DDTreeSettings().topk_cap) == (DEFAULT_BUDGET, DEFAULT_TOPK_CAP)
    assert DDTreeSettings(7, 1, 8).problems(SERVER_FLAGS) == []            # the DFlash chain of a block-8 draft
    assert DDTreeSettings(MAX_BUDGET, MAX_BUDGET, 64).check() == DDTreeSettings(MAX_BUDGET, MAX_BUDGET, 64)


@pytest.mark.parametrize("settings,names,message", [
    (DDTreeSettings(0, 8), PYTHON_NAMES, "budget=0 is invalid: expected 1..1023 (32 is the tested default)"),
    (DDTreeSettings(MAX_BUDGET + 1, 8), SERVER_FLAGS, "--speculative-ddtree-budget=1024 is invalid"),
    (DDTreeSettings(True, 1), PYTHON_NAMES, "budget=True is invalid"),
    (DDTreeSettings("32", 8), PYTHON_NAMES, "budget='32' is invalid"),
    (DDTreeSettings(16, 17), PYTHON_NAMES, "topk_cap=17 is invalid: expected 1..budget (16)"),
    (DDTreeSettings(16, 0), SERVER_FLAGS, "--speculative-ddtree-topk-cap=0 is invalid"),
    (DDTreeSettings(16, 4, 1), SERVER_FLAGS, "--speculative-dflash-block-size=1 is invalid"),
    (DDTreeSettings(6, 1, 8), SERVER_FLAGS,
     "--speculative-ddtree-budget=6 is invalid with block size 8: the draft's block must fit in the verify window "
     "(budget + 1 >= block size); use a budget >= 7 (7 with --speculative-ddtree-topk-cap 1 is the DFlash chain)"),
])
def test_each_broken_range_is_named_with_its_value_and_fix(settings, names, message):
    problems = settings.problems(names)
    assert problems and message in problems[0]
    with pytest.raises(DDTreeConfigError, match="is invalid"):
        settings.check(names)


def test_a_bad_budget_reports_only_the_budget():
    """The cap and block rules are read against the budget: a bad budget is the one message."""
    assert len(DDTreeSettings(0, 99, 1).problems()) == 1


def test_the_engine_and_its_messages_use_the_same_rules():
    """The reference engine refuses what the settings refuse, naming its own argument."""
    pair = init_pair(*PRESETS["tiny"], seed=0)

    with pytest.raises(DDTreeConfigError, match=r"topk_cap=0 is invalid: expected an integer >= 1"):
        Decoder(pair, "ddtree", budget=8, topk_cap=0)
    with pytest.raises(DDTreeConfigError, match=r"budget=0 is invalid: expected 1..1023"):
        Decoder(pair, "ddtree", budget=0, topk_cap=1)
    assert Decoder(pair, "ddtree", budget=2, topk_cap=2).budget == 2   # trees shallower than the block are fine
    assert Decoder(pair, "ddtree", budget=1, topk_cap=8).topk_cap == 8  # a cap above the budget is clamped, as before

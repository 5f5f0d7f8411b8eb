"""The DDTREE step profiler (ddtree.sglang.diagnostics.profile): what it times and what it logs."""

import pytest

from ddtree import switches
from ddtree.sglang.diagnostics.profile import OFF, StepProfiler, parse_profile_lines


class FakeDevice:
    """A clock that the test advances, and a sync that costs `pending` seconds of device work."""

    def __init__(self):
        self.now = 0.0
        self.pending = 0.0
        self.syncs = 0

    def clock(self):
        return self.now

    def sync(self):
        self.syncs += 1
        self.now += self.pending
        self.pending = 0.0


def run_steps(prof, dev, n, bs=1, gap=0.001):
    for _ in range(n):
        dev.now += gap
        prof.begin(bs)
        with prof.stage("draft"):
            dev.now += 0.0002          # host: launches
            dev.pending = 0.0008       # device work still queued
        with prof.stage("verify"):
            dev.now += 0.0001
            dev.pending = 0.0030
        prof.end()


def test_host_and_total_times_per_stage_and_the_gap_between_steps():
    dev, lines = FakeDevice(), []
    prof = StepProfiler(4, dev.sync, dev.clock, emit=lines.append)
    run_steps(prof, dev, 4)
    assert len(lines) == 1
    p = lines[0]
    assert p.batch_size == 1 and p.steps == 4
    assert p.stages["draft"] == pytest.approx((0.2, 1.0))
    assert p.stages["verify"] == pytest.approx((0.1, 3.1))
    assert p.stages["step"][1] == pytest.approx(4.1)
    assert p.stages["between"] == pytest.approx((1.0, 1.0))     # 3 gaps: the first step has none before it


def test_a_long_gap_is_not_counted_and_batch_sizes_are_kept_apart():
    dev, lines = FakeDevice(), []
    prof = StepProfiler(2, dev.sync, dev.clock, emit=lines.append)
    run_steps(prof, dev, 1, bs=8)
    run_steps(prof, dev, 2, bs=1, gap=1.0)        # a prefill / idle gap: not the scheduler's step work
    run_steps(prof, dev, 1, bs=8, gap=0.002)
    assert [p.batch_size for p in lines] == [1, 8]
    assert "between" not in lines[0].stages
    assert lines[1].stages["between"] == pytest.approx((2.0, 2.0))


def test_the_logged_line_parses_back():
    dev, lines = FakeDevice(), []
    prof = StepProfiler(3, dev.sync, dev.clock, emit=lines.append)
    run_steps(prof, dev, 3, bs=2)
    text = "INFO something\n[tp 0] " + lines[0].line() + "\nmore\n"
    (back,) = parse_profile_lines(text)
    assert back.batch_size == 2 and back.steps == 3
    assert list(back.stages) == list(lines[0].stages)
    for name, (h, t) in lines[0].stages.items():
        assert back.stages[name] == pytest.approx((h, t), abs=1e-3)


def profiler(env: dict) -> StepProfiler | None:
    return StepProfiler.from_switches(switches.read(env), lambda: None)


def test_from_switches_off_on_and_a_bad_value():
    assert profiler({}) is None
    assert profiler({"SGLANG_DDTREE_PROFILE_STEPS": "0"}) is None
    assert profiler({"SGLANG_DDTREE_PROFILE_STEPS": "50"}).every == 50
    with pytest.raises(ValueError, match=r"SGLANG_DDTREE_PROFILE_STEPS='x' is invalid: expected a whole number"):
        profiler({"SGLANG_DDTREE_PROFILE_STEPS": "x"})
    with pytest.raises(ValueError, match="SGLANG_DDTREE_PROFILE_STEPS='-3' is invalid"):
        profiler({"SGLANG_DDTREE_PROFILE_STEPS": "-3"})


def test_off_never_synchronises():
    calls = []
    OFF.begin(1)
    with OFF.stage("draft"):
        calls.append(1)
    OFF.end()
    assert calls == [1]

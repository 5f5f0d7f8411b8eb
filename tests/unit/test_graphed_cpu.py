"""gc_paused (cyclic garbage collected before a capture, none during it) and run_marked (timing marks)."""

from __future__ import annotations

import gc
import weakref

from ddtree.reference.graphed import gc_paused


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_garbage_cycles_are_collected_before_and_none_during_the_capture():
    before = Node()
    dead_before = weakref.ref(before)
    del before
    assert gc.isenabled()
    with gc_paused():
        assert dead_before() is None, "a cycle dropped before the capture must be collected first"
        assert not gc.isenabled()
        during = Node()
        dead_during = weakref.ref(during)
        del during
        for _ in range(3):
            [Node() for _ in range(2000)]  # enough allocations to trigger generation-0 collections
        assert dead_during() is not None, "nothing may be collected while the capture runs"
    assert gc.isenabled()
    gc.collect()
    assert dead_during() is None


def test_the_collector_stays_off_when_the_caller_had_turned_it_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_is_back_on_after_a_failed_capture():
    try:
        with gc_paused():
            raise RuntimeError("capture failed")
    except RuntimeError:
        pass
    assert gc.isenabled()


def test_run_marked_records_each_calls_marks_around_it_in_order():
    from ddtree.reference.engine import run_marked

    log = []

    class Mark:
        def __init__(self, name):
            self.name = name

        def record(self):
            log.append(self.name)

    marks = [(Mark("s0"), Mark("e0")), (Mark("s1"), Mark("e1"))]
    run_marked([lambda: log.append("a"), lambda: log.append("b")], marks)
    assert log == ["s0", "a", "e0", "s1", "b", "e1"]
    log.clear()
    run_marked([lambda: log.append("a")], None)
    assert log == ["a"]

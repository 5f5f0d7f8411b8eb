"""bench/trace_steps.py on a trace written here in the torch profiler's Chrome format: busy time is the union of the
kernels' intervals (two streams overlapping counted once), idle the rest of their span, kernels grouped across
template instantiations; a trace without kernels is refused by name."""

from __future__ import annotations

import gzip
import json

import pytest

from bench import trace_steps


def kernel(name, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


EVENTS = [
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 5},
    kernel("void marlin_moe<4, 256>(int*)", 10, 100),
    kernel("void marlin_moe<8, 128>(int*)", 60, 100),        # overlaps the first: busy 10-160
    kernel("fused_add_rmsnorm_kernel_32", 400, 50),          # idle 160-400
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 380, "dur": 5},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000},
]


def test_busy_idle_and_groups_of_a_gzipped_trace(tmp_path):
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": EVENTS}, f)
    s = trace_steps.summarize(trace_steps.read_events(path))
    assert (s.kernels, s.graph_launches) == (3, 2)
    assert s.busy_us == 200 and s.span_us == 440 and s.idle_us == 240
    assert [(g.name, g.count, g.total_us) for g in s.groups] == [("void marlin_moe", 2, 200.0),
                                                                 ("fused_add_rmsnorm_kernel_#", 1, 50.0)]
    text = trace_steps.table(s, steps=2)
    assert "| GPU busy (kernels' union) | 0.100 |" in text and "| GPU idle between kernels | 0.120 |" in text
    assert "| void marlin_moe | 1.0 | 0.100 | 100.0% |" in text


def test_a_trace_without_kernels_is_refused_and_the_cli_says_which(tmp_path, capsys):
    path = tmp_path / "cpu-only.json"
    path.write_text(json.dumps({"traceEvents": EVENTS[-1:]}))
    with pytest.raises(ValueError, match="no GPU kernel events"):
        trace_steps.summarize(trace_steps.read_events(path))
    assert trace_steps.main([str(path)]) == 1
    assert "cpu-only.json: the trace holds no GPU kernel events" in capsys.readouterr().err


def call(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}


def test_the_hosts_self_time_is_laid_to_packages_on_the_busiest_python_thread():
    """A caller's own time excludes its callees'; sglang groups by its first two folders, ddtree by its package,
    built-in calls together; a quieter thread (a watchdog) is left out; no Python calls, no host table."""
    python = [
        call("sglang/srt/managers/scheduler.py(2078): event_loop_overlap", 0, 1000),
        call("ddtree/sglang/step/decode_step.py(155): draft_candidates", 100, 300),
        call("<built-in method replay of pybind11 object at 0x7f>", 150, 200),     # inside ddtree's call
        call("sglang/srt/model_executor/model_runner.py(1813): forward", 500, 400),
        call("contextlib.py(132): __enter__", 950, 10),
        call("threading.py(359): wait", 0, 5000, tid=2),                           # one call: not the busiest
    ]
    s = trace_steps.summarize(EVENTS + python)
    assert [(g.name, g.self_us) for g in s.host] == [
        ("sglang/srt/model_executor", 400.0), ("sglang/srt/managers", 290.0),  # 1000 - 300 - 400 - 10
        ("built-in calls", 200.0), ("ddtree/sglang", 100.0), ("contextlib.py", 10.0)]
    text = trace_steps.table(s, steps=2)
    assert "Python self time, 0.500 ms per step" in text and "| built-in calls | 0.100 |" in text
    assert trace_steps.summarize(EVENTS).host == () and "host:" not in trace_steps.table(trace_steps.summarize(EVENTS), 2)

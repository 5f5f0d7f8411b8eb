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

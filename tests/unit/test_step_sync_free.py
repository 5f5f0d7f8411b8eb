"""A static guard for issue 35: the modules a DDTREE decode step runs call no explicit host synchronisation.

The step must not wait for the device (the overlap scheduler prepares the next step meanwhile). This test reads
the source of every module on the step's path and fails on `.item()`, `.tolist()`, `.cpu()`, `.numpy()` or
`torch.cuda.synchronize()` outside the functions allowed to (start-up rehearsal). Implicit waits (`int(t)`,
`bool(t)` of a device tensor, data-dependent shapes) cannot be seen here: the GPU test runs the step under
torch's sync debug mode for those (tests/gpu_sglang/test_overlap.py, SGLANG_DDTREE_SYNC_CHECK). The grammar and
custom-logit-processor stages wait by design and only in batches that use them (ddtree.sglang.step.grammar,
ddtree.sglang.step.logit_processors are not on this list).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "ddtree"
STEP_MODULES = ["sglang/tree_worker.py", "sglang/step/decode_step.py", "sglang/step/glue.py", "sglang/step/head.py", "sglang/step/seeded.py",
                "sglang/step/penalty_state.py", "sglang/step/verdict.py", "sglang/setup/widths.py", "penalties.py", "verify.py", "tree.py", "types.py",
                "_checks.py", "backend.py", "_triton.py", "sglang/policy/step_policy.py", "width_policy.py"]
SYNCING = {"item", "tolist", "cpu", "numpy", "synchronize"}
ALLOWED = {"prewarm_sampling", "_build", "__init__", "memory_report",     # start-up only
           "_read_back"}   # the width policy's pinned host copy, after an event the scheduler's own sync has passed


def syncing_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function: str | None):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr in SYNCING and name not in ALLOWED):
                found.append(f"{path.name}:{child.lineno} .{child.func.attr}() in {name}")
            visit(child, name)

    visit(tree, None)
    return found


@pytest.mark.parametrize("module", STEP_MODULES)
def test_no_explicit_host_sync_on_the_step_path(module):
    path = SRC / module
    assert path.exists(), path
    assert syncing_calls(path) == []


def test_the_guard_sees_a_sync(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def step(x):\n    return x.sum().item()\n\ndef prewarm_sampling(x):\n    x.cpu()\n")
    assert syncing_calls(bad) == ["bad.py:2 .item() in step"]

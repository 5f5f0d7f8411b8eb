"""The SGLang worker's entry point, importable without SGLang: the release flag and the factory.
The worker itself, DDTreeWorker (a subclass of SGLang 0.5.23's DFlashWorkerV2, one method per
decode stage), is ddtree.sglang.tree_worker, which imports SGLang at its top; make_worker_class
imports it when the plugin registers DDTREE. With SGLANG_DDTREE_FAULT set (the test bed only) it
returns that fault's subclass instead (diagnostics/faults.py).
"""

from __future__ import annotations

# A release flag, read by nothing at run time. True: this release's DDTreeWorker runs the whole DDTREE
# decode step inside SGLang (tests/gpu_sglang proves it on the H200), so a deployment may serve
# `sglang serve --speculative-algorithm DDTREE`. False would mean the decode path is unfinished: the
# preflight then refuses DDTREE with k26_server_kind sglang before any change. Its copy is
# __preflight_sglang_ddtree_ready in roles/preflight/vars/main.yml; tests/ansible keeps the two equal.
DECODE_READY = True


def make_worker_class(environ=None):
    """DDTreeWorker from ddtree.sglang.tree_worker (imported here: it imports SGLang), or with
    SGLANG_DDTREE_FAULT in `environ` (default: this process's environment) that fault's worker."""
    from ddtree import switches

    fault = switches.one("fault", environ)
    if fault:
        from ddtree.sglang.diagnostics.faults import fault_worker

        return fault_worker(fault)
    from ddtree.sglang.tree_worker import DDTreeWorker

    return DDTreeWorker

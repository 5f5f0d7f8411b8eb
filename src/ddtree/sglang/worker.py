"""DDTreeWorker on sglang 0.5.23's DFlashWorkerV2 (imported lazily: SGLang only).

Status (k26-ddtree 0.1.0): the class exists so that SGLang's registry, argument handling and
signature checks can be exercised, but its decode path (one DFlash draft pass -> build_tree ->
one target verify pass over budget + 1 tokens with the tree mask -> verify_tree -> keep the
accepted nodes' KV) is NOT implemented: DFlashWorkerV2.forward_batch_generation does draft
sampling, verify and accept in one method, and replacing its middle without copying SGLang's
code needs more work than this release holds. Constructing the worker therefore fails with a
clear message instead of silently serving the DFlash chain under the DDTREE name.
"""

from __future__ import annotations

NOT_READY = ("k26-ddtree 0.1.0: the DDTREE decode path inside SGLang is not implemented yet "
             "(tree draft, tree verify, KV compaction); serve with --speculative-algorithm DFLASH "
             "(the chain: budget = block size - 1, top-k cap 1) until a release says otherwise")


class DDTreeNotReady(RuntimeError):
    """The DDTREE worker cannot serve in this release."""


def make_worker_class():
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    class DDTreeWorker(DFlashWorkerV2):
        """DFlash draft + DDTree verify (see the module docstring for what is missing)."""

        def __init__(self, *args, **kwargs):
            raise DDTreeNotReady(NOT_READY)

    return DDTreeWorker

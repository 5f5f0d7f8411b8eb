"""The test bed's deliberate faults as workers of their own (SGLANG_DDTREE_FAULT), so a served DDTreeWorker has no
fault branch in its decode path. Each subclass overrides one of DDTreeWorker's two hooks; make_worker_class
(ddtree.sglang.worker) picks the class at start-up. This module imports SGLang (through tree_worker).

  sibling          the verify pass attends over a tree in which every node also sees its earlier siblings
                   (step_dump.leak_siblings): the mask fault the node check and the partings tests must catch
  stale-penalties  the verdict's penalties count every node by the step start's counts, as SGLang's DFLASH verify
                   applies them over its block (step_dump.hide_paths_from_penalties): the fault the request tests'
                   penalty rule must catch
  drop-leaf        every step's tree loses its last node before the verify and the verdict (step_dump.drop_last_node):
                   exact still, but a chain of budget L verifies L - 1 of DFLASH's L tokens - the fault the
                   chain-against-DFLASH test must catch
"""

from __future__ import annotations

import logging

from ddtree import switches
from ddtree.sglang.diagnostics.step_dump import drop_last_node, hide_paths_from_penalties, leak_siblings
from ddtree.sglang.tree_worker import DDTreeWorker
from ddtree.types import DraftTree

logger = logging.getLogger(__name__)


class SiblingLeakWorker(DDTreeWorker):
    """DDTREE with the sibling fault: tree nodes see their earlier siblings in the verify pass."""

    fault = "sibling"

    def verify_tree(self, tree: DraftTree) -> DraftTree:
        return leak_siblings(tree)


class StalePenaltiesWorker(DDTreeWorker):
    """DDTREE with the stale-penalties fault: every node penalised by the step start's counts."""

    fault = "stale-penalties"

    def penalty_paths(self, tree: DraftTree) -> DraftTree:
        return hide_paths_from_penalties(tree)


class DropLeafWorker(DDTreeWorker):
    """DDTREE with the drop-leaf fault: each step's tree loses its last node (a chain one drafted token)."""

    fault = "drop-leaf"

    def step_tree(self, tree: DraftTree) -> DraftTree:
        return drop_last_node(tree)


FAULT_WORKERS: dict[str, type[DDTreeWorker]] = {cls.fault: cls for cls in
                                                (SiblingLeakWorker, StalePenaltiesWorker, DropLeafWorker)}


def fault_worker(fault: str) -> type[DDTreeWorker]:
    """The worker class of a fault named by SGLANG_DDTREE_FAULT (the registry's choices are these classes' names)."""
    try:
        cls = FAULT_WORKERS[fault]
    except KeyError:
        raise ValueError(f"{switches.NAME['fault']}={fault!r} names no fault worker; choose one of "
                         f"{', '.join(sorted(FAULT_WORKERS))} or unset it") from None
    logger.error("DDTREE DELIBERATE FAULT %s=%s (%s): answers are WRONG; a test-bed mode for showing that a check "
                 "catches it", switches.NAME["fault"], fault, cls.__doc__)
    return cls

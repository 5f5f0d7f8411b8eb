"""Entry point `ddtree.sglang.plugin:register` (group `sglang.srt.plugins`, name `ddtree`).

Called by SGLang 0.5.23's load_plugins() in the launcher before argument parsing and in every
scheduler process. Nothing of the installed SGLang is patched: the overrides are registered
hooks and a CustomSpecAlgo subclass.
"""

from __future__ import annotations

import argparse
import logging

from ddtree.sglang import graph_check
from ddtree.sglang.settings import DEFAULT_BUDGET, DEFAULT_TOPK_CAP, DDTreeSettings, validate

log = logging.getLogger(__name__)
ALGORITHM = "DDTREE"
CAPTURE_SPEC_INFO = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"
_registered = False


def add_ddtree_cli_args(result, *args, **kwargs):
    """AFTER hook on sglang 0.5.23 ServerArgs.add_cli_args(parser): the DDTree flag group."""
    parser = next(a for a in list(args) + list(kwargs.values()) if isinstance(a, argparse.ArgumentParser))
    group = parser.add_argument_group("DDTree speculative decoding (k26-ddtree plugin)")
    group.add_argument("--speculative-ddtree-budget", type=int, default=DEFAULT_BUDGET,
                       help="draft-tree nodes verified per step (1..1023); budget = block size - 1 with "
                            "top-k cap 1 is the DFlash chain")
    group.add_argument("--speculative-ddtree-topk-cap", type=int, default=DEFAULT_TOPK_CAP,
                       help="candidate tokens per depth (1..budget)")
    return result


def capture_ddtree_cli_values(result, *args, **kwargs):
    """AFTER hook on sglang 0.5.23 ServerArgs.from_cli_args(args): hand the values to the schedulers.

    from_cli_args copies only ServerArgs' own fields; the spawned scheduler processes inherit
    the environment, so the two values travel as SGLANG_DDTREE_BUDGET / SGLANG_DDTREE_TOPK_CAP.
    """
    ns = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, argparse.Namespace)), None)
    if ns is not None and hasattr(ns, "speculative_ddtree_budget"):
        DDTreeSettings(budget=ns.speculative_ddtree_budget, topk_cap=ns.speculative_ddtree_topk_cap).to_env()
    return result


def validate_server_args(server_args) -> None:
    """SGLang's per-algorithm validation hook: the settings and the server flags DDTREE needs."""
    graph_check.enabled()
    validate(DDTreeSettings.from_env(), server_args)


def spec_class():
    """A CustomSpecAlgo that answers like DFlash where SGLang sizes and captures target verify."""
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class DDTreeSpec(CustomSpecAlgo):
        # sglang 0.5.23 spec_info.SpeculativeAlgorithm.is_dflash_family: DFlash-style draft KV,
        # target hidden-state capture and target-verify graphs
        def is_dflash_family(self) -> bool:
            return True

        # sglang 0.5.23 SpeculativeAlgorithm.supports_target_verify_for_draft (DFlash: True)
        def supports_target_verify_for_draft(self) -> bool:
            return True

        # sglang 0.5.23 CustomSpecAlgo.get_num_tokens_per_req_for_target_verify: the target
        # verifies budget + 1 tokens per request (the seed's `q.shape[0] != qo_indptr[-1]` at
        # replay); the draft model runner also runs in TARGET_VERIFY mode, over its block
        # (num_draft_tokens), and its graphs must keep that width
        def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
            if is_draft_worker:
                return num_draft_tokens
            return DDTreeSettings.from_env().verify_tokens

    return DDTreeSpec


def capture_with_tree_mask(result, *args, **kwargs):
    """AFTER hook on sglang 0.5.23 DecodeCudaGraphRunner.get_spec_info(self, num_tokens).

    For the DFlash family that method builds the capture's DFlashVerifyInput with custom_mask=None
    whenever the attention backend can verify a chain causally (resolve_dflash_verify_mask_policy:
    TritonAttnBackend is one), so a DDTREE target graph would be captured without the tree mask and
    its replays would let sibling nodes see each other. For the DDTREE target runner the capture
    input gets the runner's own custom_mask buffer (allocated for every decode runner), so the
    custom-mask verify path is the one captured. The draft runner (a plain block) is left as is.
    """
    runner = args[0]
    model_runner = runner.model_runner
    if (result is None or model_runner.is_draft_worker
            or getattr(model_runner.spec_algorithm, "name", None) != ALGORITHM):
        return result
    if result.custom_mask is None:
        result.custom_mask = runner.buffers.custom_mask
    return result


def worker_factory(server_args):
    """SpeculativeAlgorithm factory: the worker class for DDTREE."""
    from ddtree.sglang.worker import make_worker_class

    return make_worker_class()


def register() -> None:
    """Register the CLI hooks and the DDTREE algorithm (idempotent per process)."""
    global _registered
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", add_ddtree_cli_args, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.from_cli_args", capture_ddtree_cli_values,
                          HookType.AFTER)
    SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=False, validate_server_args=validate_server_args,
                                  spec_class=spec_class())(worker_factory)
    HookRegistry.register(CAPTURE_SPEC_INFO, capture_with_tree_mask, HookType.AFTER)
    _registered = True
    # last: a bad SGLANG_DDTREE_GRAPH_CHECK raises here (load_plugins logs it) and again, as the
    # server's error, in validate_server_args
    if graph_check.enabled():
        HookRegistry.register(graph_check.TARGET, graph_check.before_load_batch, HookType.BEFORE)
    log.info("k26-ddtree: registered speculative algorithm %s", ALGORITHM)

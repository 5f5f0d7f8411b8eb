"""Entry point `ddtree.sglang.plugin:register` (group `sglang.srt.plugins`, name `ddtree`).

Called by SGLang 0.5.23's load_plugins() in the launcher before argument parsing and in every
scheduler process. Nothing of the installed SGLang is patched: the overrides are registered
hooks and a CustomSpecAlgo subclass.
"""

from __future__ import annotations

import argparse
import logging

from ddtree.sglang.diagnostics import graph_check
from ddtree.sglang.setup import keys
from ddtree.sglang.step import penalty_state
from ddtree.sglang.requests import ServedFeatures, request_refusal
from ddtree.settings import DEFAULT_BUDGET, DEFAULT_TOPK_CAP, MAX_BUDGET, DDTreeConfigError, DDTreeSettings
from ddtree.sglang.setup.refusals import validate
from ddtree.sglang.setup.server_env import (block_to_env, draft_block_size, from_env, resolved_block,
                                      schedule_from_env, schedule_to_env)

log = logging.getLogger(__name__)
ALGORITHM = "DDTREE"
CAPTURE_SPEC_INFO = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"
VALIDATE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
LOGGED_SERVER_ARGS = "sglang.srt.entrypoints.engine._server_args_for_logging"
SECRET_FIELDS = ("api_key", "admin_api_key")
DEFAULT_MAX_RUNNING_REQUESTS = 48   # what SGLang 0.5.23 sets for DFLASH when unset
_registered = False


def add_ddtree_cli_args(result, *args, **kwargs):
    """AFTER hook on sglang 0.5.23 ServerArgs.add_cli_args(parser): the DDTree flag group."""
    parser = next(a for a in list(args) + list(kwargs.values()) if isinstance(a, argparse.ArgumentParser))
    group = parser.add_argument_group("DDTree speculative decoding (k26-ddtree plugin)")
    group.add_argument("--speculative-ddtree-budget", type=str, default=str(DEFAULT_BUDGET),
                       help=f"draft-tree nodes verified per step (1..{MAX_BUDGET}); budget = block size - 1 with "
                            "top-k cap 1 is the DFlash chain; or a schedule by running batch size, e.g. "
                            "1:64,8:32,32:8; or auto[:B1,B2,..] (default trees 8,16,32): each step the tree or the "
                            "chain with the most expected tokens per measured verify cost")
    group.add_argument("--speculative-ddtree-topk-cap", type=str, default=str(DEFAULT_TOPK_CAP),
                       help="candidate tokens per depth (1..budget); or a schedule by running batch size")
    return result


def capture_ddtree_cli_values(result, *args, **kwargs):
    """AFTER hook on sglang 0.5.23 ServerArgs.from_cli_args(args): hand the values to the schedulers.

    from_cli_args copies only ServerArgs' own fields; the spawned scheduler processes inherit
    the environment, so the two values travel as SGLANG_DDTREE_BUDGET / SGLANG_DDTREE_TOPK_CAP.
    """
    ns = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, argparse.Namespace)), None)
    if ns is not None and hasattr(ns, "speculative_ddtree_budget"):
        schedule_to_env(ns.speculative_ddtree_budget, ns.speculative_ddtree_topk_cap)
    return result


def resolve_settings(server_args) -> DDTreeSettings:
    """The DDTree settings of this server: budget and cap from the environment (the CLI hook put
    them there), the draft block from --speculative-dflash-block-size, else the draft's config.json."""
    settings = from_env()
    flag = getattr(server_args, "speculative_dflash_block_size", None)
    configured = draft_block_size(getattr(server_args, "speculative_draft_model_path", None))
    if flag is not None and configured is not None and int(flag) != configured:
        raise DDTreeConfigError(f"--speculative-dflash-block-size={flag} differs from the draft's block_size "
                                f"{configured} (config.json): the draft was trained with its block; remove the flag "
                                f"or set it to {configured}")
    block = int(flag) if flag is not None else configured
    if block is None:
        raise DDTreeConfigError("the draft's block size is unknown: its config.json has no block_size; set "
                                "--speculative-dflash-block-size")
    return DDTreeSettings(budget=settings.budget, topk_cap=settings.topk_cap, block_size=block)


def validate_server_args(server_args) -> None:
    """SGLang's per-algorithm validation hook: the settings and the server flags DDTREE needs."""
    graph_check.enabled()
    validate(resolve_settings(server_args), server_args)


def handle_server_args(server_args) -> None:
    """Size the server for DDTREE (SGLang 0.5.23 CustomSpecAlgo.handle_server_args; writes are declared).

    speculative_num_draft_tokens becomes the verify width budget + 1 (the widest step's, with a schedule):
    it sizes the step's KV reservation (2 x width), the target-verify graphs and the tree-mask buffer. The
    draft keeps its block, which reaches the scheduler processes as SGLANG_DDTREE_BLOCK_SIZE.
    """
    settings = resolve_settings(server_args)
    validate(settings, server_args)
    server_args.speculative_num_steps = 1
    server_args.speculative_eagle_topk = 1
    server_args.speculative_num_draft_tokens = settings.verify_tokens
    if getattr(server_args, "speculative_draft_attention_backend", None) is None:
        server_args.speculative_draft_attention_backend = server_args.attention_backend
    if getattr(server_args, "max_running_requests", None) is None:
        server_args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
    block_to_env(settings.block_size)


_SERVED: dict[int, ServedFeatures] = {}     # id(server_args) -> what that server serves, read at its first request


def _served(server_args) -> ServedFeatures:
    """What this server serves (its flags), read once per server."""
    key = id(server_args)
    if key not in _SERVED:
        _SERVED[key] = ServedFeatures.from_server(server_args)
    return _SERVED[key]


def refuse_unsupported_requests(*args, **kwargs):
    """BEFORE hook on sglang 0.5.23 TokenizerManager._validate_one_request(self, obj, input_ids).

    On a DDTREE server a request using a feature the tree path does not implement fails with a
    ValueError naming the field (the client gets an error; the server keeps serving).
    """
    manager, obj = args[0], (args[1] if len(args) > 1 else kwargs.get("obj"))
    algorithm = getattr(getattr(manager, "server_args", None), "speculative_algorithm", None)
    if algorithm != ALGORITHM or obj is None:
        return None
    served = _served(manager.server_args)
    message = request_refusal(getattr(obj, "sampling_params", None), obj, served)
    if message:
        raise ValueError(message)
    return None


def redact_logged_secrets(result, *args, **kwargs):
    """AFTER hook on sglang 0.5.23 engine._server_args_for_logging(server_args): the start-up log line
    `server_args={...}` carries every field, the API keys included (0.5.23 redacts only watermark
    secrets), and would put them in the journal. Any server with the plugin installed gets them
    redacted, whatever its algorithm."""
    if isinstance(result, dict):
        for field in SECRET_FIELDS:
            if result.get(field):
                result[field] = "<redacted>"
    return result


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

        # SpeculativeAlgorithm methods 0.5.23's CustomSpecAlgo lacks (its conformance check looks at
        # is_*/supports_* only) although the scheduler calls them on every algorithm; answered as
        # SpeculativeAlgorithm answers for DFLASH
        def carries_draft_hidden_states(self) -> bool:
            return False

        def need_topk(self) -> bool:
            return False

        def get_platform_worker_cls(self):
            return None

        def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens: bool = True,
                              needs_confidence_relay: bool = False):
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

        # sglang 0.5.23 CustomSpecAlgo.handle_server_args (called with a recorder of field writes)
        def handle_server_args(self, server_args) -> None:
            handle_server_args(server_args)

        # sglang 0.5.23 CustomSpecAlgo.get_num_tokens_per_req_for_target_verify: the target
        # verifies budget + 1 tokens per request (the seed's `q.shape[0] != qo_indptr[-1]` at
        # replay); the draft model runner also runs in TARGET_VERIFY mode, over its own block,
        # and its graphs must keep that width
        # (SGLang passes its speculative_num_draft_tokens, the widest verify width; the worker's graphs for a
        # schedule's narrower widths pass theirs, widths.py - any other value gets the widest, as before)
        def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
            if is_draft_worker:
                return resolved_block(from_env())
            widths = schedule_from_env().widths                        # ascending; the last is the widest
            return int(num_draft_tokens) if num_draft_tokens and int(num_draft_tokens) in widths else widths[-1]

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
    # overlap-capable: under SGLang's overlap scheduler DDTREE gave NONE's answers on the GPU test bed (node by
    # node, greedy, sampling, seeds, logprobs, grammars; issue 45); requests that read the answer are refused
    # there (requests.py)
    SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=True, validate_server_args=validate_server_args,
                                  spec_class=spec_class())(worker_factory)
    HookRegistry.register(CAPTURE_SPEC_INFO, capture_with_tree_mask, HookType.AFTER)
    HookRegistry.register(VALIDATE_REQUEST, refuse_unsupported_requests, HookType.BEFORE)
    HookRegistry.register(LOGGED_SERVER_ARGS, redact_logged_secrets, HookType.AFTER)
    HookRegistry.register(penalty_state.FORWARD_COPY, penalty_state.keep_orchestrator, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", keys.add_cli_args, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.from_cli_args", keys.capture, HookType.AFTER)
    HookRegistry.register(keys.DECIDE, keys.accept_previous, HookType.AROUND)
    _registered = True
    # last: a bad SGLANG_DDTREE_GRAPH_CHECK raises here (load_plugins logs it) and again, as the
    # server's error, in validate_server_args
    if graph_check.enabled():
        HookRegistry.register(graph_check.TARGET, graph_check.before_load_batch, HookType.BEFORE)
    log.info("k26-ddtree: registered speculative algorithm %s", ALGORITHM)

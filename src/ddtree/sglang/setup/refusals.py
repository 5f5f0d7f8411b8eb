"""The start-up refusals of a DDTREE server (no SGLang import): `refusals(settings, server_args)` lists every
server setting the DDTREE decode path does not cover, each message naming the flag, its value and the fix;
`validate` raises the first. server_args is SGLang's ServerArgs or alike (read with getattr).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from ddtree.settings import SERVER_FLAGS, DDTreeConfigError, DDTreeSettings
from ddtree.sglang.setup.server_env import schedule_from_env

# attention backends whose target-verify path takes an arbitrary (tree) custom mask in 0.5.23
MASK_BACKENDS = ("triton", "flashinfer")
# of those, the ones DDTREE was proven with on an MLA target (tests/gpu_sglang/test_kimi_path.py)
MLA_MASK_BACKENDS = ("triton",)



# each check takes (settings, server_args) and returns a message or None

def _ddtree_shape(s: DDTreeSettings, a) -> str | None:
    """budget, top-k cap and block size against each other (ddtree.settings holds the rules), at every step
    of a schedule, for every tree of `auto`."""
    schedule = schedule_from_env()
    problems = schedule.problems(s.block_size) if schedule.stepped or schedule.auto else s.problems(SERVER_FLAGS)
    return problems[0] if problems else None


def _page_size(s, a) -> str | None:
    page = getattr(a, "page_size", None)
    if page not in (None, 1):
        return (f"--page-size={page} is invalid for DDTREE: the accepted tree path is kept by rewriting the "
                "request's token table slot by slot; use --page-size 1")
    return None


def is_mla_target(model_path: str | os.PathLike | None) -> bool:
    """Whether the target's config.json (or a wrapper's text_config, as Kimi K2.6's) has multi-head latent
    attention (kv_lora_rank); False when there is no readable config (the start-up goes on as before)."""
    if model_path is None:
        return False
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(cfg.get("kv_lora_rank") or (cfg.get("text_config") or {}).get("kv_lora_rank"))


def _attention(s, a) -> str | None:
    backend = getattr(a, "attention_backend", None)
    if backend not in MASK_BACKENDS:
        return (f"--attention-backend={backend} cannot verify a tree (no custom-mask verify path, or left to SGLang's "
                f"automatic choice); use one of {', '.join(MASK_BACKENDS)} (triton on sm_120 for MLA)")
    if backend not in MLA_MASK_BACKENDS and is_mla_target(getattr(a, "model_path", None)):
        return (f"--attention-backend={backend} is not proven for DDTREE on a multi-head latent attention target "
                f"(Kimi K2.6, DeepSeek-V3): on the H200 test bed FlashInfer's verify-graph capture failed on a "
                f"trained Kimi-shaped pair; use --attention-backend {' or '.join(MLA_MASK_BACKENDS)}")
    return None


def _disaggregation(s, a) -> str | None:
    mode = getattr(a, "disaggregation_mode", None)
    if mode not in (None, "null"):
        return (f"--disaggregation-mode={mode} is not supported with DDTREE (the decode step keeps no "
                "disaggregated draft state); serve without prefill/decode disaggregation")
    return None


def _num_draft_tokens(s: DDTreeSettings, a) -> str | None:
    value = getattr(a, "speculative_num_draft_tokens", None)
    if value is not None and int(value) != s.verify_tokens:
        return (f"--speculative-num-draft-tokens={value} is invalid with DDTREE: the plugin sets it to budget + 1 "
                f"({s.verify_tokens}); remove the flag and set --speculative-ddtree-budget")
    return None


def _simulated_acceptance(s, a) -> str | None:
    value = os.environ.get("SGLANG_SIMULATE_ACC_LEN", "")
    if value not in ("", "-1", "0") and float(value) > 0:
        return f"SGLANG_SIMULATE_ACC_LEN={value} is not supported with DDTREE; unset it"
    return None


def _flags(flags: tuple[tuple[str, str], ...], bad: Callable[[object], bool], message: str) -> Callable:
    """A check over server_args fields: the first (flag, field) whose set value is `bad` gives
    `message` with {flag} and {value} filled in."""
    def check(s, a) -> str | None:
        for flag, field in flags:
            value = getattr(a, field, None)
            if value is not None and bad(value):
                return message.format(flag=flag, value=value)
        return None
    check.__name__ = "_" + flags[0][1]
    return check


def _flag_off(flag: str, field: str, why: str) -> Callable:
    return _flags(((flag, field),), bool,
                  f"{{flag}}={{value}} is not supported with DDTREE ({why}); remove it or serve --speculative-algorithm DFLASH")


def _above_one(flag: str, field: str, why: str) -> Callable:
    return _flags(((flag, field),), lambda v: int(v) > 1, f"{{flag}}={{value}} is not supported with DDTREE ({why}); use 1")


_thresholds = _flags((("--speculative-accept-threshold-single", "speculative_accept_threshold_single"),
                      ("--speculative-accept-threshold-acc", "speculative_accept_threshold_acc")),
                     lambda v: float(v) != 1.0,
                     "{flag}={value} is not supported with DDTREE: its verification is exact (lossless) and has no "
                     "relaxed acceptance; remove the flag")
_eagle_shape = _flags((("--speculative-num-steps", "speculative_num_steps"),
                       ("--speculative-eagle-topk", "speculative_eagle_topk")),
                      lambda v: int(v) != 1,
                      "{flag}={value} does not apply to DDTREE (the tree's shape is --speculative-ddtree-budget and "
                      "--speculative-ddtree-topk-cap); remove the flag")


CHECKS: tuple[Callable, ...] = (
    _ddtree_shape, _num_draft_tokens, _eagle_shape, _page_size, _attention,
    _above_one("--pp-size", "pp_size", "pipeline stages would need the tree relayed between them"),
    _above_one("--attn-dp-size", "attn_dp_size", "data-parallel attention runs idle ranks the tree path does not"),
    _flag_off("--enable-dp-attention", "enable_dp_attention", "data-parallel attention"),
    _flag_off("--speculative-draft-window-size", "speculative_draft_window_size",
              "the compact draft cache is rebuilt block-wide by the parent worker"),
    _flag_off("--speculative-use-block-verification", "speculative_use_block_verification",
              "block verification is a chain verifier"),
    _flag_off("--speculative-adaptive", "speculative_adaptive", "the verify width is fixed at budget + 1"),
    _flag_off("--enable-lora", "enable_lora", "LoRA adapters on the verify pass are untested"),
    _flag_off("--lora-paths", "lora_paths", "LoRA adapters on the verify pass are untested"),
    _flag_off("--enable-two-batch-overlap", "enable_two_batch_overlap", "two-batch overlap splits the verify pass"),
    _flag_off("--enable-mixed-chunk", "enable_mixed_chunk", "prefill chunks mixed into a verify batch"),
    _flag_off("--enable-unified-memory", "enable_unified_memory", "the unified KV pool translates slot ids per step"),
    _flag_off("--enable-return-hidden-states", "enable_return_hidden_states",
              "hidden states of the verify pass are per tree node, not per emitted token"),
    _disaggregation, _thresholds, _simulated_acceptance,
)


def refusals(settings: DDTreeSettings, server_args) -> Iterator[str]:
    """Every unsupported setting's message, in CHECKS order (server_args: SGLang's ServerArgs or alike)."""
    for check in CHECKS:
        message = check(settings, server_args)
        if message:
            yield message


def validate(settings: DDTreeSettings, server_args) -> None:
    """Reject settings the DDTREE worker cannot serve; the first problem is the error."""
    for message in refusals(settings, server_args):
        raise DDTreeConfigError(message)

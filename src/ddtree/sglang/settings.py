"""DDTree settings of an SGLang server and their validation (no SGLang import).

`sglang serve --speculative-ddtree-budget N --speculative-ddtree-topk-cap K` are added to
SGLang's parser by the plugin. ServerArgs.from_cli_args copies only ServerArgs' own fields, so
the plugin copies these two values into the environment (SGLANG_DDTREE_BUDGET,
SGLANG_DDTREE_TOPK_CAP), which the spawned scheduler processes inherit; setting the variables
directly (e.g. in the unit's env file) works too. The draft's block size, resolved at start-up
from `--speculative-dflash-block-size` or the draft's config.json, travels the same way
(SGLANG_DDTREE_BLOCK_SIZE).

How a DDTREE server is sized (plugin.DDTreeSpec.handle_server_args): SGLang's
`speculative_num_draft_tokens` is the verify width budget + 1 (it sizes the KV reservation of a
step, 2 x that width, the target-verify CUDA graphs and the tree-mask buffer), while the draft
keeps its own block (its runner's graphs and its forward). So the draft's block must fit in the
verify window: budget + 1 >= block size.

`refusals(settings, server_args)` lists every server setting the DDTREE decode path does not
cover, each message naming the flag, its value and the fix; `validate` raises the first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ENV_BUDGET = "SGLANG_DDTREE_BUDGET"
ENV_TOPK_CAP = "SGLANG_DDTREE_TOPK_CAP"
ENV_BLOCK_SIZE = "SGLANG_DDTREE_BLOCK_SIZE"
DEFAULT_BUDGET = 32
DEFAULT_TOPK_CAP = 8
MAX_BUDGET = 1023
# attention backends whose target-verify path takes an arbitrary (tree) custom mask in 0.5.23
MASK_BACKENDS = ("triton", "flashinfer")


class DDTreeConfigError(ValueError):
    """A DDTREE server setting that cannot work; the message names the flag, value and fix."""


@dataclass(frozen=True)
class DDTreeSettings:
    budget: int = DEFAULT_BUDGET      # draft-tree nodes verified per step (width budget + 1 with the root)
    topk_cap: int = DEFAULT_TOPK_CAP  # candidates per depth
    block_size: int | None = None     # the draft's block (bonus slot + L = block - 1 depths); None = not resolved yet

    @property
    def verify_tokens(self) -> int:
        """Tokens per request in a target-verify pass (and its CUDA graphs): budget + 1."""
        return self.budget + 1

    @classmethod
    def from_env(cls, env=None) -> "DDTreeSettings":
        env = os.environ if env is None else env
        block = _int(env, ENV_BLOCK_SIZE, None, "--speculative-dflash-block-size")
        return cls(budget=_int(env, ENV_BUDGET, DEFAULT_BUDGET, "--speculative-ddtree-budget"),
                   topk_cap=_int(env, ENV_TOPK_CAP, DEFAULT_TOPK_CAP, "--speculative-ddtree-topk-cap"),
                   block_size=block)

    def to_env(self, env=None) -> None:
        env = os.environ if env is None else env
        env[ENV_BUDGET] = str(self.budget)
        env[ENV_TOPK_CAP] = str(self.topk_cap)
        if self.block_size is not None:
            env[ENV_BLOCK_SIZE] = str(self.block_size)

    def resolved_block(self) -> int:
        """The draft block; raises when the plugin's start-up resolution did not run."""
        if self.block_size is None:
            raise DDTreeConfigError(f"{ENV_BLOCK_SIZE} is not set: the DDTREE server arguments were not resolved by "
                                    "the k26-ddtree plugin (start the server with `sglang serve`, the plugin "
                                    "installed, and --speculative-algorithm DDTREE)")
        return self.block_size


def _int(env, name: str, default, flag: str):
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DDTreeConfigError(f"{flag} ({name})={raw!r} is invalid: expected an integer") from None


def draft_block_size(draft_path: str | os.PathLike | None) -> int | None:
    """The block size in a DFlash draft's config.json (dflash_config.block_size, else block_size)."""
    if draft_path is None:
        return None
    file = Path(draft_path) / "config.json"
    try:
        cfg = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    block = (cfg.get("dflash_config") or {}).get("block_size", cfg.get("block_size"))
    return int(block) if block is not None else None


# --- start-up refusals: each takes (settings, server_args) and returns a message or None ---------

def _budget(s: DDTreeSettings, a) -> str | None:
    if not 1 <= s.budget <= MAX_BUDGET:
        return (f"--speculative-ddtree-budget={s.budget} is invalid: expected 1..{MAX_BUDGET} "
                "(32 is the tested default)")
    return None


def _cap(s: DDTreeSettings, a) -> str | None:
    if not 1 <= s.topk_cap <= s.budget:
        return (f"--speculative-ddtree-topk-cap={s.topk_cap} is invalid: expected 1..budget ({s.budget}); "
                "8 is the tested default")
    return None


def _block_fits(s: DDTreeSettings, a) -> str | None:
    if s.block_size is not None and s.block_size < 2:
        return f"--speculative-dflash-block-size={s.block_size} is invalid: a DFlash block holds the bonus token and >= 1 depth"
    if s.block_size is not None and s.verify_tokens < s.block_size:
        return (f"--speculative-ddtree-budget={s.budget} is invalid with block size {s.block_size}: the draft's block "
                f"must fit in the verify window (budget + 1 >= block size); use a budget >= {s.block_size - 1} "
                f"({s.block_size - 1} with --speculative-ddtree-topk-cap 1 is the DFlash chain)")
    return None


def _page_size(s, a) -> str | None:
    page = getattr(a, "page_size", None)
    if page not in (None, 1):
        return (f"--page-size={page} is invalid for DDTREE: the accepted tree path is kept by rewriting the "
                "request's token table slot by slot; use --page-size 1")
    return None


def _overlap(s, a) -> str | None:
    if not getattr(a, "disable_overlap_schedule", False):
        return "DDTREE runs without the overlap scheduler: add --disable-overlap-schedule"
    return None


def _attention(s, a) -> str | None:
    backend = getattr(a, "attention_backend", None)
    if backend not in MASK_BACKENDS:
        return (f"--attention-backend={backend} cannot verify a tree (no custom-mask verify path, or left to SGLang's "
                f"automatic choice); use one of {', '.join(MASK_BACKENDS)} (triton on sm_120 for MLA)")
    return None


def _flag_off(flag: str, field: str, why: str) -> Callable:
    def check(s, a) -> str | None:
        value = getattr(a, field, None)
        if value:
            return f"{flag}={value} is not supported with DDTREE ({why}); remove it or serve --speculative-algorithm DFLASH"
        return None
    check.__name__ = f"_{field}"
    return check


def _above_one(flag: str, field: str, why: str) -> Callable:
    def check(s, a) -> str | None:
        value = getattr(a, field, None)
        if value is not None and int(value) > 1:
            return f"{flag}={value} is not supported with DDTREE ({why}); use 1"
        return None
    check.__name__ = f"_{field}"
    return check


def _disaggregation(s, a) -> str | None:
    mode = getattr(a, "disaggregation_mode", None)
    if mode not in (None, "null"):
        return (f"--disaggregation-mode={mode} is not supported with DDTREE (the decode step keeps no "
                "disaggregated draft state); serve without prefill/decode disaggregation")
    return None


def _thresholds(s, a) -> str | None:
    for flag, field in (("--speculative-accept-threshold-single", "speculative_accept_threshold_single"),
                        ("--speculative-accept-threshold-acc", "speculative_accept_threshold_acc")):
        value = getattr(a, field, None)
        if value is not None and float(value) != 1.0:
            return (f"{flag}={value} is not supported with DDTREE: its verification is exact (lossless) and has no "
                    "relaxed acceptance; remove the flag")
    return None


def _num_draft_tokens(s: DDTreeSettings, a) -> str | None:
    value = getattr(a, "speculative_num_draft_tokens", None)
    if value is not None and int(value) != s.verify_tokens:
        return (f"--speculative-num-draft-tokens={value} is invalid with DDTREE: the plugin sets it to budget + 1 "
                f"({s.verify_tokens}); remove the flag and set --speculative-ddtree-budget")
    return None


def _eagle_shape(s, a) -> str | None:
    for flag, field in (("--speculative-num-steps", "speculative_num_steps"),
                        ("--speculative-eagle-topk", "speculative_eagle_topk")):
        value = getattr(a, field, None)
        if value is not None and int(value) != 1:
            return (f"{flag}={value} does not apply to DDTREE (the tree's shape is --speculative-ddtree-budget and "
                    "--speculative-ddtree-topk-cap); remove the flag")
    return None


def _simulated_acceptance(s, a) -> str | None:
    value = os.environ.get("SGLANG_SIMULATE_ACC_LEN", "")
    if value not in ("", "-1", "0") and float(value) > 0:
        return f"SGLANG_SIMULATE_ACC_LEN={value} is not supported with DDTREE; unset it"
    return None


CHECKS: tuple[Callable, ...] = (
    _budget, _cap, _block_fits, _num_draft_tokens, _eagle_shape, _page_size, _overlap, _attention,
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

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

from ddtree.settings import (DEFAULT_BUDGET, DEFAULT_TOPK_CAP, SERVER_FLAGS, DDTreeConfigError, DDTreeSettings,
                             Schedule, parse_schedule, schedule_problems)

ENV_BUDGET = "SGLANG_DDTREE_BUDGET"
ENV_TOPK_CAP = "SGLANG_DDTREE_TOPK_CAP"
ENV_BLOCK_SIZE = "SGLANG_DDTREE_BLOCK_SIZE"
# the overlap scheduler for DDTREE (issue 35): allowed only with this set to 1 until the GPU test bed has shown
# DDTREE lossless under it (tests/gpu_sglang/test_overlap.py); refused at start-up otherwise
ENV_OVERLAP = "SGLANG_DDTREE_OVERLAP"


def overlap_allowed(env=None) -> bool:
    env = os.environ if env is None else env
    return env.get(ENV_OVERLAP) == "1"


# a budget / cap schedule by running batch size (issue 32): allowed only with this set to 1 until the GPU test
# bed has shown DDTREE lossless and its graphs replayed at every width (tests/gpu_sglang/test_widths.py)
ENV_SCHEDULE = "SGLANG_DDTREE_SCHEDULE"


@dataclass(frozen=True)
class WidthSchedule:
    """The budget and the top-k cap by running batch size (one step each for a plain value). The server is
    sized for the widest step (widest()); a decode step of b requests uses at(b)."""

    budget: Schedule
    topk_cap: Schedule

    def at(self, batch: int) -> tuple[int, int]:
        """(budget, cap) for a running batch of `batch` requests."""
        return self.budget.at(batch), self.topk_cap.at(batch)

    def widest(self, block_size: int | None = None) -> DDTreeSettings:
        return DDTreeSettings(max(self.budget.values), max(self.topk_cap.values), block_size)

    @property
    def stepped(self) -> bool:
        return len(self.budget.steps) > 1 or len(self.topk_cap.steps) > 1

    @property
    def widths(self) -> tuple[int, ...]:
        """The verify widths (budget + 1) the schedule can produce, ascending."""
        return tuple(sorted({b + 1 for b in self.budget.values}))

    def batches_at_width(self, width: int, max_bs: int) -> list[int]:
        """The running batch sizes 1..max_bs whose step verifies `width` tokens per request."""
        return [b for b in range(1, max_bs + 1) if self.budget.at(b) + 1 == width]

    def problems(self, block_size: int | None) -> list[str]:
        return schedule_problems(self.budget, self.topk_cap, block_size, SERVER_FLAGS)

    def __str__(self) -> str:
        return f"budget {self.budget} cap {self.topk_cap}"
# attention backends whose target-verify path takes an arbitrary (tree) custom mask in 0.5.23
MASK_BACKENDS = ("triton", "flashinfer")
# of those, the ones DDTREE was proven with on an MLA target (tests/gpu_sglang/test_kimi_path.py)
MLA_MASK_BACKENDS = ("triton",)


def schedule_from_env(env=None) -> WidthSchedule:
    """The budget and cap the plugin passed to SGLang's processes: `32` or `1:64,8:32,32:8` each (defaults where
    a variable is unset)."""
    env = os.environ if env is None else env
    return WidthSchedule(budget=_schedule(env, ENV_BUDGET, DEFAULT_BUDGET, SERVER_FLAGS.budget),
                         topk_cap=_schedule(env, ENV_TOPK_CAP, DEFAULT_TOPK_CAP, SERVER_FLAGS.topk_cap))


def from_env(env=None) -> DDTreeSettings:
    """The settings the server is sized for: the widest budget and cap of the schedule, the draft's block."""
    env = os.environ if env is None else env
    return schedule_from_env(env).widest(_int(env, ENV_BLOCK_SIZE, None, SERVER_FLAGS.block_size))


def schedule_to_env(budget: object, topk_cap: object, env=None) -> None:
    """The flags' values as given (`32` or a schedule), for the schedulers; checked when the server validates."""
    env = os.environ if env is None else env
    env[ENV_BUDGET] = str(budget).strip()
    env[ENV_TOPK_CAP] = str(topk_cap).strip()


def block_to_env(block_size: int, env=None) -> None:
    env = os.environ if env is None else env
    env[ENV_BLOCK_SIZE] = str(block_size)


def resolved_block(settings: DDTreeSettings) -> int:
    """The draft block; raises when the plugin's start-up resolution did not run."""
    if settings.block_size is None:
        raise DDTreeConfigError(f"{ENV_BLOCK_SIZE} is not set: the DDTREE server arguments were not resolved by "
                                "the k26-ddtree plugin (start the server with `sglang serve`, the plugin "
                                "installed, and --speculative-algorithm DDTREE)")
    return settings.block_size


def _schedule(env, name: str, default: int, flag: str) -> Schedule:
    raw = (env.get(name) or "").strip()
    if not raw:
        return Schedule(((1, default),))
    if ":" in raw:
        return parse_schedule(raw, f"{flag} ({name})")
    return Schedule(((1, _int(env, name, default, flag)),))


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

def _ddtree_shape(s: DDTreeSettings, a) -> str | None:
    """budget, top-k cap and block size against each other (ddtree.settings holds the rules), at every step
    of a schedule."""
    schedule = schedule_from_env()
    problems = schedule.problems(s.block_size) if schedule.stepped else s.problems(SERVER_FLAGS)
    return problems[0] if problems else None


def _schedule_switch(s, a) -> str | None:
    schedule = schedule_from_env()
    if schedule.stepped and os.environ.get(ENV_SCHEDULE) != "1":
        return (f"a DDTree {schedule} by running batch size is not yet verified inside SGLang (the GPU test bed has "
                f"not run it): give --speculative-ddtree-budget and --speculative-ddtree-topk-cap one value each, "
                f"or set {ENV_SCHEDULE}=1 to run it anyway")
    return None


def _page_size(s, a) -> str | None:
    page = getattr(a, "page_size", None)
    if page not in (None, 1):
        return (f"--page-size={page} is invalid for DDTREE: the accepted tree path is kept by rewriting the "
                "request's token table slot by slot; use --page-size 1")
    return None


def _overlap(s, a) -> str | None:
    if not getattr(a, "disable_overlap_schedule", False) and not overlap_allowed():
        return (f"DDTREE runs without the overlap scheduler: add --disable-overlap-schedule ({ENV_OVERLAP}=1 lets it "
                "run under the overlap scheduler, which the GPU test bed has not yet shown lossless)")
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
    _ddtree_shape, _schedule_switch, _num_draft_tokens, _eagle_shape, _page_size, _overlap, _attention,
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

"""DDTree settings of an SGLang server and their validation (no SGLang import).

`sglang serve --speculative-ddtree-budget N --speculative-ddtree-topk-cap K` are added to
SGLang's parser by the plugin. ServerArgs.from_cli_args copies only ServerArgs' own fields, so
the plugin copies these two values into the environment (SGLANG_DDTREE_BUDGET,
SGLANG_DDTREE_TOPK_CAP), which the spawned scheduler processes inherit; setting the variables
directly (e.g. in the unit's env file) works too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_BUDGET = "SGLANG_DDTREE_BUDGET"
ENV_TOPK_CAP = "SGLANG_DDTREE_TOPK_CAP"
DEFAULT_BUDGET = 32
DEFAULT_TOPK_CAP = 8
# attention backends whose target-verify path takes an arbitrary (tree) custom mask
MASK_BACKENDS = ("triton", "flashinfer")


class DDTreeConfigError(ValueError):
    """A DDTREE server setting that cannot work; the message names the flag, value and fix."""


@dataclass(frozen=True)
class DDTreeSettings:
    budget: int = DEFAULT_BUDGET      # draft-tree nodes verified per step (width budget + 1 with the root)
    topk_cap: int = DEFAULT_TOPK_CAP  # candidates per depth

    @property
    def verify_tokens(self) -> int:
        """Tokens per request in a target-verify pass (and its CUDA graphs): budget + 1."""
        return self.budget + 1

    @classmethod
    def from_env(cls, env=None) -> "DDTreeSettings":
        env = os.environ if env is None else env
        return cls(budget=_int(env, ENV_BUDGET, DEFAULT_BUDGET, "--speculative-ddtree-budget"),
                   topk_cap=_int(env, ENV_TOPK_CAP, DEFAULT_TOPK_CAP, "--speculative-ddtree-topk-cap"))

    def to_env(self, env=None) -> None:
        env = os.environ if env is None else env
        env[ENV_BUDGET] = str(self.budget)
        env[ENV_TOPK_CAP] = str(self.topk_cap)


def _int(env, name: str, default: int, flag: str) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DDTreeConfigError(f"{flag} ({name})={raw!r} is invalid: expected an integer") from None


def validate(settings: DDTreeSettings, server_args) -> None:
    """Reject settings the DDTREE worker cannot serve (server_args: SGLang's ServerArgs or alike)."""
    if settings.budget < 1 or settings.budget > 1023:
        raise DDTreeConfigError(f"--speculative-ddtree-budget={settings.budget} is invalid: expected 1..1023 "
                                "(32 is the tested default)")
    if not 1 <= settings.topk_cap <= settings.budget:
        raise DDTreeConfigError(f"--speculative-ddtree-topk-cap={settings.topk_cap} is invalid: expected "
                                f"1..budget ({settings.budget}); 8 is the tested default")
    page = getattr(server_args, "page_size", None)
    if page not in (None, 1):
        raise DDTreeConfigError(f"--page-size={page} is invalid for DDTREE: the accepted tree path is kept by "
                                "rewriting the request's token table slot by slot; use --page-size 1")
    if not getattr(server_args, "disable_overlap_schedule", False):
        raise DDTreeConfigError("DDTREE runs without the overlap scheduler: add --disable-overlap-schedule")
    backend = getattr(server_args, "attention_backend", None)
    if backend is not None and backend not in MASK_BACKENDS:
        raise DDTreeConfigError(f"--attention-backend={backend} cannot verify a tree (no custom-mask verify "
                                f"path); use one of {', '.join(MASK_BACKENDS)} (triton on sm_120 for MLA)")

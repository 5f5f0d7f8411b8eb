"""What the plugin passes to SGLang's processes through the environment (no SGLang import).

`sglang serve --speculative-ddtree-budget N --speculative-ddtree-topk-cap K` are added to SGLang's parser by the
plugin. ServerArgs.from_cli_args copies only ServerArgs' own fields, so the plugin copies these two values into
the environment (SGLANG_DDTREE_BUDGET, SGLANG_DDTREE_TOPK_CAP), which the spawned scheduler processes inherit;
setting the variables directly (e.g. in the unit's env file) works too. The draft's block size, resolved at
start-up from `--speculative-dflash-block-size` or the draft's config.json, travels the same way
(SGLANG_DDTREE_BLOCK_SIZE). The variables are declared in ddtree.switches; this module parses the three
that carry flags, naming the flag in its messages.

How a DDTREE server is sized (plugin.DDTreeSpec.handle_server_args): SGLang's `speculative_num_draft_tokens`
is the verify width budget + 1 (it sizes the KV reservation of a step, 2 x that width, the target-verify CUDA
graphs and the tree-mask buffer), while the draft keeps its own block (its runner's graphs and its forward).
So the draft's block must fit in the verify window: budget + 1 >= block size.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ddtree.settings import (DEFAULT_BUDGET, DEFAULT_TOPK_CAP, SERVER_FLAGS, DDTreeConfigError, DDTreeSettings,
                             Schedule, WidthSchedule, is_auto, parse_auto, parse_schedule)
from ddtree import switches

# the variables' names (declared with their kinds and meanings in ddtree.switches)
ENV_BUDGET, ENV_TOPK_CAP, ENV_BLOCK_SIZE = (switches.NAME[f] for f in ("budget", "topk_cap", "block_size"))


def schedule_from_env(env=None) -> WidthSchedule:
    """The budget and cap the plugin passed to SGLang's processes: `32` or `1:64,8:32,32:8` each, or the budget
    `auto[:B1,B2,..]` (the width policy's trees; defaults where a variable is unset)."""
    return schedule_of(switches.read(env))


def schedule_of(read: switches.Switches) -> WidthSchedule:
    """schedule_from_env from switches already read (the worker reads the environment once)."""
    cap = _schedule(read.topk_cap, ENV_TOPK_CAP, DEFAULT_TOPK_CAP, SERVER_FLAGS.topk_cap)
    if is_auto(read.budget):                     # the width policy: sized for its widest tree, the chain beside
        auto = parse_auto(read.budget, f"{SERVER_FLAGS.budget} ({ENV_BUDGET})")
        block = _int(read.block_size, ENV_BLOCK_SIZE, None, SERVER_FLAGS.block_size)
        return WidthSchedule(budget=Schedule(((1, auto[-1]),)), topk_cap=cap, auto=auto,
                             chain=block - 1 if block is not None else None)
    return WidthSchedule(budget=_schedule(read.budget, ENV_BUDGET, DEFAULT_BUDGET, SERVER_FLAGS.budget), topk_cap=cap)


def from_env(env=None) -> DDTreeSettings:
    """The settings the server is sized for: the widest budget and cap of the schedule, the draft's block."""
    return settings_of(switches.read(env))


def settings_of(read: switches.Switches) -> DDTreeSettings:
    """from_env from switches already read."""
    return schedule_of(read).widest(_int(read.block_size, ENV_BLOCK_SIZE, None, SERVER_FLAGS.block_size))


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


def _schedule(raw: str, name: str, default: int, flag: str) -> Schedule:
    raw = raw.strip()
    if not raw:
        return Schedule(((1, default),))
    if ":" in raw:
        return parse_schedule(raw, f"{flag} ({name})")
    return Schedule(((1, _int(raw, name, default, flag)),))


def _int(raw: str, name: str, default, flag: str):
    if raw == "":
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

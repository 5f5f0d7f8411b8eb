"""Every `DDTREE_*` and `SGLANG_DDTREE_*` variable, declared once (issues 46 and 73): the core's two (the kernels'
backend and the debug checks) and the SGLang plugin's. Plain Python, the core's lowest layer but `settings`.

SGLang keeps its own environment the same way (`sglang/srt/environ.py`: typed fields read through one
object). Each Switch names its variable, the Switches field it fills, its kind, its default and its meaning;
`read(environ)` parses them all into a frozen Switches (a bad value raises DDTreeConfigError naming the
variable, the value and what it takes). Each process reads them where it starts: the plugin's start-up
hooks and refusals, the worker's __init__ (which keeps the object for its decode steps); the core reads its own one
at a time where it is used (`one`), as tests and the reference engine set them per process.

Three of them carry the server's own flags to SGLang's spawned scheduler processes (the budget, the cap and
the draft's block, written by the plugin's start-up hooks: settings.schedule_to_env / block_to_env); they are
read as text here and parsed by ddtree.sglang.setup.server_env, whose messages name the flag. A test holds every
`DDTREE_*` / `SGLANG_DDTREE_*` name the source reads to this registry, and docs/plugin.md's table of switches and
the Ansible input filter's test-bed-only list to SWITCHES (tests/unit/test_switches.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ddtree.settings import DDTreeConfigError

ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


@dataclass(frozen=True)
class Switch:
    """One variable: its name, the Switches field it fills, how its text is read, its default and meaning."""

    name: str
    field: str
    kind: str            # "flag" | "text" | "count" (>= 1) | "steps" (>= 0, 0 = off) | "choice" | "folder" | "file"
    default: str         # the value an unset (or empty) variable stands for, as text; "" = off / none
    meaning: str
    choices: tuple[str, ...] = ()
    test_bed_only: bool = False      # a diagnostic of the GPU test bed: preflight refuses it in k26_service_env

    def expects(self) -> str:
        return {"flag": "1 or 0 (on / off, true / false, yes / no too)",
                "text": "a value for the flag it carries (checked by the server's start-up)",
                "count": "a whole number >= 1",
                "steps": "a whole number of steps (0 = off)",
                "choice": f"one of {', '.join(self.choices)}",
                "folder": "an absolute folder path",
                "file": "an absolute file path"}[self.kind]

    def parse(self, raw: str) -> object:
        """The field's value for the variable's text (the default's when empty); ValueError when it is invalid."""
        text = raw.strip() or self.default
        reader = _READERS[self.kind]
        return reader(self, text)


def _flag(switch: Switch, text: str) -> bool:
    value = text.lower()
    if value not in ON + OFF:
        raise ValueError(text)
    return value in ON


def _text(switch: Switch, text: str) -> str:
    return text


def _count(switch: Switch, text: str) -> int | None:
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(text)
    return int(text)


def _steps(switch: Switch, text: str) -> int | None:
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(text)
    return int(text) or None


def _choice(switch: Switch, text: str) -> str | None:
    if not text:
        return None
    if text not in switch.choices:
        raise ValueError(text)
    return text


def _folder(switch: Switch, text: str) -> Path | None:
    if not text:
        return None
    if not Path(text).is_absolute():
        raise ValueError(text)
    return Path(text)


_READERS: dict[str, Callable[[Switch, str], object]] = {
    "flag": _flag, "text": _text, "count": _count, "steps": _steps, "choice": _choice, "folder": _folder,
    "file": _folder}


SWITCHES: tuple[Switch, ...] = (
    # the core's (ddtree.backend, ddtree._checks): every engine and server that builds or verifies a tree
    Switch("DDTREE_BACKEND", "backend", "choice", "auto",
           "the tree build and verify stages: auto (Triton on CUDA when it imports, else torch), torch or triton",
           choices=("auto", "torch", "triton")),
    Switch("DDTREE_DEBUG", "debug", "flag", "off",
           "test bed: value checks that read GPU tensors (NaN scans; each one a device wait), never inside a CUDA "
           "graph capture", test_bed_only=True),
    # the tree's shape: written by the plugin's start-up hooks from the server's flags and the draft's config
    Switch("SGLANG_DDTREE_BUDGET", "budget", "text", "",
           "--speculative-ddtree-budget as given (a number or a schedule by running batch size); the plugin "
           "writes it"),
    Switch("SGLANG_DDTREE_TOPK_CAP", "topk_cap", "text", "",
           "--speculative-ddtree-topk-cap as given; the plugin writes it"),
    Switch("SGLANG_DDTREE_BLOCK_SIZE", "block_size", "text", "",
           "the draft's block size, resolved at start-up; the plugin writes it"),
    # checks an operator may run on any host
    Switch("SGLANG_DDTREE_GRAPH_CHECK", "graph_check", "flag", "on",
           "the first replay of each decode CUDA graph shape checks the step's inputs against the captured "
           "buffers (a missing or misshaped field raises, naming it)"),
    Switch("SGLANG_DDTREE_SYNC_CHECK", "sync_check", "choice", "",
           "each decode step runs under torch's CUDA sync debug mode: warn logs each synchronising call "
           "site once, error raises", choices=("warn", "error")),
    Switch("SGLANG_DDTREE_COST_TABLE", "cost_table", "file", "",
           "with --speculative-ddtree-budget auto: the step costs the width policy prices its widths by, a sweep's "
           "measured table (JSON: verify_ms [[batch, width, ms], ..], draft_ms [[batch, ms], ..]) instead of the "
           "graphs timed at start-up"),
    Switch("SGLANG_DDTREE_COST_LEARN", "cost_learn", "flag", "on",
           "with --speculative-ddtree-budget auto: each option's step cost is the table's corrected by the server's "
           "own measured steps (per option and batch band; an option not run for a while is run once to be "
           "measured again); off prices the widths by the table alone"),
    Switch("SGLANG_DDTREE_PROFILE_STEPS", "profile_steps", "steps", "",
           "every N decode steps, one step timed stage by stage (the device synchronised between stages)"),
    # test bed only (preflight refuses them in k26_service_env)
    Switch("SGLANG_DDTREE_DUMP", "dump", "folder", "",
           "test bed: each step's tree, verify log-probs and committed KV written under this folder",
           test_bed_only=True),
    Switch("SGLANG_DDTREE_DUMP_STEPS", "dump_steps", "count", "400", "test bed: how many steps the dump keeps",
           test_bed_only=True),
    Switch("SGLANG_DDTREE_FAULT", "fault", "choice", "",
           "test bed: a deliberate fault (sibling: earlier siblings visible in the verify mask; stale-penalties: "
           "every node penalised with the step start's counts, not its own path's; drop-leaf: every step's tree "
           "without its last node, a chain one token short of DFLASH's)",
           choices=("sibling", "stale-penalties", "drop-leaf"), test_bed_only=True),
)
NAME = {s.field: s.name for s in SWITCHES}      # field -> variable, for messages


@dataclass(frozen=True)
class Switches:
    """The variables as read once (SWITCHES says what each holds)."""

    backend: str = "auto"
    debug: bool = False
    budget: str = ""
    topk_cap: str = ""
    block_size: str = ""
    graph_check: bool = True
    sync_check: str | None = None
    cost_table: Path | None = None
    cost_learn: bool = True
    profile_steps: int | None = None
    dump: Path | None = None
    dump_steps: int = 400
    fault: str | None = None


BY_FIELD = {s.field: s for s in SWITCHES}


def read(environ: Mapping[str, str] | None = None) -> Switches:
    """Every switch from `environ` (default: this process's environment, read now); the first bad value raises."""
    environ = os.environ if environ is None else environ
    return Switches(**{s.field: _value(s, environ) for s in SWITCHES})


def one(field: str, environ: Mapping[str, str] | None = None) -> object:
    """One switch's value from `environ` (default: this process's environment, read now); a bad value raises as
    read() does."""
    return _value(BY_FIELD[field], os.environ if environ is None else environ)


def _value(switch: Switch, environ: Mapping[str, str]) -> object:
    raw = environ.get(switch.name, "")
    try:
        return switch.parse(raw)
    except ValueError:
        raise DDTreeConfigError(f"{switch.name}={raw!r} is invalid: expected {switch.expects()} ({switch.meaning}); "
                                "fix the server's environment (the unit's env file)") from None


def table() -> str:
    """docs/plugin.md's table of switches (tests/unit/test_switches.py holds it to the registry): `python -m
    ddtree.switches` prints it."""
    rows = ["| variable | takes | unset means | what it does |", "|---|---|---|---|"]
    for s in SWITCHES:
        unset = {"": "off" if s.kind in ("flag", "choice", "steps", "folder", "file") else "-"}.get(s.default,
                                                                                                     s.default)
        rows.append(f"| `{s.name}` | {s.expects()} | {unset} | {s.meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())

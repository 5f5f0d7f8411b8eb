"""A snapshot's unit and env file read back into the inputs a deploy would have given (`k26_snapshot_inputs`), so a
restored snapshot goes through the deploy's rules. The unit is read through the flag map the unit template renders
through (templates/etc/systemd/system/k26-ddtree.flags.yml); ENV_TEMPLATE_NAMES are the names the env template writes
itself.
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import NamedTuple

import yaml


# A snapshot's unit and env file back into the inputs a deploy would have given (issue 48: a restored snapshot goes
# through the same rules as a deploy). The unit template renders these flags from these variables, then the flags it
# renders from no variable, then k26_extra_args; the env template writes its own names, then k26_service_env.
class UnitMap(NamedTuple):      # a NamedTuple: Ansible loads this file outside sys.modules, where a dataclass fails
    flags: dict          # flag -> the variable its value is (valued)
    switches: dict       # flag -> the variable it stands for when present (true)
    fixed: frozenset     # (flag,) or (flag, value) the template writes from no variable
    directives: dict     # [Service] directive -> variable


FLAG_MAP_FILE = Path(__file__).resolve().parents[3] / "templates/etc/systemd/system/k26-ddtree.flags.yml"


@functools.lru_cache(maxsize=1)
def unit_map() -> UnitMap:
    """The unit's flag map (FLAG_MAP_FILE, the one file the unit template renders through: issue 73), read once."""
    data = yaml.safe_load(FLAG_MAP_FILE.read_text())
    return UnitMap(flags={flag: name for name, flag in data["valued"].items()},
                   switches={flag: name for name, flag in data["switches"].items()},
                   fixed=frozenset(tuple(words) for words in data["fixed"]),
                   directives=dict(data["directives"]))


ENV_TEMPLATE_NAMES = {"HOME", "PATH", "SGLANG_CACHE_DIR", "HF_HOME", "TRITON_CACHE_DIR", "K26_API_KEY", "K26_URL"}


def _unit_words(text: str) -> list[str]:
    """ExecStart's words (continuation lines joined, systemd's quoting and %% / $$ undone)."""
    lines, found = [], False
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            found, line = True, line[len("ExecStart="):]
        elif not found:
            continue
        lines.append(line.rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            break
    words = shlex.split(" ".join(lines), posix=True)
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


def _unit_args(words: list[str]) -> tuple[dict, list[str]]:
    """(the variables the template's own flags give, the k26_extra_args items) of ExecStart's words after the exe.
    Everything from the first word the template does not render on is an extra arg (a template flag given twice too:
    the args rule refuses it)."""
    values: dict = {}
    extra: list[str] = []
    index, known = 0, unit_map()
    while index < len(words):
        word = words[index]
        following = words[index + 1] if index + 1 < len(words) else None
        takes_value = following is not None and not following.startswith("--")
        ours = not extra
        if ours and (word, following) in known.fixed:
            index += 2
        elif ours and (word,) in known.fixed:
            index += 1
        elif ours and not takes_value and known.switches.get(word) and known.switches[word] not in values:
            values[known.switches[word]] = True
            index += 1
        elif ours and takes_value and known.flags.get(word) and known.flags[word] not in values:
            values[known.flags[word]] = following
            index += 2
        elif (ours and takes_value and word == "--config" and "k26_config_dir" not in values
              and following.endswith("/k26-ddtree.yaml")):
            values["k26_config_dir"] = following[:-len("/k26-ddtree.yaml")]
            index += 2
        else:
            extra.append(f"{word} {following}" if takes_value else word)
            index += 2 if takes_value else 1
    return values, extra


def k26_snapshot_inputs(unit_text, env_text) -> dict:
    """The inputs a snapshot's unit (UNIT_TEXT) and env file (ENV_TEXT, its redacted lines filled) stand for."""
    values: dict = {}
    directives = unit_map().directives
    for line in str(unit_text).splitlines():
        key, sep, value = line.partition("=")
        if sep and key in directives:
            values[directives[key]] = value.strip()
        elif sep and key == "DeviceAllow":
            values.setdefault("k26_device_allow", []).append(value.strip())
    words = _unit_words(str(unit_text))
    start = 2 if len(words) > 1 and words[1] == "serve" else 1
    values["k26_server_kind"] = "sglang" if start == 2 else "reference"
    flags, extra = _unit_args(words[start:])
    values.update(flags)
    values["k26_extra_args"] = extra
    env = {}
    for line in str(env_text).splitlines():
        name, sep, value = line.partition("=")
        if not sep or line.lstrip().startswith("#") or name in ENV_TEMPLATE_NAMES:
            continue
        env[name] = shlex.split(value)[0] if value.startswith('"') else value
    values["k26_service_env"] = env
    return values


class FilterModule:
    def filters(self):
        return {"k26_snapshot_inputs": k26_snapshot_inputs}

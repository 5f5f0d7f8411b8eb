"""Every operator-set variable's rule, and the quoting of the values that reach systemd's files.

Preflight's input checks: every operator-set variable that reaches the unit, the env file or a
command, by type and pattern, each failure naming the variable, the value and the fix.
The templates' second wall: `k26_exec_word` (one word of the unit's ExecStart) and
`k26_env_value` (one value of an EnvironmentFile) quote by systemd's rules whatever is not a
SAFE_WORD, the same pattern preflight holds values to. (In roles/k26_defaults: every role depends
on it, so the filters are there for preflight's checks and the service role's templates alike.)

`{{ values | k26_input_errors(spec) }}` -> a list of messages (empty when all pass). `values` maps a
variable name to its value (only variables the inventory, group vars or -e set; the roles' own
defaults are constants of this repository); `spec` is roles/preflight/vars/main.yml's
`_preflight_inputs` (kind and limits per variable).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping

# One word on a systemd command line or in an env file without quoting: no whitespace, quotes,
# backslashes, `$` (systemd expands it), `%` (specifiers), `;` or control characters.
SAFE_WORD = re.compile(r"[A-Za-z0-9._:/,=@+-]+")
PATH = re.compile(r"/[A-Za-z0-9._/+@-]*")
HOSTNAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
UNIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")
FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
ENV_VALUE = re.compile(r"[A-Za-z0-9._:/,=@+ -]*")
API_KEY = re.compile(r"[A-Za-z0-9._~+/=-]+")
BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
MAX_ARGS = 64


def _int(value, rule: Mapping) -> str | None:
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]+", str(value).strip()):
        return f"expected an integer {_range(rule)}"
    number = int(str(value).strip())
    low, high = rule.get("min"), rule.get("max")
    if (low is not None and number < low) or (high is not None and number > high):
        return f"expected an integer {_range(rule)}"
    return None


def _range(rule: Mapping) -> str:
    return f"{rule.get('min', 0)}..{rule['max']}" if "max" in rule else f">= {rule.get('min', 0)}"


def _number(value, rule: Mapping) -> str | None:
    try:
        number = float(str(value).strip())
    except ValueError:
        number = None
    if isinstance(value, bool) or number is None or number != number:
        return f"expected a number {_range(rule)}"
    if number < rule.get("min", float("-inf")) or number > rule.get("max", float("inf")):
        return f"expected a number {_range(rule)}"
    return None


def _text(value, rule: Mapping) -> str | None:
    """Free text passed as one argument (never through a shell): printable, one line, bounded."""
    limit = rule.get("max_chars", 1000)
    if not isinstance(value, str) or not value.strip() or len(value) > limit or not value.isprintable():
        return f"expected 1..{limit} printable characters on one line"
    return None


def _bool(value, rule: Mapping) -> str | None:
    if isinstance(value, bool) or str(value).strip().lower() in BOOLS:
        return None
    return "expected true or false"


def _path(value, rule: Mapping) -> str | None:
    text = str(value)
    if text == "" and rule.get("empty_ok"):
        return None
    if not PATH.fullmatch(text) or "/../" in text + "/" or len(text) > 4096:
        return "expected an absolute path of letters, digits and ._/+@- (no spaces, quotes, $ or %, no ..)"
    return None


def _host(value, rule: Mapping) -> str | None:
    text = str(value)
    try:
        ipaddress.ip_address(text)
        return None
    except ValueError:
        pass
    if HOSTNAME.fullmatch(text):
        return None
    return "expected an IPv4 or IPv6 address or a DNS name (no spaces, no flags)"


def _pattern(regex: re.Pattern, what: str) -> Callable:
    def check(value, rule: Mapping) -> str | None:
        return None if isinstance(value, str) and regex.fullmatch(value) else f"expected {what}"
    return check


def _choice(value, rule: Mapping) -> str | None:
    """One of `choices`; `lower: true` compares lower-cased text (YAML's true/false and 'true'/'false')."""
    choices = [str(c) for c in rule["choices"]]
    given = str(value).lower() if rule.get("lower") else value
    if given in choices:
        return None
    return "expected " + (" or ".join(choices) if len(choices) <= 2 else ", ".join(choices[:-1]) + " or " + choices[-1])


def _args(value, rule: Mapping) -> str | None:
    """A list of '--flag', '--flag value' or '--flag=value' items (one word of value each)."""
    if not isinstance(value, list):
        return "expected a list of '--flag' or '--flag value' strings"
    if len(value) > MAX_ARGS:
        return f"expected at most {MAX_ARGS} items"
    for index, item in enumerate(value):
        if not isinstance(item, str):
            return f"item {index} ({item!r}) is not a string"
        flag, _, rest = item.partition("=") if "=" in item.split(" ", 1)[0] else item.partition(" ")
        if not FLAG.fullmatch(flag):
            return f"item {index} ({item!r}) does not start with a --flag of lower-case letters, digits and -"
        if rest and not SAFE_WORD.fullmatch(rest):
            return (f"item {index} ({item!r}): the value after the flag must be one word of letters, digits and "
                    "._:/,=@+- (no spaces, quotes, $, % or ;)")
    return None


def _env(value, rule: Mapping) -> str | None:
    if not isinstance(value, Mapping):
        return "expected a map of NAME: value"
    for name, item in value.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            return f"name {name!r} is not an environment variable name (A-Z, 0-9, _)"
        if isinstance(item, (Mapping, list)) or item is None:
            return f"{name}: expected a string or a number, got {type(item).__name__}"
        if not ENV_VALUE.fullmatch(str(item)) or len(str(item)) > 1024:
            return f"{name}={str(item)!r}: expected letters, digits, spaces and ._:/,=@+- (no quotes, $, newlines)"
    return None


def _api_key(value, rule: Mapping) -> str | None:
    """The characters only; empty, short and demo keys get their own messages (tasks/settings.yml)."""
    return None if isinstance(value, str) and (value == "" or API_KEY.fullmatch(value)) and len(value) <= 256 else \
        "expected up to 256 characters of letters, digits and ._~+/=- (e.g. `openssl rand -hex 24`)"


CHECKS: dict[str, Callable] = {
    "int": _int, "number": _number, "text": _text, "bool": _bool, "path": _path, "host": _host, "choice": _choice, "args": _args, "env": _env,
    "api_key": _api_key,
    "model_name": _pattern(MODEL_NAME, "1-128 characters of letters, digits and ._:/- starting with a letter or digit"),
    "unix_name": _pattern(UNIX_NAME, "a user or group name (a-z, 0-9, _ and -, starting with a letter or _)"),
    "version": _pattern(VERSION, "a version such as 580.0"),
    "word": _pattern(SAFE_WORD, "one word of letters, digits and ._:/,=@+-"),
}


def shown(value) -> str:
    """The value as the operator wrote it; quoted (repr) when it holds spaces or other specials."""
    text = str(value) if isinstance(value, (int, str)) and SAFE_WORD.fullmatch(str(value)) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def k26_input_errors(values: Mapping, spec: Mapping) -> list[str]:
    """One message per variable that fails its rule: 'NAME=VALUE is invalid: WHY; FIX'."""
    errors = []
    for name, rule in spec.items():
        if name not in values:
            continue
        kind = rule["kind"]
        if kind not in CHECKS:
            raise ValueError(f"_preflight_inputs: {name} has an unknown kind {kind!r} (known: {sorted(CHECKS)})")
        why = CHECKS[kind](values[name], rule)
        if why:
            value = "<not shown>" if rule.get("secret") else shown(values[name])
            errors.append(f"{name}={value} is invalid: {why}; {rule.get('fix', 'fix it in the inventory or the -e value')}")
    return errors


def _quoted(text: str) -> str:
    """systemd's double-quoted word: backslash and quote escaped, control characters to spaces."""
    body = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + re.sub(r"[\x00-\x1f]", " ", body) + '"'


def k26_exec_word(value) -> str:
    """One word of ExecStart: as it is when a SAFE_WORD, else quoted with `%` and `$` doubled
    (systemd expands specifiers and variables on command lines)."""
    text = str(value)
    if SAFE_WORD.fullmatch(text):
        return text
    return _quoted(text.replace("%", "%%").replace("$", "$$"))


def k26_env_value(value) -> str:
    """One value of an EnvironmentFile: as it is when empty or a SAFE_WORD, else quoted (an
    EnvironmentFile expands neither specifiers nor variables)."""
    text = str(value)
    return text if text == "" or SAFE_WORD.fullmatch(text) else _quoted(text)


class FilterModule:
    def filters(self):
        return {"k26_input_errors": k26_input_errors, "k26_exec_word": k26_exec_word, "k26_env_value": k26_env_value}

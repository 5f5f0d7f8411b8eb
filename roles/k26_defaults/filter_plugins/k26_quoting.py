"""systemd's quoting of the values that reach the unit and the env files - the templates' second wall behind preflight:
`k26_exec_word` (one word of ExecStart), `k26_env_value` (one value of an EnvironmentFile) and `k26_unit_value` (a
directive's value) quote or clean whatever is not a SAFE_WORD (k26_inputs.SAFE_WORD, the same pattern: held equal by
tests/ansible/test_inputs.py).
"""

from __future__ import annotations

import re


# One word on a systemd command line or in an env file without quoting: no whitespace, quotes,
# backslashes, `$` (systemd expands it), `%` (specifiers), `;` or control characters.
SAFE_WORD = re.compile(r"[A-Za-z0-9._:/,=@+-]+")


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


def k26_unit_value(value) -> str:
    """The value of a unit directive that takes its own syntax (DeviceAllow=): control characters
    become spaces, so a value cannot end the line and add a directive."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", str(value))


class FilterModule:
    def filters(self):
        return {"k26_exec_word": k26_exec_word, "k26_env_value": k26_env_value, "k26_unit_value": k26_unit_value}

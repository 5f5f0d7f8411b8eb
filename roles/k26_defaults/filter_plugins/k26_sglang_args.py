"""k26_extra_args read as SGLang 0.5.23's `sglang serve` reads them (issues 48, 72): its own option table
(../files/sglang-flags.json, written by tools/sglang_flags.py; tests/sglang/test_extra_args.py keeps it equal to the
pinned parser), the options the roles own and the allow-list (roles/preflight/vars/main.yml's k26_extra_args rule).
`{{ k26_extra_args | k26_sglang_arg_errors(rule) }}` -> a list of messages.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Mapping
from pathlib import Path


# SGLang 0.5.23's own option table (tools/sglang_flags.py writes it from its parser; tests/sglang keeps it equal)
SGLANG_FLAGS = Path(__file__).resolve().parents[1] / "files/sglang-flags.json"
_UNSET = object()


class _Refused(Exception):
    pass


class _SGLangParser(argparse.ArgumentParser):
    """argparse as `sglang serve` builds it (the same option strings, dests, value counts and abbreviations),
    raising where SGLang's would exit."""

    def error(self, message):
        raise _Refused(message)


@functools.lru_cache(maxsize=1)
def _sglang_parser() -> tuple[_SGLangParser, dict[str, str], str]:
    table = json.loads(SGLANG_FLAGS.read_text())
    parser = _SGLangParser(prog="sglang serve", add_help=False, allow_abbrev=table["allow_abbrev"])
    flag_dest = {}
    for option in table["options"]:
        nargs = option["nargs"]
        kwargs = {"dest": option["dest"], "default": _UNSET}
        if nargs == 0:
            kwargs.update(action="store_const", const=True)
        elif nargs is not None:
            kwargs["nargs"] = nargs
        parser.add_argument(*option["strings"], **kwargs)
        flag_dest.update({s: option["dest"] for s in option["strings"]})
    return parser, flag_dest, table["sglang"]


def _given(words: list[str]) -> dict[str, object]:
    """The dests SGLang's parser sets from WORDS (its own prefix and `=` rules); raises _Refused like its errors."""
    parser, _, version = _sglang_parser()
    namespace, unknown = parser.parse_known_args(words)
    if unknown:
        raise _Refused(f"SGLang {version} has no option {unknown[0]}")
    return {k: v for k, v in vars(namespace).items() if v is not _UNSET}


def _dests_of(flags: Mapping, flag_dest: Mapping, prefixes: Mapping | None = None) -> dict[str, str]:
    """SGLang's dest -> the text a rule gives for it, from flag -> text (and flag prefix -> text)."""
    dests = {flag_dest[f]: text for f, text in flags.items() if f in flag_dest}
    dests.update({d: text for prefix, text in (prefixes or {}).items() for f, d in flag_dest.items() if f.startswith(prefix)})
    return dests


def _item_errors(index: int, item: str, given: Mapping, owners: Mapping, allowed: Mapping, flag_dest: Mapping) -> list[str]:
    """One item's options read by SGLang's parser (GIVEN: dest -> value) against the owned and the allowed options."""
    errors = []
    for dest in given:
        flags = "/".join(f for f, d in flag_dest.items() if d == dest and f.startswith("--"))
        if dest in owners:
            errors.append(f"k26_extra_args item {index} ({item!r}): SGLang reads it as {flags}, which the roles set "
                          f"from {owners[dest]}; set that variable, not k26_extra_args")
        elif allowed is not None and dest not in allowed:
            errors.append(f"k26_extra_args item {index} ({item!r}): SGLang reads it as {flags}, which is not on the "
                          "list of options this service takes (k26_extra_args.allowed in roles/preflight/vars/main.yml, "
                          "each with why: options that load code, log prompts or change the tested numerics are left "
                          "out); drop it, or add it there with the reason and a test")
    return errors


def k26_sglang_arg_errors(args, rule: Mapping) -> list[str]:
    """k26_extra_args read as `sglang serve` reads them: each item's words through SGLang 0.5.23's option table
    (a prefix of a flag is that flag, `--flag=value` and a flag inside a value count), then all items together.
    RULE is _preflight_inputs.k26_extra_args. Refused: an option SGLang does not have, one its parser refuses
    (ambiguous, a missing value), any option whose dest a role sets (`refused`: flag -> the variable that sets it;
    `refused_prefixes`), and any option off the allow-list (`allowed`: flag -> why; every option when it is absent)."""
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return []                                      # _args names the shape
    _, flag_dest, version = _sglang_parser()
    owners = _dests_of(rule.get("refused") or {}, flag_dest, rule.get("refused_prefixes"))
    allowed = _dests_of(rule["allowed"], flag_dest) if "allowed" in rule else None
    errors = []
    for index, item in enumerate(args):
        try:
            given = _given(item.split())
        except _Refused as err:
            said = str(err) if len(str(err)) <= 240 else str(err)[:237] + "..."
            errors.append(f"k26_extra_args item {index} ({item!r}): {said}; give options of SGLang {version}'s "
                          "`sglang serve --help`")
            continue
        errors += _item_errors(index, item, given, owners, allowed, flag_dest)
    if not errors:
        try:
            _given([w for item in args for w in item.split()])
        except _Refused as err:
            errors.append(f"k26_extra_args {args!r} read together: {err}")
    return errors


class FilterModule:
    def filters(self):
        return {"k26_sglang_arg_errors": k26_sglang_arg_errors}

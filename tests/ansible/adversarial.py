"""Adversarial values for every rule of roles/preflight/vars/main.yml's _preflight_inputs (issue 72, item 5), made
from the rule itself: values of the wrong YAML type, values past each bound, and each bound's own value (which must
pass). `bad_values(name, rule)` and `good_values(name, rule)` -> [(value, what it tries)]."""

from __future__ import annotations

from collections.abc import Mapping

# the wrong YAML types: what `yes`, `[a]`, `{a: 1}`, `~`, `1.5` and `7` become in Ansible
WRONG_TYPES = {"bool": True, "list": ["a"], "map": {"a": 1}, "null": None, "float": 1.5, "int": 7}
# which of them each kind takes as written (an int kind takes 7; a list kind a list, checked item by item)
TAKES = {
    "int": {"int"}, "number": {"int", "float"}, "schedule": {"int"}, "budget": {"int"},
    "bool": {"bool"},        # 7 is not a boolean, 1 and 0 are (Ansible's bool reads them)
    "list": {"list"}, "api_keys": {"list"}, "models": set(), "env": {"map"}, "args": set(),
    "apt_source": {"map"},
}


def _bounds(rule: Mapping) -> tuple[list, list]:
    """(values past the bounds, the bounds themselves) of a numeric rule."""
    low, high = rule.get("min"), rule.get("max")
    past, at = [], []
    if low is not None:
        past.append((low - 1, "one below min"))
        at.append((low, "min"))
    if high is not None:
        past.append((high + 1, "one above max"))
        at.append((high, "max"))
    return past, at


def _kind_values(rule: Mapping) -> tuple[list, list]:
    """(bad, good) values particular to a rule's kind."""
    kind = rule["kind"]
    if kind in ("int", "number"):
        past, at = _bounds(rule)
        bad = past + [("12abc", "digits then letters"), ("", "empty")]
        return bad + ([("0x10", "hexadecimal")] if kind == "int" else [("nan", "not a number")]), at
    if kind in ("schedule", "budget"):
        past, at = _bounds(rule)
        low = rule.get("min", 1)
        bad = past + [("1:32,1:16", "batches not increasing"), ("2:32", "a schedule not starting at batch 1"),
                      ("1:32;8:16", "a wrong separator"), ("1:", "a pair without its value")]
        good = at + [(f"1:{max(low, 8)},8:{max(low, 4)}", "a schedule")]
        if kind == "budget":
            bad += [("auto:32,16", "auto budgets not increasing"), ("automatic", "a word like auto")]
            good += [("auto", "the width policy")]
        return bad, good
    if kind == "bool":
        return [("maybe", "a word"), ("2", "a number but 0/1")], [(True, "true"), ("false", "false as text")]
    if kind == "choice":
        return [("not-a-choice", "a value off the list")], [(c, "a choice") for c in rule["choices"]]
    if kind == "path":
        bad = [("relative/dir", "a relative path"), ("/a b", "a space"), ("/x/../y", "a .. step")]
        if rule.get("owned"):
            bad += [("/tmp/k26-x", "under /tmp"), ("/var/lib", "a system folder"), ("/opt/k26-x/", "a trailing /")]
        return bad, [("/opt/k26-adversarial", "a folder of its own")]
    if kind == "host":
        return [("a b", "a space"), ("-flag", "a flag"), ("host;id", "a ;")], [("127.0.0.1", "an address"),
                                                                                 ("gpu-01.example", "a name")]
    if kind == "text":
        return [("line\nbreak", "two lines"), ("x" * (rule.get("max_chars", 1000) + 1), "one past max_chars")], \
            [("x" * rule.get("max_chars", 1000), "max_chars")]
    if kind == "list":
        item = rule["item"]
        items_bad, items_good = _kind_values(item)
        bad = [([v], f"an item: {what}") for v, what in items_bad[:2]]
        bad += [([items_good[0][0]] * (rule.get("max_items", 64) + 1), "one item past max_items")] if items_good else []
        if not rule.get("empty_ok"):
            bad.append(([], "empty"))
        return bad, ([([items_good[0][0]], "one good item")] if items_good else [])
    if kind == "env":
        return [({"LD_PRELOAD": "/x.so"}, "a loader's name"), ({"NCCL_DEBUG": "$(id)"}, "a shell expansion"),
                ({"NCCL_DEBUG": True}, "a boolean value"), ({"NCCL_MIN_NCHANNELS": 8}, "a number value (YAML's 010)"),
                ({"NCCL_DEBUG": ["WARN"]}, "a list value")], \
            [({"NCCL_DEBUG": "WARN"}, "a listed name")]
    if kind == "args":
        return [("--x", "not a list"), (["--x $(id)"], "a shell expansion"), ([7], "an item not text")], \
            [(["--watchdog-timeout 1800"], "an allowed option")]
    if kind in ("fixed", "derived"):
        return [("anything", "any value set")], []
    if kind in ("controller_path",):
        bad = [("relative/x", "a relative path")] + ([("/no/such/k26/file", "missing")] if rule.get("exists") else [])
        return bad, []
    if kind == "duration":
        return [("5", "no unit"), ("5 m", "a space"), ("0s", "zero"), ("1h30m", "two units")], [("15s", "15s")]
    if kind in ("api_key", "api_keys"):
        return [("k e y" if kind == "api_key" else ["k e y"], "a space")], []
    if kind == "url":
        return [("ftp://h:1", "another scheme"), ("http://h", "no port"), ("http://h:99999", "a port past 65535")], \
            [("http://127.0.0.1:30000", "an address and port")]
    if kind == "regex":
        return [("RTX (PRO", "an unclosed group")], [("RTX PRO 6000", "a plain name")]
    return [("a b $(id)", "a space and a shell expansion")], []


def bad_values(name: str, rule: Mapping) -> list[tuple[object, str]]:
    """Every value the rule must refuse: the wrong YAML types it does not take, then its kind's own."""
    takes = set(TAKES.get(rule["kind"], set()))
    if rule["kind"] == "choice" and rule.get("lower") and "true" in rule["choices"]:
        takes.add("bool")        # auto/true/false: YAML's true is the choice "true" (the rule reads it lower-cased)
    out = [(value, f"YAML {label}") for label, value in WRONG_TYPES.items() if label not in takes
           and not (label == "null" and rule.get("empty_ok") and rule["kind"] in ("path",))]
    if rule["kind"] in ("fixed", "derived"):
        out = []
    seen = []
    for value, what in out + _kind_values(rule)[0]:
        if (value, what) not in seen:
            seen.append((value, what))
    return seen


def good_values(name: str, rule: Mapping) -> list[tuple[object, str]]:
    """Values at the rule's bounds (and one of each form) that it must take."""
    return _kind_values(rule)[1]

"""Issue 72, item 5: for every variable with a rule (every variable of every role's argument_specs has one:
test_check_first.py), values of the wrong YAML type, values past each bound and each bound itself, generated from the
rule (tests/ansible/adversarial.py): every bad value refused with a message naming the variable, every bound value
taken - the filter called directly for all of them (the list printed in the test's output), and the real check play
(playbooks/check_inputs.yml) run twice, over an inventory file and over JSON -e, with one bad value of each kind
on server, gateway and monitor hosts at once (issue 72, item 6: the check runs for the gateway and monitor hosts too),
each named before any connection."""

from __future__ import annotations

import json

import yaml

from . import adversarial
from .conftest import ROOT, load_filters
from .test_check_first import check_good_fleet

K = load_filters("k26_inputs")
SPEC = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_inputs"]
COMPUTED = set(yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_computed"])


def refusal(name: str, value) -> str | None:
    """The message naming NAME for VALUE, or None when the rules take it."""
    errors = K.k26_input_errors({name: value}, SPEC)
    return next((e for e in errors if e.startswith(f"{name}=")), "(refused without naming it) " + errors[0]
                if errors else None)


def test_every_rule_gets_adversarial_values():
    assert all(adversarial.bad_values(n, r) for n, r in SPEC.items() if r["kind"] not in ("fixed", "derived"))


def test_every_bad_value_is_refused_naming_the_variable(capsys):
    taken, lines, count = [], [], 0
    for name, rule in SPEC.items():
        tried = adversarial.bad_values(name, rule) or [("anything", "any value set")]
        for value, what in tried:
            count += 1
            said = refusal(name, value)
            if said is None or said.startswith("(refused without"):
                taken.append((name, value, what, said))
        lines.append(f"{name} ({rule['kind']}): {len(tried)} refused - " + "; ".join(w for _, w in tried))
    with capsys.disabled():
        print(f"\nissue 72 adversarial inputs: {count} values over {len(SPEC)} variables")
        print("\n".join(lines))
    assert not taken, taken


def test_every_bound_value_is_taken():
    refused = [(n, v, w, refusal(n, v)) for n, r in SPEC.items() for v, w in adversarial.good_values(n, r)
               if refusal(n, v)]
    assert not refused, refused


def one_of_each_kind() -> dict[str, tuple[str, object]]:
    """kind -> (a variable of that kind that the check play reads from any host, its first kind-specific bad
    value); fixed and derived left out (the computed list refuses those first)."""
    chosen = {}
    for name, rule in SPEC.items():
        kind = rule["kind"]
        if kind in chosen or kind in ("fixed", "derived") or name in COMPUTED or name.startswith(("sweep_", "validate_")):
            continue
        own = adversarial._kind_values(rule)[0]
        chosen[kind] = (name, own[0][0] if own else adversarial.bad_values(name, rule)[0][0])
    return chosen


def placed(chosen: dict) -> tuple[dict, dict]:
    """(server host values, gateway-and-monitor host values) by each rule's scope."""
    server, other = {}, {}
    for name, value in chosen.values():
        rule = SPEC[name]
        (other if rule.get("scope") == "gateway" else server)[name] = value
    return server, other


def with_monitor(groups, server: dict, other: dict):
    groups["k26"]["hosts"]["gpu-a"].update(server)
    groups["k26_gateway"]["hosts"]["gw"].update(other)
    groups["k26_monitor"] = {"hosts": {"mon": {"k26_alerts_unrouted": True, **other}}}


def assert_named(out: str, names) -> None:
    missing = [n for n in names if f"{n}=" not in out]
    assert not missing, (missing, out[-4000:])


def test_the_check_play_names_one_bad_value_of_each_kind_from_an_inventory_file(tmp_path):
    chosen = one_of_each_kind()
    server, other = placed(chosen)
    r, out = check_good_fleet(tmp_path, edit=lambda groups: with_monitor(groups, server, other))
    assert r.returncode != 0 and "UNREACHABLE" not in out, out[-3000:]
    assert_named(out, [n for n, _ in chosen.values()])
    assert all(f"{h} " in out for h in ("gpu-a", "gw", "mon")), out[-3000:]


def test_the_check_play_names_one_bad_value_of_each_kind_given_as_json_e(tmp_path):
    chosen = one_of_each_kind()
    values = {name: value for name, value in chosen.values()}
    r, out = check_good_fleet(tmp_path, edit=lambda groups: with_monitor(groups, {}, {}),
                              extra=["-e", json.dumps(values)])
    assert r.returncode != 0 and "UNREACHABLE" not in out, out[-3000:]
    assert_named(out, values)

"""The README's variables table against the production example (issue 71, item 5: it said k26_host 0.0.0.0 and a graph
batch of 32 while the example binds the host's address and captures 48): every variable a row names that the
example's group_vars set has the example's value in the row's production column."""

from __future__ import annotations

import re

import yaml

from .conftest import ROOT


def table_rows() -> list[list[str]]:
    readme = (ROOT / "docs/operations.md").read_text()
    section = readme.split("## Variables (inventory `group_vars/k26/`)", 1)[1].split("\n\n", 2)[1]
    return [[c.strip() for c in row.strip().strip("|").split("|")] for row in section.splitlines()[2:]]


def production() -> dict:
    out: dict = {}
    for f in sorted((ROOT / "inventory/production/group_vars/k26").glob("*.yml")):
        out.update(yaml.safe_load(f.read_text()) or {})
    return out


def shown(value) -> str:
    """A value as the table writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def test_every_production_value_the_table_shows_is_the_examples():
    example = production()
    checked, wrong = [], []
    for cells in table_rows():
        names = re.findall(r"`(k26_[a-z0-9_]+)`", cells[0])
        values = [v.strip().strip("`") for v in cells[1].split(",")] if len(names) > 1 else [cells[1].strip("`")]
        for name, written in zip(names, values):
            value = example.get(name)
            if name not in example or isinstance(value, (dict, list)) or "vault" in shown(value) or value == "":
                continue                                    # a map, a list, a secret or empty: described in words
            checked.append(name)
            if written.split("` ")[0].strip("`") != shown(value):
                wrong.append(f"{name}: README {written!r}, inventory/production {shown(value)!r}")
    assert not wrong, wrong
    assert {"k26_ddtree_budget", "k26_host", "k26_cuda_graph_max_bs", "k26_port"} <= set(checked)


def test_every_variable_the_table_names_is_an_option_of_a_roles_argument_specs():
    """Checked against the argument specs (issue 71, item 5): a renamed or misspelt variable cannot stay in the table."""
    options = {name for spec in ROOT.glob("roles/*/meta/argument_specs.yml")
               for entry in yaml.safe_load(spec.read_text())["argument_specs"].values()
               for name in (entry.get("options") or {})}
    named = [n for cells in table_rows() for n in re.findall(r"`(k26_[a-z0-9_]+)`", cells[0])]
    assert len(named) >= 20
    assert sorted(set(named) - options) == []


def test_the_sandbox_column_is_the_sandbox_inventorys():
    sandbox: dict = {}
    for f in sorted((ROOT / "inventory/sandbox/group_vars/k26").glob("*.yml")):
        sandbox.update(yaml.safe_load(f.read_text()) or {})
    checked, wrong = [], []
    for cells in table_rows():
        names = re.findall(r"`(k26_[a-z0-9_]+)`", cells[0])
        if len(names) != 1 or names[0] not in sandbox:
            continue
        value = sandbox[names[0]]
        if isinstance(value, (dict, list)) or "{{" in shown(value) or value == "":
            continue
        checked.append(names[0])
        if cells[2].split("` ")[0].strip("`") != shown(value):
            wrong.append(f"{names[0]}: README {cells[2]!r}, inventory/sandbox {shown(value)!r}")
    assert not wrong, wrong
    assert len(checked) >= 3, checked

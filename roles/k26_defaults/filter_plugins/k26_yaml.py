"""Values an inventory file writes one way and Ansible reads another (issue 72, item 1).

Ansible reads inventory files as YAML 1.1, where a plain `030000` is the octal 12288, `1:32` the base-60 92, `yes` /
`off` booleans, while they read - and YAML 1.2 reads them - as the decimal 30000, the text `1:32` and the words `yes` /
`off`. `{{ ansible_inventory_sources | k26_yaml_traps }}` lists every plain scalar of every inventory file (hosts
file, group_vars, host_vars; vault files left out) whose YAML 1.1 reading differs from its YAML 1.2 core reading:
`FILE:LINE: KEY = TEXT is read by Ansible as VALUE (...), not as written: FIX`. Nothing is imported from Ansible;
PyYAML's own resolver gives the 1.1 reading and a loader with the 1.2 core schema's resolvers the other.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

# YAML 1.2's core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), for plain scalars
CORE_12 = (
    ("tag:yaml.org,2002:null", re.compile(r"~|null|Null|NULL|")),
    ("tag:yaml.org,2002:bool", re.compile(r"true|True|TRUE|false|False|FALSE")),
    ("tag:yaml.org,2002:int", re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")),
    ("tag:yaml.org,2002:float", re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
                                           r"|[-+]?\.(inf|Inf|INF)|\.nan|\.NaN|\.NAN")),
)
STR = "tag:yaml.org,2002:str"
WORDS = {"tag:yaml.org,2002:bool": "a boolean", "tag:yaml.org,2002:int": "a number", "tag:yaml.org,2002:float":
         "a number", "tag:yaml.org,2002:null": "nothing (null)", STR: "text"}


def tag_12(text: str) -> str:
    return next((tag for tag, pattern in CORE_12 if pattern.fullmatch(text)), STR)


def value_12(text: str, tag: str):
    if tag == "tag:yaml.org,2002:int":
        return int(text, 8) if text.startswith("0o") else int(text, 16) if text.startswith("0x") else int(text)
    if tag == "tag:yaml.org,2002:float":
        return float(text.replace("inf", "Inf").replace("Inf", "inf").replace("INF", "inf"))
    if tag == "tag:yaml.org,2002:bool":
        return text.lower() == "true"
    return None if tag == "tag:yaml.org,2002:null" else text


def value_11(node: yaml.ScalarNode):
    return yaml.SafeLoader("").construct_object(node, deep=True)


def fix(text: str, tag_11: str, read) -> str:
    if tag_11 == "tag:yaml.org,2002:bool":
        return f'write true or false for a switch, or quote it ("{text}") for the word'
    if tag_11 == "tag:yaml.org,2002:int" and ":" in text:
        return f'quote it ("{text}"): YAML 1.1 reads digits with colons as one base-60 number'
    if tag_11 == "tag:yaml.org,2002:int":
        return f'write {int(text.lstrip("+-0") or "0")} without the leading zero, or quote it ("{text}")'
    return f'quote it ("{text}") for the text, or write the value you mean'


def scalar_traps(node, path: str, where: str, out: list[str]) -> None:
    """Walk a composed node; every plain scalar whose two readings differ appended to `out`."""
    if isinstance(node, yaml.MappingNode):
        for key, child in node.value:
            scalar_traps(child, f"{path}.{key.value}" if path else str(key.value), where, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            scalar_traps(child, f"{path}[{i}]", where, out)
    elif isinstance(node, yaml.ScalarNode) and node.style is None:
        tag_12_ = tag_12(node.value)
        read_11 = value_11(node)
        read_12 = value_12(node.value, tag_12_)
        if tag_12_ == STR and node.tag == "tag:yaml.org,2002:int" and re.fullmatch(r"[-+]?[1-9][0-9_]*", node.value):
            tag_12_, read_12 = node.tag, int(node.value.replace("_", ""))      # 30_000: digits grouped, read alike
        same = (node.tag == tag_12_ or {node.tag, tag_12_} <= {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}) \
            and read_11 == read_12
        if not same:
            out.append(f"{where}:{node.start_mark.line + 1}: {path} = {node.value} is read by Ansible (YAML 1.1) as "
                       f"{read_11!r} ({WORDS.get(node.tag, node.tag)}), not as written: {fix(node.value, node.tag, read_11)}")


def inventory_files(source: str) -> list[Path]:
    """An inventory source's YAML files: itself when it is a file, else its hosts files, group_vars and host_vars."""
    root = Path(source)
    if root.is_file():
        return [root]
    found = [p for p in sorted(root.glob("*")) if p.is_file() and p.suffix in (".yml", ".yaml")]
    for sub in ("group_vars", "host_vars"):
        found += [p for p in sorted((root / sub).rglob("*")) if p.is_file() and p.suffix in (".yml", ".yaml", "")]
    return found


def k26_yaml_traps(sources) -> list[str]:
    """Every plain scalar of the inventory sources' YAML files that YAML 1.1 reads otherwise than written."""
    out: list[str] = []
    for source in [sources] if isinstance(sources, str) else list(sources or []):
        for path in inventory_files(str(source)):
            text = path.read_text(errors="replace")
            if text.lstrip().startswith("$ANSIBLE_VAULT;"):
                continue                                     # encrypted: its values are the vault's keys
            try:
                documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
            except yaml.YAMLError:
                continue                                     # Ansible itself reports a file it cannot parse
            for document in documents:
                if document is not None:
                    scalar_traps(document, "", str(path), out)
    return out


class FilterModule:
    def filters(self):
        return {"k26_yaml_traps": k26_yaml_traps}

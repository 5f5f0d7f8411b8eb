"""Every server configuration the GPU jobs start is one testbed/servers.py can build: a name it cannot parse
fails the whole GPU job at start-up (H200 2026-12-04: the node check's radix server still carried the "-lp" suffix
removed with the logprobs switch, and all 13 node tests errored before a server started)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.gpu_sglang import test_grammars, test_node_logits, test_requests

from testbed import servers as harness
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "testbed/decide.sh", ROOT / "testbed/kimi.sh", ROOT / "testbed/widths_overlap.sh",
           ROOT / "testbed/width_policy_gpu.sh", ROOT / "testbed/enlarged_pair.sh", ROOT / "bench/enlarged_speed.sh",
           ROOT / "bench/sglang_compare.sh"]
NAME = re.compile(r"(?<![\w/.-])((?:none|dflash|ddtree)-[a-z0-9-]+|none|dflash)(?![\w/.-])")


def script_names() -> set[str]:
    """Configuration names in the GPU job scripts' server lists (comma lists and -k expressions)."""
    names = set()
    for script in SCRIPTS:
        for line in script.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            for value in re.findall(r"(?:START|MATRIX|VARIANTS|names|SERVERS|CONFIGS)[^=]*=\"?\$?\{?[A-Z_]*:?-?([a-z0-9,-]+)", line):
                names |= {n for n in value.split(",") if NAME.fullmatch(n)}
    return names


def module_names() -> set[str]:
    names = set(test_requests.REQUEST_SERVERS) | set(test_grammars.GRAMMAR_SERVERS)
    for pair in ("small", "kimi-dense", "kimi-allexp", "kimi"):
        names |= set(test_node_logits.servers_of(pair))
    return names


def test_the_scripts_name_servers_at_all():
    found = script_names()
    assert {"ddtree-sched-graphs", "ddtree-b32-c8-graphs-overlap", "ddtree-auto-c8-graphs-steepcost",
            "ddtree-b7-c1-graphs"} <= found, sorted(found)


@pytest.mark.parametrize("name", sorted(module_names() | script_names()))
def test_every_server_a_gpu_job_starts_parses(name):
    assert harness.config(name).name == name


def test_an_unknown_suffix_is_refused_by_name():
    with pytest.raises(ValueError, match="ddtree-b32-c8-graphs-radix-lp.*is invalid"):
        harness.config("ddtree-b32-c8-graphs-radix-lp")

"""The GPU jobs' servers listen where nothing else takes the port first (testbed/servers.py check_port): not in
SGLang's own pick range (22000-29999) and not in the kernel's ephemeral range, which the health polls, NCCL stores
and ZMQ sockets of 20-30 servers draw from at random (H200 2026-12-05: 7 of 29 servers of one decide.sh job, on ports
42002-43062, died with "address already in use" and took four kimipath tests with them). Every port base the GPU
job scripts and modules use is read here and held to that rule, and decide.sh's fleets, which run at once under
PARALLEL=1, to ranges of their own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


from testbed import servers as harness
ROOT = Path(__file__).resolve().parents[2]
FLEET_SPAN = 2 * harness.NCCL_PORT_OFFSET           # a fleet's servers and their process groups: base .. base + 99
SIZES_AT_ONCE = 4                                   # decide.sh runs one fleet per pair, at most four pairs


def test_a_port_in_the_ephemeral_range_is_refused_with_the_range_and_the_fix():
    eph = harness.ephemeral_ports()
    with pytest.raises(ValueError, match=rf"port {eph.start + 10} is in this machine's ephemeral range "
                                         rf"{eph.start}-{eph.stop - 1} .*at random: take a port base between 10000 and 21900"):
        harness.check_port(eph.start + 10)


def test_a_privileged_or_impossible_port_is_refused_as_such():
    for port in (1, 80, 70000):
        with pytest.raises(ValueError, match=rf"port {port} is not a port a test server can listen on \(1024-65535"):
            harness.check_port(port)


def test_a_port_sglang_picks_for_itself_is_refused():
    with pytest.raises(ValueError, match="25000 is in 22000-29999, where SGLang picks its own free ports"):
        harness.check_port(25000)
    harness.check_port(13000)                       # below both: accepted


def test_a_server_whose_process_group_port_falls_in_sglangs_range_is_refused():
    with pytest.raises(ValueError, match=r"none's process-group port \(its port \+ 50\) 22000"):
        harness.Server(harness.config("none"), 21950, Path("/nonexistent/none.log"))
    assert harness.Server(harness.config("none"), 13000, Path("/nonexistent/none.log")).port == 13000


def decide_fleets() -> dict[str, list[int]]:
    """decide.sh's pytest sessions by line: SGLANG_DDTREE_BASE_PORT, $((A + B * i)) for i < SIZES_AT_ONCE."""
    text = (ROOT / "testbed/decide.sh").read_text()
    fleets = {}
    for n, line in enumerate(text.splitlines()):
        if line.lstrip().startswith("#"):
            continue
        m = re.search(r"SGLANG_DDTREE_BASE_PORT=(?:\$\(\((\d+) \+ (\d+) \* i\)\)|(\d+))", line)
        if m:
            a, b, fixed = m.groups()
            fleets[f"decide.sh:{n + 1}"] = [int(fixed)] if fixed else [int(a) + int(b) * i for i in range(SIZES_AT_ONCE)]
    return fleets


def module_bases() -> dict[str, int]:
    """Fixed port bases in the GPU test modules and benches (fleet defaults, single servers)."""
    found = {}
    for path in [*ROOT.glob("tests/gpu_sglang/*.py"), *ROOT.glob("testbed/*.py"), *ROOT.glob("bench/*.py")]:
        text = path.read_text()
        for pattern in (r"base_port=(\d+)", r"PORT\", \"(\d+)\"\)", r"SCHEDULE_PORTS = (\d+)",
                        r"(?m)^[A-Z_]+_PORT = (\d+)",
                        r"harness\.Server\([^\n]*?, (\d+)(?: \+ i)?,"):
            for m in re.finditer(pattern, text):
                found[f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"] = int(m.group(1))
    return found


def test_the_scripts_and_modules_name_the_ports_this_test_reads():
    assert len(decide_fleets()) >= 8 and len(module_bases()) >= 6, (decide_fleets(), module_bases())


@pytest.mark.parametrize("where,base", sorted(module_bases().items()))
def test_every_module_port_base_is_one_nothing_else_takes(where, base):
    for port in (base, base + FLEET_SPAN - 2):
        harness.check_port(port, f"{where}: port")


def test_decide_sh_fleets_take_safe_ports_and_never_each_others():
    taken: dict[int, str] = {}
    for where, bases in decide_fleets().items():
        for base in bases:
            for port in range(base, base + FLEET_SPAN):
                harness.check_port(port, f"{where}: port")
                assert port not in taken, f"{where} and {taken[port]} both take port {port}"
                taken[port] = where

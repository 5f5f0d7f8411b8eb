"""k26_firewall (issue 47, item 4): only the gateway hosts, the monitor hosts, the host itself and k26_firewall_allow
reach a server host's service and node-exporter ports. The rules the service role installs
(templates/etc/nftables.d/k26.nft.j2, rendered from the production example) are loaded with Debian 12's nft
(`make promtool` unpacks it; make test sets K26_NFT) into a network namespace this test makes (loopback only, no
other address is ever sent to), and real HTTP clients from an allowed and a refused source address try the ports.
The sandbox shares this machine's network, so there the firewall stays off (preflight refuses it)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, load_filters
from .test_static import render

k26_firewall = load_filters("k26_firewall")


def nft() -> str:
    tool = os.environ.get("K26_NFT", "")
    if not tool:
        pytest.skip("K26_NFT is not set: `make promtool` unpacks Debian 12's nft, make test sets it")
    return tool


def test_the_peers_are_the_host_the_gateways_the_monitors_and_the_allowed_networks():
    hostvars = {"gpu-1": {"ansible_host": "10.0.0.11"}, "gpu-2": {"ansible_host": "10.0.0.12"},
                "gw": {"ansible_host": "10.0.0.2", "k26_monitor_address": "10.1.0.2"}, "mon": {"ansible_host": "fd00::5"}}
    groups = {"k26": ["gpu-1", "gpu-2"], "k26_gateway": ["gw"], "k26_monitor": ["mon", "gw"]}
    peers = k26_firewall.k26_firewall_peers(hostvars, groups, "gpu-1", ["192.0.2.0/24"])
    assert peers == {"ipv4": ["127.0.0.1", "10.0.0.11", "10.1.0.2", "192.0.2.0/24"], "ipv6": ["::1", "fd00::5"],
                     "invalid": []}          # gpu-2 is not a peer of gpu-1; the gateway by its monitor address, once
    named = k26_firewall.k26_firewall_peers({"gpu-1": {"ansible_host": "gpu-1.example"}}, {}, "gpu-1", ["clients"])
    assert named["invalid"] == ["gpu-1: gpu-1.example", "k26_firewall_allow: clients"]


k26_relations = load_filters("k26_relations")


def test_documentation_networks_are_found_and_real_ones_are_not():
    """Preflight refuses these in k26_firewall_allow (the example's placeholder left in a site inventory)."""
    given = ["192.0.2.0/24", "192.0.2.10", "198.51.100.0/25", "203.0.113.7/32", "2001:db8::/48", "10.20.0.0/16",
             "192.0.0.0/16", "fd00::/8", "clients", " 203.0.113.0/24 "]
    assert k26_relations.k26_documentation_networks(given) == [
        "192.0.2.0/24", "192.0.2.10", "198.51.100.0/25", "203.0.113.7/32", "2001:db8::/48", "203.0.113.0/24"]
    assert k26_relations.k26_documentation_networks([]) == [] == k26_relations.k26_documentation_networks(None)


def test_the_production_example_renders_its_rules(tmp_path, vault_pass):
    files = render("production", tmp_path, vault_pass)
    rules = files["k26-gpu-01.nft"]
    assert "elements = { 30000, 9100 }" in rules
    assert "elements = { 127.0.0.1, 192.0.2.10, 192.0.2.0/24 }" in rules and "elements = { ::1 }" in rules
    assert "tcp dport @ports counter reject with tcp reset" in rules and "policy accept" in rules
    network = yaml.safe_load((ROOT / "inventory/production/group_vars/k26/network.yml").read_text())
    assert network["k26_firewall"] is True
    defaults = yaml.safe_load((ROOT / "roles/k26_defaults/defaults/main.yml").read_text())
    makefile = (ROOT / "Makefile").read_text()
    assert f"NFTABLES_DEB := {defaults['k26_nftables_package'].split('=', 1)[1]}" in makefile


def in_namespace(nft_tool: str, rules: Path, script: str) -> subprocess.CompletedProcess:
    """Run `script` (sh) in a new network namespace (loopback only) after loading `rules` there."""
    body = f"ip link set lo up && {nft_tool} -f {rules} && {textwrap.dedent(script)}"
    return subprocess.run(["unshare", "--net", "sh", "-ec", body], capture_output=True, text=True, timeout=120)


PROBE = """
python3 -m http.server 30000 --bind 127.0.0.1 >/dev/null 2>&1 & a=$!
python3 -m http.server 9100 --bind 127.0.0.1 >/dev/null 2>&1 & b=$!
python3 -m http.server 30001 --bind 127.0.0.1 >/dev/null 2>&1 & c=$!
trap 'kill $a $b $c' EXIT
for port in 30000 9100 30001; do    # each server answers the host itself before the probes (slow machines)
  for i in $(seq 300); do curl -s -o /dev/null --max-time 2 http://127.0.0.1:$port/ && break; sleep 0.1; done
done
for from in 127.0.0.1 127.0.0.5; do for port in 30000 9100 30001; do
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 --interface $from http://127.0.0.1:$port/ || true)
  echo "$from $port $code"
done; done
"""


def probe(tmp_path, vault_pass, *extra) -> dict[tuple[str, int], str]:
    rules = tmp_path / "k26.nft"
    rules.write_text(render("production", tmp_path, vault_pass, *extra)["k26-gpu-01.nft"])
    r = in_namespace(nft(), rules, PROBE)
    assert r.returncode == 0, r.stderr[-2000:]
    return {(f, int(p)): code for f, p, code in (line.split() for line in r.stdout.split("\n") if line.count(" ") == 2)}


def test_a_client_outside_the_allowed_set_is_refused_at_the_server_port(tmp_path, vault_pass):
    codes = probe(tmp_path, vault_pass)
    assert codes[("127.0.0.1", 30000)] == "200" and codes[("127.0.0.1", 9100)] == "200"   # the host itself
    assert codes[("127.0.0.5", 30000)] == "000" and codes[("127.0.0.5", 9100)] == "000"   # refused (reset)
    assert codes[("127.0.0.5", 30001)] == "200"                     # a port that is not the project's: untouched


def test_an_allowed_network_reaches_the_ports(tmp_path, vault_pass):
    codes = probe(tmp_path, vault_pass, "-e", json.dumps({"k26_firewall_allow": ["127.0.0.0/29"]}))
    assert codes[("127.0.0.5", 30000)] == "200" and codes[("127.0.0.5", 9100)] == "200"


def test_the_rules_replace_themselves_whole(tmp_path, vault_pass):
    """Loaded twice (a redeploy, a restart of k26-firewall.service): one table, the second file's."""
    rules = tmp_path / "k26.nft"
    rules.write_text(render("production", tmp_path, vault_pass)["k26-gpu-01.nft"])
    r = in_namespace(nft(), rules, f"{nft()} -f {rules} && {nft()} list tables")
    assert r.returncode == 0 and r.stdout.split() == ["table", "inet", "k26"], r.stdout + r.stderr

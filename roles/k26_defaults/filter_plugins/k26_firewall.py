"""The peers a host's firewall lets in beside `k26_firewall_allow`: the gateway and monitor hosts of the inventory
(`{{ hostvars | k26_firewall_peers(groups, inventory_hostname) }}`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping


def _host_address(hostvars, host: str) -> str:
    values = hostvars[host]
    for name in ("k26_monitor_address", "ansible_host"):
        if name in values and str(values[name]).strip():
            return str(values[name]).strip()
    return host


def k26_firewall_peers(hostvars, groups: Mapping, host: str, extra=()) -> dict:
    """Who may reach a server host's service and node-exporter ports when k26_firewall is on: the host itself
    (loopback and its own address), the gateway hosts, the monitor hosts (their k26_monitor_address, else
    ansible_host, else the inventory name) and k26_firewall_allow. -> {"ipv4": [...], "ipv6": [...],
    "invalid": ["NAME: VALUE", ...]}: nftables takes addresses and networks only, so a DNS name is invalid."""
    named = [(host, _host_address(hostvars, host))]
    for group in ("k26_gateway", "k26_monitor"):
        named += [(h, _host_address(hostvars, h)) for h in groups.get(group, [])]
    named += [("k26_firewall_allow", str(value).strip()) for value in (extra or [])]
    out = {"ipv4": ["127.0.0.1"], "ipv6": ["::1"], "invalid": []}
    for name, value in named:
        try:
            network = ipaddress.ip_network(value, strict=False)
        except ValueError:
            out["invalid"].append(f"{name}: {value}")
            continue
        family = out["ipv4" if network.version == 4 else "ipv6"]
        text = str(network.network_address) if network.num_addresses == 1 else str(network)
        if text not in family:
            family.append(text)
    return out


class FilterModule:
    def filters(self):
        return {"k26_firewall_peers": k26_firewall_peers}

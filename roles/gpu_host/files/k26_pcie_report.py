#!/usr/bin/env python3
"""Read-only PCIe report of the GPUs for NCCL: topology, IOMMU mode, ACS redirection, P2P verdict.

    python3 k26_pcie_report.py [--topo-file F] [--out FILE]

Reads `nvidia-smi topo -m` (or --topo-file), the GPUs' PCI addresses (nvidia-smi), the IOMMU
group type of each GPU (/sys/bus/pci/devices/<bdf>/iommu_group/type: identity = passthrough,
DMA/DMA-FQ = translated), and the ACS control of every bridge above each GPU (`lspci -vvv`,
root). Prints one JSON object. Peer-to-peer is judged unsafe when any GPU sits behind a bridge
with ACS request/completion redirection on, or in a translated IOMMU domain: PCIe P2P traffic
then goes up to the root complex, which is where NCCL P2P hangs on PCIe-only hosts come from.
Standard library only: it runs before the service's venv exists. Changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")
DEVICE = re.compile(r"^(GPU|NIC)\d+$")
# NCCL's default: P2P over PCIe up to PXB (no host bridge crossed); NV# links always
P2P_LINKS = re.compile(r"^(X|PIX|PXB|NV\d+)$")


def parse_topology(text: str) -> dict:
    """`nvidia-smi topo -m` -> {"gpus": [...], "links": {"GPU0": {"GPU1": "PIX", ...}}, "affinity": {...}}."""
    lines = [ANSI.sub("", line).rstrip("\n") for line in text.splitlines()]
    header = next((line for line in lines if "GPU0" in line and line[:1] in ("\t", " ")), None)
    if header is None:
        raise ValueError("not `nvidia-smi topo -m` output: no header line with GPU0")
    columns = [c.strip() for c in header.split("\t")]
    links, affinity = {}, {}
    for line in lines:
        cells = [c.strip() for c in line.split("\t")]
        if not cells or not re.match(r"^GPU\d+$", cells[0]):
            continue
        row = dict(zip(columns, cells))
        name = cells[0]
        links[name] = {col: row[col] for col in columns if DEVICE.match(col) and col.startswith("GPU") and col in row}
        affinity[name] = {"cpu": row.get("CPU Affinity", ""), "numa": row.get("NUMA Affinity", "")}
    if not links:
        raise ValueError("no GPU rows in the topology")
    return {"gpus": sorted(links, key=lambda g: int(g[3:])), "links": links, "affinity": affinity}


def parse_acs(lspci_text: str) -> dict:
    """ACS control of one device from `lspci -vvv`: {"present": bool, "redirect": bool, "line": str}."""
    match = re.search(r"ACSCtl:\s*(.*)", lspci_text)
    if not match:
        return {"present": False, "redirect": False, "line": ""}
    flags = dict(re.findall(r"(\w+)([+-])", match.group(1)))
    return {"present": True, "redirect": flags.get("ReqRedir") == "+" or flags.get("CmpltRedir") == "+",
            "line": match.group(1).strip()}


def iommu_mode(group_type: str | None) -> str:
    if group_type is None:
        return "off"
    return {"identity": "passthrough", "DMA": "translated", "DMA-FQ": "translated"}.get(group_type.strip(), "unknown")


def verdict(topology: dict, iommu: dict, acs: dict) -> dict:
    """P2P possible (NCCL's default levels) and safe (no ACS redirect, no translated IOMMU)."""
    gpus = topology["gpus"]
    pairs = [(a, b, topology["links"][a].get(b, "?")) for a in gpus for b in gpus if a < b]
    if len(gpus) < 2:
        return {"possible": False, "safe": True, "reason": "one GPU: no peer-to-peer traffic"}
    slow = [f"{a}-{b}:{link}" for a, b, link in pairs if not P2P_LINKS.match(link)]
    redirect = sorted({bridge for bridges in acs.values() for bridge, state in bridges.items() if state["redirect"]})
    translated = sorted(bdf for bdf, mode in iommu.items() if mode == "translated")
    reasons = []
    if redirect:
        reasons.append(f"ACS redirection on bridges {redirect}")
    if translated:
        reasons.append(f"IOMMU translating DMA for GPUs {translated} (use iommu=pt)")
    return {"possible": not slow, "safe": not reasons,
            "reason": "; ".join(reasons) or ("all pairs within PCIe switches" if not slow else
                                              f"pairs through a host bridge or SMP link (NCCL will not use P2P "
                                              f"there by default): {slow}")}


def run(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout


def gpu_addresses() -> list[str]:
    out = run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"])
    # 00000000:01:00.0 -> 0000:01:00.0 (sysfs form)
    return [line.strip().lower()[-12:] for line in out.splitlines() if line.strip()]


def bridges_above(bdf: str) -> list[str]:
    path = os.path.realpath(f"/sys/bus/pci/devices/{bdf}")
    parts = [p for p in path.split("/") if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", p)]
    return parts[:-1]


def gather(topo_text: str) -> dict:
    topology = parse_topology(topo_text)
    iommu, acs = {}, {}
    for bdf in gpu_addresses():
        group = f"/sys/bus/pci/devices/{bdf}/iommu_group/type"
        iommu[bdf] = iommu_mode(open(group).read() if os.path.exists(group) else None)
        acs[bdf] = {bridge: parse_acs(run(["lspci", "-vvv", "-s", bridge])) for bridge in bridges_above(bdf)}
    return {"topology": topology, "iommu": iommu, "acs": acs, "p2p": verdict(topology, iommu, acs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topo-file", help="parse this `nvidia-smi topo -m` output instead of running it")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    text = open(args.topo_file).read() if args.topo_file else run(["nvidia-smi", "topo", "-m"])
    report = gather(text) if not args.topo_file else {"topology": parse_topology(text)}
    if args.topo_file:
        report["p2p"] = verdict(report["topology"], {}, {})
    out = json.dumps(report, indent=1, sort_keys=True)
    print(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

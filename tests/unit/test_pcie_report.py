"""roles/gpu_host/files/k26_pcie_report.py: topology parsing, ACS flags, IOMMU modes, the P2P verdict."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles/gpu_host/files/k26_pcie_report.py"
FIXTURES = ROOT / "tests/fixtures"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("k26_pcie_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_real_h200_topology_one_gpu(report):
    topo = report.parse_topology((FIXTURES / "nvidia-smi-topo-h200.txt").read_text())
    assert topo["gpus"] == ["GPU0"]
    assert topo["links"] == {"GPU0": {"GPU0": "X"}}
    assert topo["affinity"]["GPU0"] == {"cpu": "0-15", "numa": "0"}
    assert report.verdict(topo, {}, {}) == {"possible": False, "safe": True, "reason": "one GPU: no peer-to-peer traffic"}


def test_hand_written_8_gpu_pcie_topology(report):
    topo = report.parse_topology((FIXTURES / "nvidia-smi-topo-8gpu-pcie.txt").read_text())
    assert topo["gpus"] == [f"GPU{i}" for i in range(8)]
    assert topo["links"]["GPU0"]["GPU1"] == "PIX" and topo["links"]["GPU0"]["GPU2"] == "PXB"
    assert topo["links"]["GPU3"]["GPU4"] == "SYS" and topo["links"]["GPU7"]["GPU7"] == "X"
    assert all(topo["links"][a][b] == topo["links"][b][a] for a in topo["gpus"] for b in topo["gpus"])
    v = report.verdict(topo, {}, {})
    assert v["possible"] is False and "GPU0-GPU4:SYS" in v["reason"]
    socket0 = {"gpus": topo["gpus"][:4], "links": topo["links"]}
    assert report.verdict(socket0, {}, {})["possible"] is True


def test_acs_and_iommu_make_p2p_unsafe(report):
    lspci = ("00:01.0 PCI bridge: Example Root Port\n\tCapabilities: [220 v1] Access Control Services\n"
             "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n"
             "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n")
    acs = report.parse_acs(lspci)
    assert acs["present"] and acs["redirect"]
    off = report.parse_acs(lspci.replace("ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+",
                                         "ACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir-"))
    assert off["present"] and not off["redirect"]
    assert report.parse_acs("no capability here") == {"present": False, "redirect": False, "line": ""}
    assert [report.iommu_mode(t) for t in ("identity\n", "DMA", "DMA-FQ", None, "blocked")] == \
        ["passthrough", "translated", "translated", "off", "unknown"]
    topo = report.parse_topology((FIXTURES / "nvidia-smi-topo-8gpu-pcie.txt").read_text())
    pair = {"gpus": ["GPU0", "GPU1"], "links": topo["links"]}
    assert report.verdict(pair, {}, {})["safe"] is True
    v = report.verdict(pair, {"0000:01:00.0": "translated"}, {"0000:01:00.0": {"0000:00:01.0": acs}})
    assert v["safe"] is False and "ACS redirection" in v["reason"] and "iommu=pt" in v["reason"]


def test_not_a_topology_is_refused(report):
    with pytest.raises(ValueError, match="not `nvidia-smi topo -m` output"):
        report.parse_topology("hello\nworld\n")


def test_the_script_runs_standalone_on_a_captured_file(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--topo-file", str(FIXTURES / "nvidia-smi-topo-8gpu-pcie.txt"),
                        "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["p2p"]["possible"] is False

"""The driver path of a bare GPU host on the sandbox (issue 30): preflight checks what will be true
after the play. The sandbox has no GPU, so a stand-in driver package is built here: it installs an
`nvidia-smi` that answers the queries the roles make (one H200, driver 580.159.04, CUDA 13.0) and is
served to the host from a flat apt repository of its own (a vendor repository's shape).

- without k26_manage_driver, a host whose nvidia-smi is missing fails preflight naming the fix, and
  nothing changes;
- with it, preflight lets the missing driver through, gpu_host adds the repository, installs the
  pinned package, reboots the host, takes its lock again and checks the GPUs as preflight does; the
  deploy then passes.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import deploy, guest

VERSION = "580.159.04"
PACKAGE = "k26-test-nvidia-driver"
REPO = "/srv/k26-test-driver-repo"
SMI = f"""#!/bin/sh
# k26 test stand-in for nvidia-smi (the sandbox has no GPU): answers the queries the roles make
case "$*" in
  *name,driver_version*) echo "NVIDIA H200, {VERSION}" ;;
  *pci.bus_id*) echo "00000000:FF:00.0" ;;
  *driver_version*) echo "{VERSION}" ;;
  *topo*) printf '\\tGPU0\\tCPU Affinity\\tNUMA Affinity\\tGPU NUMA ID\\nGPU0\\t X \\t0-1\\t0\\t\\tN/A\\n' ;;
  *) echo "| NVIDIA-SMI {VERSION}   Driver Version: {VERSION}   CUDA Version: 13.0 |" ;;
esac
"""
GPU = {"k26_gpu_required": True, "k26_gpu_count": 1, "k26_gpu_name_pattern": "H200", "k26_nccl_smoke": False,
       "k26_persistenced": False, "k26_triton_check": False}
MANAGED = {**GPU, "k26_manage_driver": True, "k26_driver_version": VERSION,
           "k26_driver_packages": [f"{PACKAGE}={VERSION}-1"],
           "k26_driver_apt_source": {"name": "k26-test-driver", "uris": [f"file://{REPO}"], "suites": ["./"],
                                     "trusted": True}}


def build_package(tmp: Path) -> Path:
    root = tmp / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(
        f"Package: {PACKAGE}\nVersion: {VERSION}-1\nArchitecture: all\nMaintainer: k26 tests <k26@localhost>\n"
        "Description: k26 test stand-in for the NVIDIA driver's nvidia-smi (no GPU)\n")
    smi = root / "usr/bin/nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(0o755)
    deb = tmp / f"{PACKAGE}_{VERSION}-1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True)
    return deb


def publish(deb: Path) -> None:
    """A flat apt repository on the host: the package and its Packages index."""
    info = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout.strip()
    sha = subprocess.run(["sha256sum", str(deb)], check=True, capture_output=True, text=True).stdout.split()[0]
    stanza = f"{info}\nFilename: ./{deb.name}\nSize: {deb.stat().st_size}\nSHA256: {sha}\n"
    guest(f"mkdir -p {REPO}")
    subprocess.run(["ssh", "-F", str(Path.home() / ".cache/k26-ddtree/sandbox/ssh_config"), "k26-sandbox",
                    f"cat > {REPO}/{deb.name}"], input=deb.read_bytes(), check=True, capture_output=True)
    guest(f"cat > {REPO}/Packages <<'EOF'\n{stanza}\nEOF")


@pytest.fixture
def no_driver_after(converged):
    """Put the host back as it was: no stand-in driver, no repository, the inventory's settings."""
    yield
    guest(f"apt-get purge -y -q {PACKAGE} >/dev/null 2>&1; rm -rf {REPO} /etc/apt/sources.list.d/k26-test-driver.sources",
          check=False)
    play = deploy()
    assert play.rc == 0, play.out[-3000:]


@pytest.mark.extended
def test_a_missing_driver_fails_preflight_unless_the_deploy_installs_it(no_driver_after, tmp_path):
    assert guest("command -v nvidia-smi", check=False).returncode != 0
    pid = guest("systemctl show -p MainPID --value k26-ddtree").stdout.strip()
    refused = deploy("-e", json.dumps(GPU), tmp=tmp_path / "a")
    text = re.sub(r"\s+", " ", refused.out)
    assert refused.rc != 0 and "nvidia-smi failed" in text and "k26_manage_driver: true" in text, text[-2000:]
    assert guest("systemctl show -p MainPID --value k26-ddtree").stdout.strip() == pid     # nothing changed

    publish(build_package(tmp_path))
    booted = guest("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    managed = deploy("-e", json.dumps(MANAGED), tmp=tmp_path / "b")
    text = re.sub(r"\s+", " ", managed.out)
    assert managed.rc == 0, text[-4000:]
    assert "no working NVIDIA driver" in text and f"gpu_host installs {PACKAGE}={VERSION}-1" in text   # preflight let it through
    assert f"NVIDIA driver {VERSION}, CUDA 13.0 (installed by this deploy, was none)" in text
    assert guest("cat /proc/sys/kernel/random/boot_id").stdout.strip() != booted                   # rebooted once
    assert guest(f"dpkg-query -W -f '${{Version}}' {PACKAGE}").stdout == f"{VERSION}-1"
    assert guest("systemctl is-active k26-ddtree").stdout.strip() == "active"

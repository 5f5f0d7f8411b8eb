"""testinfra: the gpu_host role on the sandbox host (no GPUs): toolkit, drop-in, caches, report."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import current_release, deploy
from .test_sandbox_host import service_state


def cuda_home(host) -> str:
    return f"{current_release(host)}/venv/lib/python3.11/site-packages/nvidia/cu13"


def test_nvcc_from_the_venv_answers_its_version_as_the_service_user(host, converged):
    CUDA_HOME = cuda_home(host)
    env = host.file("/etc/k26/gpu-host.env")
    assert env.user == "root" and env.group == "k26" and env.mode == 0o644
    assert f"CUDA_HOME={CUDA_HOME}" in env.content_string.splitlines()
    out = host.check_output(f"runuser -u k26 -- {CUDA_HOME}/bin/nvcc --version")
    assert re.search(r"release 13\.\d+", out), out
    assert "nvcc 13." in converged[0].out                      # the role's own check said so


def test_the_unit_reads_the_gpu_env_before_its_own(host, converged):
    CUDA_HOME = cuda_home(host)
    lines = host.file("/etc/systemd/system/k26-ddtree.service").content_string.splitlines()
    assert lines.index("EnvironmentFile=-/etc/k26/gpu-host.env") < lines.index("EnvironmentFile=/etc/k26/k26-ddtree.env")
    pid = host.check_output("systemctl show -p MainPID --value k26-ddtree")
    environ = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ")
    assert f"CUDA_HOME={CUDA_HOME}" in environ.splitlines()
    assert "TVM_FFI_CACHE_DIR=/var/lib/k26/cache/tvm-ffi" in environ.splitlines()


def test_persistenced_drop_in_renders_without_touching_a_vendor_unit(host, converged):
    drop = host.file("/etc/systemd/system/nvidia-persistenced.service.d/k26.conf")
    assert drop.user == "root" and drop.mode == 0o644
    body = drop.content_string.splitlines()
    assert "ExecStart=" in body and any(line.startswith("ExecStart=/usr/bin/nvidia-persistenced") and
                                        "--persistence-mode" in line for line in body)
    assert not host.file("/etc/systemd/system/nvidia-persistenced.service").exists
    assert "k26_gpu_required is false: skipping the driver" in converged[0].out


def test_jit_caches_are_owned_by_the_service_user(host, converged):
    for name in ("sglang", "triton", "flashinfer", "tvm-ffi", "nvidia-compute"):
        d = host.file(f"/var/lib/k26/cache/{name}")
        assert d.is_directory and d.user == "k26" and d.group == "k26" and d.mode == 0o750, name


def test_a_triton_kernel_is_compiled_as_the_service_user_before_the_start(host, converged):
    """Issue 30: the compiler and headers the JIT builds need are there, proven by compiling one
    Triton kernel in the release venv as k26 (the CPU-side stages; the launch needs a GPU host)."""
    out = converged[0].out
    assert "triton_check: compile: cubin for sm_120" in out
    assert "triton_check: host build: C extension built and loaded (gcc + Python headers)" in out
    assert "triton_check: launch: not run: no CUDA GPU visible" in out
    for package in ("gcc", "g++", "python3-dev"):
        assert host.package(package).is_installed, package
    assert host.file("/var/lib/k26/cache/triton").user == "k26"


def test_the_report_says_gpu_facts_were_skipped(host, converged):
    report = json.loads(host.file("/var/lib/k26/gpu-host-report.json").content_string)
    assert report["skipped"].startswith("k26_gpu_required is false")
    assert report["nccl_p2p_disable"] is False and report["k26_nccl_p2p"] == "auto"
    assert "NCCL_P2P_DISABLE" not in host.file("/etc/k26/gpu-host.env").content_string


@pytest.mark.extended
def test_p2p_false_writes_the_nccl_switch_and_restarts_then_auto_removes_it(host, tmp_path, converged):
    pid_before = host.check_output("systemctl show -p MainPID --value k26-ddtree")
    play = deploy("-e", "k26_nccl_p2p=false", tmp=tmp_path)
    assert play.rc == 0, play.out[-3000:]
    assert "NCCL_P2P_DISABLE=1" in host.file("/etc/k26/gpu-host.env").content_string.splitlines()
    assert host.check_output("systemctl show -p MainPID --value k26-ddtree") != pid_before   # restarted
    play = deploy(tmp=tmp_path)
    assert play.rc == 0, play.out[-3000:]
    assert "NCCL_P2P_DISABLE" not in host.file("/etc/k26/gpu-host.env").content_string


def test_bad_gpu_values_fail_before_any_change(host, tmp_path, converged):
    before = service_state(host)
    for extra, message in (("k26_min_driver_version=R580", "k26_min_driver_version=R580 is invalid"),
                           ("k26_nccl_p2p=maybe", "k26_nccl_p2p=maybe is invalid")):
        play = deploy("-e", extra, tmp=tmp_path)
        assert play.rc != 0 and message in re.sub(r"\s+", " ", play.out), play.out[-2000:]
        assert "Take the host deploy lock" not in play.out
        assert service_state(host) == before

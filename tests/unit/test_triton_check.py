"""ddtree.tools.triton_check on the CPU: Triton's compiler to a cubin and its C-extension build with
the system compiler and Python headers; a missing compiler is named with the fix."""

from __future__ import annotations

import os
import subprocess
import sys


def check(tmp_path, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # the real compiler, not the interpreter
    e.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), **env)
    return subprocess.run([sys.executable, "-m", "ddtree.tools.triton_check", "--arch", "120"], capture_output=True,
                          text=True, timeout=300, env=e)


def test_the_kernel_compiles_and_the_host_build_works_on_the_cpu(tmp_path):
    r = check(tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("triton_check: compile: cubin for sm_120: ") and "bytes" in lines[0]
    assert lines[1].startswith("triton_check: host build: C extension built and loaded")
    assert lines[2].startswith("triton_check: launch: not run: no CUDA GPU visible")


def test_a_missing_compiler_is_named_with_the_fix(tmp_path):
    r = check(tmp_path, CC=str(tmp_path / "no-compiler"))
    assert r.returncode == 1
    assert r.stdout.startswith("triton_check: compile: cubin for sm_120")          # the stage before it passed
    assert "host build: Triton could not build a C extension" in r.stderr and "gcc, python3-dev" in r.stderr

"""ddtree.tools.nccl_smoke with the gloo backend on CPUs: the sum check, a hang, bad arguments."""

from __future__ import annotations

import subprocess
import sys

from ddtree.tools.nccl_smoke import run_smoke


def test_every_rank_sees_the_right_sum():
    result = run_smoke(3, backend="gloo", timeout=60)
    assert result.ok, result.reason
    assert result.expected == 6 and [r.value for r in result.ranks] == [6.0, 6.0, 6.0]


def test_a_rank_that_never_joins_is_a_hang_reported_within_the_timeout():
    result = run_smoke(2, backend="gloo", timeout=6, hang_rank=1)
    assert not result.ok
    assert "did not finish within 6 s" in result.reason and "NCCL_P2P_DISABLE=1" in result.reason
    assert result.seconds < 30


def test_the_command_line_names_bad_values():
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "ddtree.tools.nccl_smoke", *args], capture_output=True,
                              text=True, timeout=60)

    r = cli("--backend", "gloo")
    assert r.returncode == 2 and "--backend gloo needs --world-size N" in r.stderr
    r = cli("--backend", "gloo", "--world-size", "0")
    assert r.returncode == 2 and "--world-size 0 is invalid" in r.stderr
    r = cli("--backend", "gloo", "--world-size", "2", "--json")
    assert r.returncode == 0 and '"ok": true' in r.stdout


def test_jit_warmup_says_what_is_missing():
    r = subprocess.run([sys.executable, "-m", "ddtree.tools.jit_warmup"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "SGLang's tree kernels are not importable" in r.stderr or "no CUDA GPU visible" in r.stderr

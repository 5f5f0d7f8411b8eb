"""Compile one Triton kernel in this venv before the service starts, so a missing compiler, Python
headers or a broken Triton shows in the deploy instead of in the first request.

    python -m ddtree.tools.triton_check [--arch 120]

Run as the service user with the service's cache variables (the gpu_host role does). Three stages,
each one line:
1. compile: a vector add through Triton's whole compiler for CUDA sm_<arch> (TTIR, TTGIR, LLVM IR,
   PTX, cubin with Triton's own ptxas) - CPU-side, no GPU needed;
2. host build: Triton's own C-extension build (`triton.runtime.build`, the path its CUDA launcher
   takes on a GPU host) with the system C compiler and the Python headers - what the runtime role's
   packages (gcc, python3-dev) are for; CPU-side;
3. launch: the kernel on the GPU, its result checked - only where a CUDA GPU is visible; otherwise
   reported as not run (the sandbox) and still exit 0.
Exits 1 naming the stage and the fix when a stage fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

BLOCK = 128
STUB = """
#include <Python.h>
static PyObject* ping(PyObject* self, PyObject* args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"ping", ping, METH_NOARGS, "k26 check"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "k26_triton_stub", NULL, -1, methods};
PyMODINIT_FUNC PyInit_k26_triton_stub(void) { return PyModule_Create(&module); }
"""


class CheckFailed(RuntimeError):
    """A stage failed; the message names it and the fix."""


@dataclass(frozen=True)
class Stage:
    name: str
    detail: str
    seconds: float


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = i < n
        tl.store(out + i, tl.load(x + i, mask=live) + tl.load(y + i, mask=live), mask=live)

    return add


def compile_for(arch: int) -> Stage:
    """Stage 1: the kernel through Triton's compiler to a cubin for sm_<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    t0 = time.perf_counter()
    src = ASTSource(fn=_kernel(), signature={"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32",
                                             "BLOCK": "constexpr"}, constexprs={"BLOCK": BLOCK})
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32))
    except Exception as err:  # Triton raises many types; the message is what the operator needs
        raise CheckFailed(f"compile: Triton could not compile for sm_{arch} ({type(err).__name__}: {err}); "
                          "reinstall the release (its Triton and ptxas come from the locked wheels)") from None
    cubin = compiled.asm.get("cubin", b"")
    if not cubin:
        raise CheckFailed(f"compile: Triton produced no cubin for sm_{arch}")
    return Stage("compile", f"cubin for sm_{arch}: {len(cubin)} bytes", time.perf_counter() - t0)


def build_host_stub() -> Stage:
    """Stage 2: a C extension through Triton's own build (system compiler + Python headers)."""
    from triton.runtime.build import compile_module_from_src

    t0 = time.perf_counter()
    try:
        module = compile_module_from_src(STUB, "k26_triton_stub")
    except Exception as err:
        raise CheckFailed(f"host build: Triton could not build a C extension ({type(err).__name__}: {err}); "
                          "install a C compiler and the Python headers of the venv's Python "
                          "(Debian: gcc, python3-dev - the runtime role's k26_system_packages)") from None
    if module.ping() != 42:
        raise CheckFailed("host build: the built extension answered wrongly")
    return Stage("host build", "C extension built and loaded (gcc + Python headers)", time.perf_counter() - t0)


def launch_on_gpu() -> Stage:
    """Stage 3: run the kernel on the GPU and check x + y."""
    import torch

    t0 = time.perf_counter()
    if not torch.cuda.is_available():
        return Stage("launch", "not run: no CUDA GPU visible (only a GPU host shows the launch)", 0.0)
    n = 1000
    x, y = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    _kernel()[((n + BLOCK - 1) // BLOCK,)](x, y, out, n, BLOCK=BLOCK)
    if not torch.equal(out, x + y):
        raise CheckFailed("launch: the kernel's result differs from x + y")
    return Stage("launch", f"ran on {torch.cuda.get_device_name(0)}, result checked", time.perf_counter() - t0)


def default_arch() -> int:
    """The visible GPU's compute capability (major * 10 + minor), else sm_120 (RTX PRO 6000 Blackwell)."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return major * 10 + minor
    except ImportError:
        pass
    return 120


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree.tools.triton_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=None, help="compute capability to compile for (default: the GPU's, else 120)")
    args = ap.parse_args(argv)
    try:
        import triton  # noqa: F401
    except ImportError as err:
        print(f"triton_check: Triton is not importable in this venv ({err}): the release's lock must hold it",
              file=sys.stderr)
        return 1
    arch = args.arch or default_arch()
    try:
        for run in (lambda: compile_for(arch), build_host_stub, launch_on_gpu):
            stage = run()
            print(f"triton_check: {stage.name}: {stage.detail} ({stage.seconds:.1f} s)", flush=True)
    except CheckFailed as err:
        print(f"triton_check: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

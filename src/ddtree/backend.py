"""Which implementation runs a stage: the plain-torch path or the Triton kernels.

`resolve_backend` picks 'triton' on CUDA when Triton imports, else 'torch' (DDTREE_BACKEND or an
explicit argument overrides); `kernels` hands out ddtree._triton. Triton is an optional
dependency, so _triton is imported here on first use only: a CPU-only install never imports it.
Layering: backend imports _checks and switches (and _triton lazily); tree, verify, tp and the SGLang glue
import backend; _triton imports only ddtree.types.
"""

from __future__ import annotations

from types import ModuleType

import torch

from ddtree import _checks, switches

BACKENDS = switches.BY_FIELD["backend"].choices      # ("auto", "torch", "triton"): DDTREE_BACKEND's, one list


def kernels() -> ModuleType:
    """The Triton kernel module (imports Triton on first use; the optional dependency)."""
    from ddtree import _triton  # optional dependency: only a CUDA path or a Triton test gets here

    return _triton


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """'triton' on CUDA when Triton imports, else 'torch'; DDTREE_BACKEND or `backend` overrides."""
    choice = backend or switches.one("backend")       # DDTREE_BACKEND, checked by the registry
    if choice not in BACKENDS:
        raise _checks.fail("backend", choice, "expected 'auto', 'torch' or 'triton' (also DDTREE_BACKEND)")
    if choice == "auto":
        if device.type != "cuda":
            return "torch"
        return "triton" if kernels().available() else "torch"
    return choice

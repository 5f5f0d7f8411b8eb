"""Argument checks shared by build_tree and verify_tree.

Every check raises ValueError naming the argument, the value it got and what is allowed.
Shape/dtype/device checks read only metadata (no host synchronisation). Checks that must read
tensor values run only where that costs no GPU synchronisation (CPU tensors) or when the
environment variable DDTREE_DEBUG=1 asks for them, and never while a CUDA graph is captured.
"""

from __future__ import annotations

import torch

from ddtree import switches

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def debug_enabled() -> bool:
    """True when DDTREE_DEBUG is on (expensive value checks such as NaN scans; ddtree.switches)."""
    return bool(switches.one("debug"))


def capturing(t: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on the current stream."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def value_checks_allowed(t: torch.Tensor) -> bool:
    """Value checks read tensor data: allowed on CPU, or on GPU with DDTREE_DEBUG=1, never in capture."""
    if capturing(t):
        return False
    return (not t.is_cuda) or debug_enabled()


def fail(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"{name}={value!r} is invalid: {allowed}")


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(name, value, "expected an integer >= 1")
    return value


def check_float_logits(name: str, t: object, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise fail(name, type(t).__name__, f"expected a torch.Tensor with {ndim} dimensions")
    if t.dtype not in FLOAT_DTYPES:
        raise fail(f"{name}.dtype", t.dtype, "expected a floating dtype (bf16, fp16, fp32 or fp64); "
                   "pass the model's logits, not token ids")
    if t.dim() != ndim:
        raise fail(f"{name}.shape", tuple(t.shape), f"expected {ndim} dimensions")
    return t


def check_no_nan(name: str, t: torch.Tensor) -> None:
    """NaN scan, only under DDTREE_DEBUG=1 (reads every element)."""
    if debug_enabled() and not capturing(t) and bool(torch.isnan(t).any()):
        raise fail(name, "contains NaN", "the model produced NaN logits; check the forward pass")


def per_request(name: str, value: object, bs: int, device: torch.device,
                dtype: torch.dtype) -> torch.Tensor:
    """A Python number (one value for the batch) or a [bs] tensor on `device` -> [bs] tensor."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.shape[0] != bs:
            raise fail(f"{name}.shape", tuple(value.shape), f"expected [{bs}] (one value per request)")
        if value.device != device:
            raise fail(f"{name}.device", str(value.device), f"expected {device} (the logits' device)")
        return value.to(dtype)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(name, value, f"expected a number or a [{bs}] tensor")
    return torch.full((bs,), value, dtype=dtype, device=device)


def check_range(name: str, value: object, t: torch.Tensor, lo: float, hi: float,
                lo_open: bool, hi_open: bool, allowed: str) -> None:
    """Range check of a sampling parameter: Python numbers always, tensors where value checks are allowed."""
    if isinstance(value, torch.Tensor):
        if not value_checks_allowed(t):
            return
        bad_lo = (t <= lo) if lo_open else (t < lo)
        bad_hi = (t >= hi) if hi_open else (t > hi)
        bad = bad_lo | bad_hi | torch.isnan(t)
        if bool(bad.any()):
            first = int(torch.nonzero(bad)[0, 0])
            raise fail(f"{name}[{first}]", float(t[first]), allowed)
        return
    v = float(value)  # type: ignore[arg-type]
    if v != v or (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi):
        raise fail(name, value, allowed)

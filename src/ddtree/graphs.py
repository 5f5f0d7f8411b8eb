"""Checks for CUDA-graph buffers: name the field whose source is None or mis-shaped.

The seed setup crashed inside SGLang's `_grouped_foreach_copy_` with a None source (0.5.12-13),
and newer SGLang silently skips None sources, replaying with stale buffers. Every copy into a
static graph buffer goes through `check_copy_sources` first (at capture and at the first replay
of each shape: cheap, metadata only, no host synchronisation).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class GraphBufferError(ValueError):
    """A graph buffer's source is missing or does not fit its static buffer."""


def check_copy_sources(pairs: Iterable[tuple[str, torch.Tensor | None, torch.Tensor]], where: str) -> None:
    """pairs: (field name, source, static destination). Raises GraphBufferError naming the field.

    A source fits when dtypes match, trailing dims match, and its leading dim is at most the
    destination's (it is copied into the destination's first rows).
    """
    for name, src, dst in pairs:
        if src is None:
            raise GraphBufferError(f"{where}: graph buffer source '{name}' is None: the batch never filled it; "
                                   f"set '{name}' explicitly before capture and replay")
        if not isinstance(src, torch.Tensor):
            raise GraphBufferError(f"{where}: graph buffer source '{name}' is a {type(src).__name__}, not a tensor")
        if src.dtype != dst.dtype:
            raise GraphBufferError(f"{where}: graph buffer '{name}' has dtype {src.dtype}, the static buffer "
                                   f"{dst.dtype}")
        if src.dim() != dst.dim() or tuple(src.shape[1:]) != tuple(dst.shape[1:]) or (
                src.dim() > 0 and src.shape[0] > dst.shape[0]):
            raise GraphBufferError(f"{where}: graph buffer '{name}' has shape {tuple(src.shape)}, which does not fit "
                                   f"the static buffer {tuple(dst.shape)}")


class FirstUseChecker:
    """Runs check_copy_sources once per (where, shapes) key: at capture and the first replay of a shape."""

    def __init__(self) -> None:
        self._seen: set[tuple] = set()

    def __call__(self, pairs: list[tuple[str, torch.Tensor | None, torch.Tensor]], where: str) -> None:
        key = (where,) + tuple((n, None if s is None else (tuple(s.shape), s.dtype)) for n, s, _ in pairs)
        if key in self._seen:
            return
        check_copy_sources(pairs, where)
        self._seen.add(key)


class BufferRegistry:
    """The static input buffers of one captured graph, by field name.

    Every per-step input goes through `copy_in`, which checks the sources (at capture and at the
    first replay of each shape, via FirstUseChecker) and copies each into its buffer's first rows.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.buffers: dict[str, torch.Tensor] = {}
        self._check = FirstUseChecker()

    def register(self, name: str, buffer: torch.Tensor) -> torch.Tensor:
        if name in self.buffers:
            raise GraphBufferError(f"{self.where}: graph buffer '{name}' registered twice")
        self.buffers[name] = buffer
        return buffer

    def copy_in(self, sources: dict[str, torch.Tensor | None], phase: str) -> None:
        """sources: one per registered field (a missing key counts as None). phase: 'capture' | 'replay'."""
        pairs = [(name, sources.get(name), dst) for name, dst in self.buffers.items()]
        self._check(pairs, f"{self.where} {phase}")
        for _, src, dst in pairs:
            dst[: src.shape[0]].copy_(src, non_blocking=True)

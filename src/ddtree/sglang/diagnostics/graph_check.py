"""Graph-input check before SGLang 0.5.23 replays a DFlash-family decode graph (DFLASH and DDTREE).

`DecodeCudaGraphRunner.load_batch` copies the step's ForwardBatch fields into the captured graph's
static buffers. In 0.5.12-0.5.13 a None source crashed inside `_grouped_foreach_copy_` (the seed's
crash, copying the draft forward's buffers); from 0.5.14 `CudaGraphBufferRegistry.fill_from` skips a
None source and the graph replays the previous step's values, and a dflash draft's None
`input_embeds` is skipped the same way. A BEFORE hook on load_batch checks, per field, that the
source exists, has the rows the captured width implies and the right kind of dtype, and raises
GraphBufferError naming the field, what it got and what to set. It runs at the first replay of each
(batch size, forward mode, source shapes) key - metadata only, no host synchronisation - so a field
that turns None later is a new key and is checked again. SGLANG_DDTREE_GRAPH_CHECK=off registers no
hook.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree.graphs import GraphBufferError
from ddtree import switches

ENV = switches.NAME["graph_check"]
TARGET = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.load_batch"
TOKEN_FIELDS = ("input_ids", "positions", "out_cache_loc")    # one row per token: [bs * width]
REQUEST_FIELDS = ("req_pool_indices", "seq_lens")              # one row per request: [bs]


@dataclass(frozen=True)
class Expected:
    name: str
    shape: tuple[int, ...]
    floating: bool          # float (embeddings) or integer (ids, positions, slots, lengths)


def enabled(environ=None) -> bool:
    """SGLANG_DDTREE_GRAPH_CHECK (ddtree.switches): on unless switched off; a bad value raises."""
    return switches.read(environ).graph_check


def applies_to(runner, forward_batch) -> bool:
    """DFlash-family runners (DFLASH, DDTREE) in a non-idle, fixed-width (not ragged) replay."""
    algorithm = getattr(runner.model_runner, "spec_algorithm", None)
    if algorithm is None or not algorithm.is_dflash_family():
        return False
    if getattr(runner, "ragged_verify_mode", False) or forward_batch.forward_mode.is_idle():
        return False
    return True


def expected_inputs(runner, forward_batch) -> list[Expected]:
    """What load_batch copies for this runner: [bs * captured_req_width] token rows, [bs] request
    rows, and for a dflash draft worker the block's input_embeds [bs * width, hidden]."""
    bs = int(forward_batch.batch_size)
    tokens = bs * int(runner.captured_req_width)
    expected = [Expected(n, (tokens,), False) for n in TOKEN_FIELDS]
    expected += [Expected(n, (bs,), False) for n in REQUEST_FIELDS]
    if runner.model_runner.is_draft_worker:
        hidden = int(runner.buffers.input_embeds.shape[-1])
        expected.append(Expected("input_embeds", (tokens, hidden), True))
    return expected


def problem(where: str, want: Expected, src) -> str | None:
    """The first thing wrong with one source, as a message that names the field and the fix; or None."""
    field = f"forward_batch.{want.name}"
    if src is None:
        return (f"{where}: graph input '{want.name}' is None; SGLang would skip the copy and replay the "
                f"previous step's values. Set {field} (shape {want.shape}) before the forward")
    if not isinstance(src, torch.Tensor):
        return f"{where}: graph input '{want.name}' is a {type(src).__name__}, expected a tensor of shape {want.shape}"
    if src.dtype.is_floating_point != want.floating or src.dtype == torch.bool:
        kind = "a floating-point" if want.floating else "an integer"
        return f"{where}: graph input '{want.name}' has dtype {src.dtype}, expected {kind} dtype; fix how {field} is built"
    if tuple(src.shape) != want.shape:
        return (f"{where}: graph input '{want.name}' has shape {tuple(src.shape)}, expected {want.shape}; "
                f"fix how {field} is built")
    return None


def missing_token_count(runner, forward_batch, where: str) -> str | None:
    """num_token_non_padded: its slot's post_fill keeps the old value when both sources are None."""
    registry = getattr(runner, "buffer_registry", None)
    if registry is None or not registry.has_slot("num_token_non_padded"):
        return None
    if forward_batch.num_token_non_padded is None and forward_batch.global_num_token_non_padded is None:
        return (f"{where}: graph input 'num_token_non_padded' is None (and global_num_token_non_padded too); "
                "the graph would keep the previous step's token count. Set forward_batch.num_token_non_padded "
                "to the batch's real token count")
    return None


def check_graph_inputs(runner, forward_batch) -> None:
    """Raise GraphBufferError for the first field that is None, mis-shaped or of the wrong dtype kind."""
    role = "draft" if runner.model_runner.is_draft_worker else "target"
    where = (f"{role} {forward_batch.forward_mode.name} graph (batch {forward_batch.batch_size}, "
             f"{runner.captured_req_width} tokens per request)")
    for want in expected_inputs(runner, forward_batch):
        message = problem(where, want, getattr(forward_batch, want.name, None))
        if message:
            raise GraphBufferError(message)
    message = missing_token_count(runner, forward_batch, where)
    if message:
        raise GraphBufferError(message)


def signature(runner, forward_batch) -> tuple:
    """The first-use key: batch size, mode and every checked source's shape and dtype (or None)."""
    names = TOKEN_FIELDS + REQUEST_FIELDS + ("input_embeds", "num_token_non_padded", "global_num_token_non_padded")
    sources = tuple(None if (s := getattr(forward_batch, n, None)) is None
                    else (tuple(s.shape), s.dtype) if isinstance(s, torch.Tensor) else type(s).__name__
                    for n in names)
    return (int(forward_batch.batch_size), str(forward_batch.forward_mode)) + sources


def before_load_batch(*args, **kwargs):
    """BEFORE hook on sglang 0.5.23 DecodeCudaGraphRunner.load_batch(self, forward_batch, pp_proxy_tensors)."""
    runner = args[0]
    forward_batch = args[1] if len(args) > 1 else kwargs["forward_batch"]
    if not applies_to(runner, forward_batch):
        return None
    seen = runner.__dict__.setdefault("_ddtree_checked_inputs", set())
    key = signature(runner, forward_batch)
    if key not in seen:
        check_graph_inputs(runner, forward_batch)
        seen.add(key)
    return None

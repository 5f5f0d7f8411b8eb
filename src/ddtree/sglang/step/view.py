"""StepView: what the decode stages read of the worker and of SGLang, in one frozen record.

The DDTreeWorker builds it once (worker_setup.step_view) at the end of its init_cuda_graphs, when everything it
names exists: the target's and the draft's graphs, the candidate head folded into the draft's graphs or not. The
stages (decode_step.py) take the view instead of the worker, so no stage reaches a private field of SGLang's
DFlashWorkerV2; the fields below are the whole contract, and tests/sglang/test_contract.py holds that each one is
read from a field DFlashWorkerV2 0.5.23 owns - all but `kernels`, the worker's own DDTREE_BACKEND resolved once.
No SGLang import here: the types are named in comments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class StepView:
    """The decode stages' read-only view of the worker (fixed after init_cuda_graphs)."""

    device: torch.device
    block: int                                # the draft's block (bonus + L mask tokens)
    mask_token_id: int                        # the draft's mask token
    block_pos_offsets: torch.Tensor           # int64 [block]: 0 .. block - 1
    full_embed: torch.Tensor | None           # [V, H] the gathered embedding table (attention DP), else None
    embedding: Callable[[torch.Tensor], torch.Tensor]   # the target's embedding module: ids [...] -> [..., H]
    embed_scale: float                        # the draft's noise-embedding scale (1.0: none)
    req_to_token: torch.Tensor                # int32 [pool rows, context] the target's token table (virtual ids)
    target_worker: object                     # SGLang TpModelWorker: its model runner and forward_batch_generation
    target_kv: object                         # the target's KVIndexTranslator (plans the verify window)
    target_has_graphs: bool                   # the target captured decode CUDA graphs
    draft_runner: object                      # the draft's ModelRunner (forward)
    draft_kv: object                          # the draft's KVIndexTranslator (its slots of the window)
    draft_spec_info: object                   # the draft block's spec info (DFlash's, block wide)
    draft_layout: object                      # the draft's parallel layout (draft_tp_context)
    head_in_graph: bool                       # the candidate head is folded into the draft's CUDA graphs
    append_draft_context: Callable[..., None]  # DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc
    next_draft_input: Callable[..., object]   # DFlashWorkerV2._make_next_draft_input_decode -> DFlashDraftInputV2
    kernels: str                              # 'triton' or 'torch': DDTREE_BACKEND resolved once, at start-up

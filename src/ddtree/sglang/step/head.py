"""The DDTree draft head: draft hidden states -> per-depth candidates (no SGLang import).

A DFlash draft has no LM head of its own; it borrows the target's. The head multiplies the
draft's hidden states at depths 1..L by this rank's rows of that LM head and keeps the top-K
tokens per depth with their log-probabilities (softmax at temperature 1 over the whole
vocabulary). Under tensor parallelism each rank holds a vocabulary shard: it takes its shard's
top-K raw logits and log-normaliser, one all-gather brings every rank's (K logits, K ids, 1
normaliser) - not the logits - and every rank merges them identically (ddtree.tp).

The same object runs two ways:
- folded into the draft model's CUDA graph (SGLang's capture-tail hook calls it with the
  graph's hidden-state output; it writes its static buffers `logp` / `tokens`, read with
  `captured(bs)` after a replay);
- eagerly (`compute`), for batches the draft graph does not cover, returning fresh tensors.
No host synchronisation in either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ddtree.tp import merge_packed, pack_shard, shard_candidates
from ddtree.tree import draft_candidates
from ddtree.types import Candidates

# all_gather_into_tensor(output [W * n], input [n]) of the TP group, e.g. SGLang's GroupCoordinator method
Gather = Callable[[torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class HeadShard:
    """This rank's rows of the target LM head (SGLang's ParallelLMHead shard)."""

    weight: torch.Tensor   # [Vs_padded, H]; rows [0, num_org) are tokens vocab_start .. vocab_start + num_org - 1
    num_org: int           # real (unpadded) rows of this shard
    vocab_start: int       # global id of row 0
    world: int = 1         # TP ranks sharing the vocabulary
    gather: Gather | None = None


class DraftCandidateHead:
    def __init__(self, shard: HeadShard, k: int, block_size: int, max_bs: int):
        if shard.world > 1 and shard.gather is None:
            raise ValueError(f"HeadShard.world={shard.world} needs the TP group's all_gather_into_tensor")
        self.shard = shard
        self.k = k
        self.block_size = block_size
        self.reserve(max_bs)

    def reserve(self, max_bs: int) -> None:
        """(Re)allocate the static outputs for batches up to max_bs; call before any graph is captured."""
        depth, dev = self.block_size - 1, self.shard.weight.device
        self.logp = torch.full((max_bs, depth, self.k), float("-inf"), dtype=torch.float32, device=dev)  # [max_bs, L, K]
        self.tokens = torch.zeros((max_bs, depth, self.k), dtype=torch.int64, device=dev)               # [max_bs, L, K]

    def __call__(self, hidden_states: torch.Tensor, input_ids: torch.Tensor | None = None) -> None:
        """Capture-tail hook: hidden_states [bs * block, H] of the draft pass -> the static buffers."""
        cand = self.compute(hidden_states)
        bs = cand.logp.shape[0]
        self.logp[:bs].copy_(cand.logp)
        self.tokens[:bs].copy_(cand.tokens)

    def captured(self, bs: int) -> Candidates:
        """What the last graph replay wrote for the first bs requests (views of the static buffers)."""
        return Candidates(logp=self.logp[:bs], tokens=self.tokens[:bs])

    def compute(self, hidden_states: torch.Tensor) -> Candidates:
        """hidden_states [bs * block, H] (slot 0 = the bonus token, slots 1..L = depths) -> Candidates [bs, L, K]."""
        hidden = hidden_states.view(-1, self.block_size, hidden_states.shape[-1])[:, 1:]     # [bs, L, H]
        w = self.shard.weight
        logits = torch.matmul(hidden.to(w.dtype), w[: self.shard.num_org].t())                # [bs, L, Vs]
        if self.shard.world == 1:
            return draft_candidates(logits, self.k)
        packed = pack_shard(shard_candidates(logits, self.k, self.shard.vocab_start))        # [bs, L, 2K+1]
        gathered = packed.new_empty((self.shard.world, *packed.shape))                        # [W, bs, L, 2K+1]
        self.shard.gather(gathered.view(-1), packed.reshape(-1))
        return merge_packed(gathered, self.k)

"""The core's data: result and input types, and the static order helpers every stage shares.

The bottom layer of ddtree: it imports only torch and ddtree._checks, and every other core
module (tree, verify, tp, _triton, backend) imports it, never the other way round.

  order_key / MASK32   int64 keys that sort by float32 score descending, then index ascending
  level_pairs          the static (parent slot, child rank) pairs a depth can select from
  Candidates           top-K draft candidates per depth          (tree stage 1 -> 2; tp merge)
  ShardCandidates      one tensor-parallel rank's share of them  (tp)
  DraftTree            the tree a verify pass runs over          (tree -> verify, glue)
  SamplingParams       per-request sampling parameters as tensors (verify)
  Verdict              what verification accepted                (verify -> engines)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ddtree import _checks

MASK32 = 0xFFFFFFFF
PAD_ID = 2**31 - 1  # the global id of a missing candidate (a tensor-parallel shard narrower than k)


@lru_cache(maxsize=256)
def _pair_lists(w_prev: int, k: int, budget: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Static (parent slot, child rank) pairs that can reach the top `budget`: (i+1)(j+1) <= budget."""
    ii: list[int] = []
    jj: list[int] = []
    for i in range(w_prev):
        for j in range(k):
            if (i + 1) * (j + 1) > budget:
                break
            ii.append(i)
            jj.append(j)
    return tuple(ii), tuple(jj)


_PAIR_TENSORS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def level_pairs(w_prev: int, k: int, budget: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair index tensors (int64 [P] each) on `device`, cached; built on the host outside capture."""
    key = (w_prev, k, budget, str(device))
    hit = _PAIR_TENSORS.get(key)
    if hit is not None:
        return hit
    ii, jj = _pair_lists(w_prev, k, budget)
    pair = (_to_device(ii, device), _to_device(jj, device))
    _PAIR_TENSORS[key] = pair
    return pair


_PINNED: list[torch.Tensor] = []     # host sources of copies in flight (a pinned copy may outlive the call)


def _to_device(values: list[int] | tuple[int, ...], device: torch.device) -> torch.Tensor:
    """int64 [n] on `device`; to a GPU through pinned memory without waiting (a pageable copy blocks the host)."""
    host = torch.tensor(values, dtype=torch.int64)
    if torch.device(device).type != "cuda":
        return host.to(device)
    host = host.pin_memory()
    _PINNED.append(host)
    return host.to(device, non_blocking=True)


def order_key(score: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """int64 key sorting by score descending, then index ascending (index < 2**32).

    The float32 bits are mapped to an int whose signed order is the float order (-0.0 folded
    into 0.0, -inf the smallest).
    """
    bits = (score.float() + 0.0).contiguous().view(torch.int32).to(torch.int64)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered << 32) | (MASK32 - index)


@dataclass(frozen=True)
class Candidates:
    """Top-K draft candidates per depth, best first (ties: smaller token id first)."""

    logp: torch.Tensor    # float32 [bs, L, K]  log q_d(token); -inf = no candidate
    tokens: torch.Tensor  # int64   [bs, L, K]


@dataclass(frozen=True)
class ShardCandidates:
    """One rank's contribution: its top-k logits with global ids, and its log-normaliser."""

    logits: torch.Tensor  # float32 [bs, L, k]  raw logits of the shard's best tokens (-inf if fewer)
    ids: torch.Tensor     # int64   [bs, L, k]  global token ids
    log_z: torch.Tensor   # float32 [bs, L]     logsumexp over the shard


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees of width N = budget + 1 (node 0 = root = last verified token).

    Valid nodes come first; each parent precedes its children; siblings in decreasing score.
    Padding nodes carry the root's token (so a verify pass can embed them), parent -1, depth -1,
    score -inf, and attend to themselves only.
    """

    tokens: torch.Tensor         # int64 [bs, N]
    parents: torch.Tensor        # int64 [bs, N]   -1 for the root and for padding
    depths: torch.Tensor         # int64 [bs, N]   0 root, 1..L nodes, -1 padding
    scores: torch.Tensor         # float32 [bs, N] 0 root, -inf padding
    num_nodes: torch.Tensor      # int64 [bs]      valid nodes including the root
    ancestor_mask: torch.Tensor  # bool [bs, N, N] row i: i and its ancestors
    max_depth: int               # L

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def positions(self, root_positions: torch.Tensor) -> torch.Tensor:
        """Sequence positions of the nodes: root position + depth (padding: root position).

        root_positions int64 [bs] -> int64 [bs, N]. Example: depths [0, 1, 1, 2, -1] and root
        position 7 give [7, 8, 8, 9, 7].
        """
        if root_positions.shape != (self.batch_size,):
            raise _checks.fail("root_positions.shape", tuple(root_positions.shape),
                               f"expected [{self.batch_size}]")
        return root_positions.to(torch.int64)[:, None] + self.depths.clamp(min=0)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters as tensors [bs] (None = statically off for the batch)."""

    temperature: torch.Tensor     # float32 [bs], 0 = greedy
    top_k: torch.Tensor | None    # int64 [bs], <= 0 = off
    top_p: torch.Tensor | None    # float32 [bs], 1 = off
    min_p: torch.Tensor | None    # float32 [bs], 0 = off
    all_greedy: bool              # True when temperature was the Python number 0


@dataclass(frozen=True)
class Verdict:
    """Result of verifying a batch of trees; L = the tree's max_depth."""

    accepted: torch.Tensor    # int64 [bs, L+1] node indices of the accepted path; [:, 0] == 0; -1 padded
    accept_len: torch.Tensor  # int64 [bs]      accepted draft tokens, 0..L
    bonus: torch.Tensor       # int64 [bs]      the target's token at the last accepted node
    tokens: torch.Tensor      # int64 [bs, L+1] accepted draft tokens, then the bonus; -1 padded

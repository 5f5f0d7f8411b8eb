"""Draft candidates under tensor parallelism: each rank holds a vocabulary shard.

Each rank takes the top-k of its shard (by logit, ties to the smaller global id) and its local
log-normaliser; one all-gather brings every rank's (values, global ids, normaliser); every rank
then merges identically: global log-normaliser = logsumexp of the local ones, candidates = the
top-k of the gathered values. The result equals draft_candidates_torch on the full vocabulary.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddtree.backend import kernels, resolve_backend
from ddtree.types import MASK32, PAD_ID, Candidates, ShardCandidates, order_key


def shard_candidates(shard_logits: torch.Tensor, k: int, vocab_start: int,
                     backend: str | None = None) -> ShardCandidates:
    """shard_logits [bs, L, Vs] (this rank's columns vocab_start .. vocab_start + Vs - 1).

    backend as in ddtree.build_tree: on CUDA the fused Triton kernels (one read of the shard),
    elsewhere torch; both give the same candidates.
    """
    if resolve_backend(backend, shard_logits.device) == "triton":
        return kernels().shard_candidates(shard_logits, k, vocab_start)
    return shard_candidates_torch(shard_logits, k, vocab_start)


def shard_candidates_torch(shard_logits: torch.Tensor, k: int, vocab_start: int) -> ShardCandidates:
    """The plain-torch shard candidates (the reference for the Triton path)."""
    x = shard_logits.float()
    vs = x.shape[-1]
    kk = min(k, vs)
    global_ids = torch.arange(vocab_start, vocab_start + vs, device=x.device)
    top = order_key(x, global_ids).topk(kk, dim=-1).values                   # [bs, L, kk]
    ids = MASK32 - (top & MASK32)
    logits = x.gather(-1, ids - vocab_start)
    if kk < k:  # a shard narrower than k: pad with impossible candidates
        pad = k - kk
        logits = torch.cat([logits, logits.new_full((*logits.shape[:-1], pad), float("-inf"))], dim=-1)
        ids = torch.cat([ids, ids.new_full((*ids.shape[:-1], pad), PAD_ID)], dim=-1)
    return ShardCandidates(logits=logits, ids=ids, log_z=torch.logsumexp(x, dim=-1))


def merge_shards(logits: torch.Tensor, ids: torch.Tensor, log_z: torch.Tensor, k: int) -> Candidates:
    """Merge gathered shards: logits/ids [W, bs, L, k], log_z [W, bs, L] -> Candidates (K = k)."""
    world, bs, depth, kk = logits.shape
    flat_logits = logits.permute(1, 2, 0, 3).reshape(bs, depth, world * kk)  # [bs, L, W*k]
    flat_ids = ids.permute(1, 2, 0, 3).reshape(bs, depth, world * kk)
    pick = order_key(flat_logits, flat_ids).topk(k, dim=-1).indices
    best = flat_logits.gather(-1, pick)
    total_z = torch.logsumexp(log_z, dim=0)                                  # [bs, L]
    logp = torch.where(torch.isfinite(best), best - total_z[..., None], float("-inf"))
    return Candidates(logp=logp, tokens=flat_ids.gather(-1, pick))


def pack_shard(local: ShardCandidates) -> torch.Tensor:
    """One rank's contribution as one tensor for one all-gather: float64 [bs, L, 2k+1] laid out
    [logits (k) | ids (k) | log_z (1)]; float64 holds ids < 2**53 exactly."""
    return torch.cat([local.logits.double(), local.ids.double(), local.log_z.double()[..., None]], dim=-1)


def merge_packed(gathered: torch.Tensor, k: int) -> Candidates:
    """gathered float64 [W, bs, L, 2k+1] (every rank's pack_shard, in rank order) -> Candidates."""
    logits = gathered[..., :k].float()
    ids = gathered[..., k:2 * k].long()
    log_z = gathered[..., 2 * k].float()
    return merge_shards(logits, ids, log_z, k)


def tp_candidates(shard_logits: torch.Tensor, k: int, vocab_start: int, group=None,
                  backend: str | None = None) -> Candidates:
    """All ranks: local top-k, one all-gather (packed into one float64 tensor), identical merge."""
    packed = pack_shard(shard_candidates(shard_logits, k, vocab_start, backend))
    world = dist.get_world_size(group)
    parts = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(parts, packed, group=group)  # gloo (CPU tests) and NCCL alike
    return merge_packed(torch.stack(parts), k)                                # [W, bs, L, 2k+1]


def vocab_parallel_candidates(hidden: torch.Tensor, weight_shard: torch.Tensor, org_start: int, num_org: int,
                              k: int, group=None, backend: str | None = None) -> Candidates:
    """Draft candidates straight from a vocabulary-parallel LM head (SGLang's ParallelLMHead).

    hidden [bs, L, H] (the draft's normalised hidden states at depths 1..L); weight_shard
    [Vs_padded, H] this rank's rows, of which the first num_org are real tokens org_start.. (the
    rest pad the shard to an aligned size and must not count, not even in the log-normaliser).
    """
    shard_logits = torch.matmul(hidden, weight_shard[:num_org].t())          # [bs, L, num_org]
    return tp_candidates(shard_logits, k, org_start, group, backend)

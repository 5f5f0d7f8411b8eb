"""Seeded sampling of DDTREE's tree nodes as SGLang 0.5.23 draws a NONE request's token with a seed.

SGLang uses a request's `sampling_seed` only under deterministic inference
(`--enable-deterministic-inference`): its sampler then draws the token after the input at position p
by the Gumbel-max trick with murmur_hash(seed, p, token) as the noise (`multinomial_with_seed`), after
temperature, softmax and its top-k / top-p filter. DDTREE's verify pass gives the target's logits at
every tree node; drawing each node's target token with the same function, the node's own position and
the request's seed makes the draw a function of (the node's path, seed, position) only - so the
accepted path is, token for token, the answer NONE draws with that seed from the same logits, run
after run and whatever else is in the batch. It is still lossless: over seeds each draw is the
target's distribution.

This module imports SGLang at its top: ddtree.sglang.tree_worker imports it.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.sampler import sampling_from_probs_torch, top_k_top_p_min_p_sampling_from_probs_torch


def seeded_node_targets(rows: torch.Tensor, info, positions: torch.Tensor) -> torch.Tensor:
    """Each node's target token as SGLang's seeded sampler draws it.

    rows float [bs, N, V]: the target's logits at the nodes (logit bias applied); info: SGLang's
    SamplingBatchInfo of the batch (temperatures [bs, 1], top_ks / top_ps / min_ps [bs], sampling_seed
    int64 [bs], the need_* flags); positions int64 [bs, N]: each node's input position (prefix + depth).
    Returns int64 [bs, N]. No host synchronisation.
    """
    bs, n, vocab = rows.shape

    def per_node(x: torch.Tensor) -> torch.Tensor:                            # [bs] or [bs, 1] -> [bs * N]
        return x.reshape(bs).repeat_interleave(n)

    logits = rows.reshape(bs * n, vocab).float() / per_node(info.temperatures)[:, None]
    probs = torch.softmax(logits, dim=-1)                                       # [bs * N, V]
    seeds, where = per_node(info.sampling_seed), positions.reshape(bs * n)
    if not (info.need_top_p_sampling or info.need_top_k_sampling or info.need_min_p_sampling):
        ids = sampling_from_probs_torch(probs, sampling_seed=seeds, positions=where)
    else:
        ids = top_k_top_p_min_p_sampling_from_probs_torch(
            probs, per_node(info.top_ks), per_node(info.top_ps), per_node(info.min_ps), info.need_min_p_sampling,
            seeds, where)
    return ids.view(bs, n).to(torch.int64)

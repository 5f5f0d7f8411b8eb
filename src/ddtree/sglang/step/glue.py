"""Tensor glue between ddtree and SGLang's tree-verify path (no SGLang import here).

DraftTree -> SGLang's verify inputs: positions and the FULL_MASK custom mask (per request a row-major
N x (prefix + N) block: every node sees the whole prefix, then exactly its ancestors and itself; requests
concatenated). The EAGLE-format adapters (retrive arrays, accept outputs) that only tests use live in
tests/eagle_format.py.
Example: prefix lengths [3, 1], N = 2 (root + one child each) give a mask of
(3+2)*2 + (1+2)*2 = 16 entries and positions [3, 4, 1, 2].
The decode step uses verify_mask (mask + positions) and commit_step (commit_plan +
rewrite_req_to_token + the draft's slots): one Triton launch each on the GPU, the torch functions
here on the CPU and as the reference the kernels are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree.backend import kernels, resolve_backend
from ddtree.types import DraftTree, SamplingParams, Verdict


@dataclass(frozen=True)
class VerifyMask:
    custom_mask: torch.Tensor   # bool [sum_b N * (prefix_b + N)]  FULL_MASK, requests one after the other
    positions: torch.Tensor     # int64 [bs, N]                    prefix + depth (padding: prefix)


def verify_mask(tree: DraftTree, prefix_lens: torch.Tensor, total: int, max_prefix: int,
                backend: str | None = None) -> VerifyMask:
    """The verify pass's custom mask and positions: one Triton launch on the GPU, else full_mask +
    DraftTree.positions. prefix_lens int64 [bs] on the tree's device; host numbers: total =
    sum((p + N) * N) and max_prefix >= every p (upper bounds are fine for both)."""
    if resolve_backend(backend, tree.tokens.device) == "triton":
        mask = torch.empty(total, dtype=torch.bool, device=tree.tokens.device)
        positions = torch.empty_like(tree.depths)
        kernels().verify_mask_into(tree.ancestor_mask, tree.depths, prefix_lens, max_prefix, mask, positions)
        return VerifyMask(custom_mask=mask, positions=positions)
    return VerifyMask(custom_mask=full_mask(tree, prefix_lens, total), positions=tree.positions(prefix_lens))


def full_mask(tree: DraftTree, prefix_lens: torch.Tensor, total: int) -> torch.Tensor:
    """The flat FULL_MASK; prefix_lens int64 [bs] on the tree's device, total = sum((p + N) * N) (host)."""
    bs, n = tree.tokens.shape
    dev = tree.tokens.device
    sizes = (prefix_lens + n) * n                                            # [bs]
    offsets = torch.cumsum(sizes, 0) - sizes                                 # [bs] start of each block
    row_len = (prefix_lens + n)[:, None, None]                               # [bs, 1, 1]
    i = torch.arange(n, device=dev)[None, :, None]                           # node row
    j = torch.arange(n, device=dev)[None, None, :]                           # tree column
    dest = offsets[:, None, None] + i * row_len + prefix_lens[:, None, None] + j  # [bs, N, N]
    mask = torch.ones(total, dtype=torch.bool, device=dev)                   # prefix columns: visible
    mask[dest.reshape(-1)] = tree.ancestor_mask.reshape(-1)
    return mask


@dataclass(frozen=True)
class CommitPlan:
    """What a decode step writes back after its verdict (device tensors, no host synchronisation).

    With page size 1 the accepted path is kept without moving K/V: the request's reserved window of
    N slots (req_to_token[r, prefix : prefix + N], node i's K/V at slot window[i]) is permuted so the
    accepted nodes' slots come first, in path order; the other slots stay reserved for the next step.
    """

    window: torch.Tensor       # int64 [bs, N]    the permuted window: accepted nodes' slots (path order), then the rest
    order: torch.Tensor        # int64 [bs, N]    the permutation: window = old_window.gather(1, order)
    out_tokens: torch.Tensor   # int64 [bs, L+1]  accepted draft tokens, then the bonus; 0 after (SGLang's out_tokens)
    commit_lens: torch.Tensor  # int32 [bs]       accepted draft tokens + 1 (tokens committed this step)
    bonus: torch.Tensor        # int64 [bs]       the next root
    hidden_rows: torch.Tensor  # int64 [bs, L+1]  verify-pass rows b*N + node of the path (root first; root row as padding)
    positions: torch.Tensor    # int64 [bs, L+1]  prefix + j: where path token j now sits


def commit_plan(verdict: Verdict, window: torch.Tensor, prefix_lens: torch.Tensor) -> CommitPlan:
    """verdict over trees of width N; window int64 [bs, N] (slot of node i); prefix_lens int64 [bs]."""
    bs, n = window.shape
    steps = verdict.accepted.shape[1]                                        # L + 1
    dev = window.device
    valid = verdict.accepted >= 0                                            # [bs, L+1]
    rank = torch.arange(n, n + n + 1, device=dev).repeat(bs, 1)             # [bs, N+1] not accepted: after the path
    path_rank = torch.arange(steps, device=dev).expand(bs, steps)
    target_col = torch.where(valid, verdict.accepted, n)                    # padding goes to a spare column
    rank.scatter_(1, target_col, path_rank)
    order = rank[:, :n].argsort(dim=1, stable=True)                          # [bs, N]
    base = torch.arange(bs, device=dev)[:, None] * n
    return CommitPlan(window=window.gather(1, order), order=order,
                      out_tokens=verdict.tokens.clamp(min=0),
                      commit_lens=(verdict.accept_len + 1).to(torch.int32),
                      bonus=verdict.bonus,
                      hidden_rows=base + verdict.accepted.clamp(min=0),
                      positions=prefix_lens[:, None] + path_rank)


@dataclass(frozen=True)
class Commit:
    """A step's commit after the request token tables were rewritten (commit_step)."""

    out_tokens: torch.Tensor    # int64 [bs, L+1]  accepted draft tokens, then the bonus; 0 after (SGLang's out_tokens)
    commit_lens: torch.Tensor   # int32 [bs]       tokens committed this step (accepted + 1)
    new_seq_lens: torch.Tensor  # int64 [bs]       prefix + commit_lens
    draft_slots: torch.Tensor   # [bs, L+1] (draft_ids' dtype) the draft's KV slots of the path in path order, then the
    #                             rest of the window, then (a window narrower than L + 1: N < L + 1) the root's
    hidden_rows: torch.Tensor   # int64 [bs, L+1]  verify-pass rows b*N + node of the path (root row as padding)
    positions: torch.Tensor     # int64 [bs, L+1]  prefix + j


def commit_step(verdict: Verdict, window: torch.Tensor, draft_ids: torch.Tensor, prefix_lens: torch.Tensor,
                req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, backend: str | None = None) -> Commit:
    """Keep the accepted path: each request's reserved window (window int64 [bs, N], the slot of
    node i) is written back permuted (commit_plan) into its token-table row req_to_token[r, prefix :
    prefix + N]; draft_ids [bs, N] are the draft's slots of the same window. One Triton launch on
    the GPU; the torch path is commit_plan + rewrite_req_to_token."""
    if resolve_backend(backend, window.device) == "triton":
        bs, steps = verdict.accepted.shape
        dev = window.device
        out = Commit(out_tokens=torch.empty((bs, steps), dtype=torch.int64, device=dev),
                     commit_lens=torch.empty(bs, dtype=torch.int32, device=dev),
                     new_seq_lens=torch.empty(bs, dtype=prefix_lens.dtype, device=dev),
                     draft_slots=torch.empty((bs, steps), dtype=draft_ids.dtype, device=dev),
                     hidden_rows=torch.empty((bs, steps), dtype=torch.int64, device=dev),
                     positions=torch.empty((bs, steps), dtype=torch.int64, device=dev))
        kernels().commit_into(verdict.accepted, verdict.tokens, verdict.accept_len, window, draft_ids, prefix_lens,
                              req_pool_indices, req_to_token, out)
        return out
    plan = commit_plan(verdict, window, prefix_lens)
    rewrite_req_to_token(req_to_token, req_pool_indices, prefix_lens, plan.window)
    return Commit(out_tokens=plan.out_tokens, commit_lens=plan.commit_lens,
                  new_seq_lens=prefix_lens + plan.commit_lens.to(prefix_lens.dtype),
                  draft_slots=path_slots(draft_ids.gather(1, plan.order), plan.out_tokens.shape[1]),
                  hidden_rows=plan.hidden_rows, positions=plan.positions)


def path_slots(slots: torch.Tensor, steps: int) -> torch.Tensor:
    """The permuted window's slots [bs, N] as the path's [bs, L+1]: cut past L + 1, or (a window narrower than the
    path, e.g. the root alone) padded with the root's slot, as hidden_rows pads with the root's row."""
    bs, n = slots.shape
    if n >= steps:
        return slots[:, :steps]
    return torch.cat([slots, slots[:, :1].expand(bs, steps - n)], dim=1)


def window_slots(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                 width: int) -> torch.Tensor:
    """The reserved slots req_to_token[r, prefix : prefix + width] of each request -> int64 [bs, width]."""
    cols = prefix_lens[:, None] + torch.arange(width, device=prefix_lens.device)   # [bs, width]
    return req_to_token[req_pool_indices[:, None], cols].to(torch.int64)


def rewrite_req_to_token(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                         window: torch.Tensor) -> None:
    """req_to_token[r, prefix + i] = window[b, i] for each request b (row r): the permuted window."""
    n = window.shape[1]
    cols = prefix_lens[:, None] + torch.arange(n, device=window.device)          # [bs, N]
    req_to_token[req_pool_indices[:, None], cols] = window.to(req_to_token.dtype)


def sampling_params_from_sglang(info, vocab_size: int) -> SamplingParams:
    """SGLang's SamplingBatchInfo -> ddtree SamplingParams (duck-typed: no SGLang import).

    SGLang stores a greedy request as temperature 1 with top_k 1 and "no top-k" as top_k >= the
    vocabulary (TOP_K_ALL); ddtree wants temperature 0 for greedy and top_k <= 0 for off. Filters
    the batch does not use (need_*_sampling false) are None, as verify_tree skips them statically.
    """
    top_k = info.top_ks.to(torch.int64).view(-1)                              # [bs]
    greedy = top_k == 1
    temperature = torch.where(greedy, 0.0, info.temperatures.view(-1).float())
    return SamplingParams(
        temperature=temperature,
        top_k=torch.where(greedy | (top_k >= vocab_size), 0, top_k) if info.need_top_k_sampling else None,
        top_p=info.top_ps.view(-1).float() if info.need_top_p_sampling else None,
        min_p=info.min_ps.view(-1).float() if info.need_min_p_sampling else None,
        all_greedy=bool(info.is_all_greedy))

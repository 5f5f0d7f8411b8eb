"""Triton kernels for build_tree on the GPU: three launches, no host synchronisation.

  _chunk_kernel  grid (bs*L, C): one read of a CHUNK-wide slice of a draft row -> its max, sum
                 of exponentials and its top-KB order keys (bitonic top-k on int64 keys)
  _merge_kernel  grid (bs*L,):   log-normaliser of the row and its top-K candidates
  _tree_kernel   grid (bs,):     level-by-level expansion, global selection, node order,
                 parents and the ancestor mask of one request
and for the SGLang decode step (ddtree.sglang.step.glue), one launch each:
  _verify_mask_kernel  grid (bs, N, chunks): the FULL_MASK and the nodes' positions
  _commit_kernel       grid (bs,): the accepted path kept by permuting the request's reserved
                       window in its token-table row, plus what the draft and the scheduler need
(the walk and argmax kernels serve ddtree.verify).

Keys are the same int64 order keys as ddtree.types.order_key: (orderable float bits << 32) |
(2^32 - 1 - index), so one descending top-k selects by score and breaks ties by smaller index,
exactly like the torch path. The module imports Triton; ddtree.backend imports it only for CUDA
inputs (and tests run it under TRITON_INTERPRET=1 on the CPU).
"""

from __future__ import annotations

import torch

try:  # Triton is optional: CPU-only installs use the torch path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None

from ddtree.types import Candidates, DraftTree, ShardCandidates, Verdict, level_pairs


def available() -> bool:
    return triton is not None


def _next_pow2(n: int) -> int:
    """Smallest power of two >= n, at least 2 (tl.topk needs a vector on both sides)."""
    return max(2, 1 << max(0, (n - 1).bit_length()))


if triton is not None:

    @triton.jit
    def _order_key(x, index):
        """float32 x, int64 index -> int64 key (score desc, index asc)."""
        x = tl.where(x == 0.0, 0.0, x)  # fold -0.0 into 0.0
        bits = x.to(tl.int32, bitcast=True)
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
        low = tl.full(index.shape, 0xFFFFFFFF, tl.int64) - index
        return (ordered << 32) | low

    @triton.jit
    def _key_score(key):
        hi = (key >> 32).to(tl.int32)
        bits = tl.where(hi < 0, hi ^ 0x7FFFFFFF, hi)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _key_index(key):
        mask32 = tl.full(key.shape, 0xFFFFFFFF, tl.int64)
        return mask32 - (key & mask32)

    @triton.jit
    def _chunk_kernel(logits_ptr, stride_b, stride_l, n_depth, vocab, n_chunks, id_offset,
                      pmax_ptr, psum_ptr, pkey_ptr, CHUNK: tl.constexpr, KB: tl.constexpr,
                      GROUP: tl.constexpr):
        """One read of a chunk: max, sum of exp, and top-KB keys found in two stages.

        Keys carry id_offset + column (a TP rank's shard starts at its global id id_offset).

        Stage 1 takes the best key of each GROUP-wide group; the chunk's top-KB elements lie in
        the KB groups with the best group keys (any other group is beaten by KB group bests).
        Stage 2 re-reads only those KB * GROUP elements (cache hits) and takes their top-KB.
        """
        row = tl.program_id(0)                    # b * L + d
        c = tl.program_id(1)
        b = row // n_depth
        d = row % n_depth
        base = logits_ptr + b * stride_b + d * stride_l
        offs = c * CHUNK + tl.arange(0, CHUNK)    # [CHUNK] token ids
        inb = offs < vocab
        x = tl.load(base + offs, mask=inb, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        e = tl.where(x > float("-inf"), tl.exp(x - m), 0.0)
        key = tl.where(inb, _order_key(x, offs.to(tl.int64) + id_offset), -9223372036854775807)
        group_best = tl.max(tl.reshape(key, [CHUNK // GROUP, GROUP]), axis=1)   # [G]
        top_groups = tl.topk(group_best, KB)                                      # [KB]
        live = top_groups > -9223372036854775807
        gid = tl.where(live, (_key_index(top_groups) - id_offset - c * CHUNK) // GROUP, 0)
        offs2 = c * CHUNK + gid[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [KB, GROUP]
        ok2 = live[:, None] & (offs2 < vocab)
        x2 = tl.load(base + offs2, mask=ok2, other=float("-inf")).to(tl.float32)
        key2 = tl.where(ok2, _order_key(x2, offs2.to(tl.int64) + id_offset), -9223372036854775807)
        top = tl.topk(tl.reshape(key2, [KB * GROUP]), KB)                         # [KB] best first
        slot = row * n_chunks + c
        tl.store(pmax_ptr + slot, m)
        tl.store(psum_ptr + slot, tl.sum(e, axis=0))
        tl.store(pkey_ptr + slot * KB + tl.arange(0, KB), top)

    @triton.jit
    def _argmax_chunk_kernel(x_ptr, row_stride, vocab, n_chunks, pval_ptr, pidx_ptr, CHUNK: tl.constexpr):
        """Max value of a chunk of one row and the smallest index holding it (fp32/int32 work)."""
        row = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(x_ptr + row * row_stride + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        best = tl.max(x, axis=0)
        idx = tl.min(tl.where((x == best) & (offs < vocab), offs, 2147483647), axis=0)
        tl.store(pval_ptr + row * n_chunks + c, best)
        tl.store(pidx_ptr + row * n_chunks + c, idx)

    @triton.jit
    def _argmax_merge_kernel(pval_ptr, pidx_ptr, out_ptr, n_chunks, CB: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, CB)
        val = tl.load(pval_ptr + row * n_chunks + c, mask=c < n_chunks, other=float("-inf"))
        idx = tl.load(pidx_ptr + row * n_chunks + c, mask=c < n_chunks, other=2147483647)
        best = tl.max(val, axis=0)
        tl.store(out_ptr + row, tl.min(tl.where(val == best, idx, 2147483647), axis=0).to(tl.int64))

    @triton.jit
    def _walk_kernel(tokens_ptr, parents_ptr, depths_ptr, targets_ptr, accepted_ptr, accept_len_ptr,
                     bonus_ptr, out_ptr, width, n_depth: tl.constexpr, NB: tl.constexpr,
                     LB: tl.constexpr):
        """Greedy/sample-and-match walk of one request (see ddtree.verify.walk_tree)."""
        b = tl.program_id(0).to(tl.int64)
        base = b * width
        i = tl.arange(0, NB).to(tl.int64)
        in_n = i < width
        # node i is accepted iff every node on its path matches its parent's target token
        ok = in_n
        cur = tl.where(in_n, i, 0)
        for _ in range(n_depth):
            par = tl.load(parents_ptr + base + cur, mask=ok, other=-1)
            tok = tl.load(tokens_ptr + base + cur, mask=ok & (par >= 0), other=0)
            want = tl.load(targets_ptr + base + par, mask=ok & (par >= 0), other=0)
            ok = ok & ((par < 0) & (cur == 0) | (par >= 0) & (tok == want))
            cur = tl.where(par >= 0, par, 0)
        depth = tl.load(depths_ptr + base + i, mask=in_n, other=0)
        n_acc = tl.sum(ok.to(tl.int64), axis=0) - 1
        last = tl.max(tl.where(ok, depth * NB + i, -1), axis=0) % NB
        bonus = tl.load(targets_ptr + base + last)
        j = tl.arange(0, LB)
        in_l = j < n_depth + 1
        row = b * (n_depth + 1)
        tl.store(accepted_ptr + row + j, tl.full([LB], -1, tl.int64), mask=in_l)
        tl.store(out_ptr + row + j, tl.where(j == n_acc, bonus, -1), mask=in_l)
        tl.debug_barrier()
        node_tok = tl.load(tokens_ptr + base + i, mask=in_n, other=0)
        tl.store(accepted_ptr + row + depth, i, mask=ok)
        tl.store(out_ptr + row + depth - 1, node_tok, mask=ok & (depth > 0))
        tl.store(accept_len_ptr + b, n_acc)
        tl.store(bonus_ptr + b, bonus)

    @triton.jit
    def _merge_kernel(pmax_ptr, psum_ptr, pkey_ptr, logp_ptr, tok_ptr, logz_ptr, n_chunks, k,
                      CB: tl.constexpr, NB: tl.constexpr, KB: tl.constexpr, RAW: tl.constexpr):
        """Row's log-normaliser and top-k. RAW: store raw logits and log_z (a TP shard) instead of logp."""
        row = tl.program_id(0)
        c = tl.arange(0, CB)
        pm = tl.load(pmax_ptr + row * n_chunks + c, mask=c < n_chunks, other=float("-inf"))
        ps = tl.load(psum_ptr + row * n_chunks + c, mask=c < n_chunks, other=0.0)
        big = tl.max(pm, axis=0)
        total = tl.sum(tl.where(pm > float("-inf"), ps * tl.exp(pm - big), 0.0), axis=0)
        log_z = tl.where(big > float("-inf"), big + tl.log(total), float("-inf"))
        j = tl.arange(0, NB)
        keys = tl.load(pkey_ptr + row * n_chunks * KB + j, mask=j < n_chunks * KB, other=-9223372036854775807)
        top = tl.topk(keys, KB)
        live = top > -9223372036854775807         # False only past the end of a row narrower than KB
        val = tl.where(live, _key_score(top), float("-inf"))
        tok = tl.where(live, _key_index(top), 2147483647)  # ddtree.tp.PAD_ID
        kk = tl.arange(0, KB)
        if RAW:
            tl.store(logp_ptr + row * k + kk, val, mask=kk < k)
            tl.store(logz_ptr + row, log_z)
        else:
            logp = tl.where(val > float("-inf"), val - log_z, float("-inf"))
            tl.store(logp_ptr + row * k + kk, logp, mask=kk < k)
        tl.store(tok_ptr + row * k + kk, tok, mask=kk < k)

    @triton.jit
    def _tree_kernel(cand_logp_ptr, cand_tok_ptr, root_ptr, pair_i_ptr, pair_j_ptr, n_pairs,
                     lv_score_ptr, lv_par_ptr, lv_tok_ptr, pos_ptr,
                     tokens_ptr, parents_ptr, depths_ptr, scores_ptr, num_ptr, mask_ptr,
                     n_depth: tl.constexpr, k: tl.constexpr, budget: tl.constexpr,
                     PB: tl.constexpr, WB: tl.constexpr, EB: tl.constexpr, NB: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        width = budget + 1
        lw = n_depth * budget
        lv = b * lw                               # this request's level scratch
        # static (parent slot, child rank) pairs that can reach the top `budget`
        p = tl.arange(0, PB)
        pv = p < n_pairs
        pi = tl.load(pair_i_ptr + p, mask=pv, other=0)
        pj = tl.load(pair_j_ptr + p, mask=pv, other=0)
        pair_flat = tl.where(pv, pi * k + pj, 1073741824 + p.to(tl.int64))
        slot = tl.arange(0, WB)
        in_w = slot < budget
        for d in range(n_depth):
            prev = tl.load(lv_score_ptr + lv + (d - 1) * budget + pi, mask=pv & (d > 0),
                           other=float("-inf"))
            prev = tl.where(d == 0, tl.where(pi == 0, 0.0, float("-inf")), prev)
            lp = tl.load(cand_logp_ptr + (b * n_depth + d) * k + pj, mask=pv, other=float("-inf"))
            score = tl.where(pv, prev + lp, float("-inf"))
            top = tl.topk(_order_key(score, pair_flat), WB)   # [WB] best pairs first
            s = _key_score(top)
            f = _key_index(top)
            ok = in_w & (s > float("-inf"))
            tok = tl.load(cand_tok_ptr + (b * n_depth + d) * k + f % k, mask=ok, other=0)
            tl.store(lv_score_ptr + lv + d * budget + slot, tl.where(ok, s, float("-inf")), mask=in_w)
            tl.store(lv_par_ptr + lv + d * budget + slot, f // k, mask=in_w)
            tl.store(lv_tok_ptr + lv + d * budget + slot, tok, mask=in_w)
            tl.debug_barrier()
        # global best `budget` over all depths: ties prefer the smaller depth, then slot
        e = tl.arange(0, EB)
        es = tl.load(lv_score_ptr + lv + e, mask=e < lw, other=float("-inf"))
        ekey = tl.where(e < lw, _order_key(es, e.to(tl.int64)), -9223372036854775807)
        top = tl.topk(ekey, WB)
        r = tl.arange(0, WB)
        s = _key_score(top)
        f = _key_index(top)
        ok = (r < budget) & (s > float("-inf"))
        tl.store(pos_ptr + lv + f, r + 1, mask=ok)
        tl.debug_barrier()
        depth = f // budget
        pslot = tl.load(lv_par_ptr + lv + f, mask=ok, other=0)
        tok = tl.load(lv_tok_ptr + lv + f, mask=ok, other=0)
        pnode = tl.load(pos_ptr + lv + (depth - 1) * budget + pslot, mask=ok & (depth > 0), other=0)
        root = tl.load(root_ptr + b)
        out = b * width
        node = r + 1
        tl.store(tokens_ptr + out + node, tl.where(ok, tok, root), mask=r < budget)
        tl.store(parents_ptr + out + node, tl.where(ok, pnode, -1), mask=r < budget)
        tl.store(depths_ptr + out + node, tl.where(ok, depth + 1, -1), mask=r < budget)
        tl.store(scores_ptr + out + node, tl.where(ok, s, float("-inf")), mask=r < budget)
        tl.store(tokens_ptr + out, root)
        tl.store(parents_ptr + out, -1)
        tl.store(depths_ptr + out, 0)
        tl.store(scores_ptr + out, 0.0)
        tl.store(num_ptr + b, 1 + tl.sum(ok.to(tl.int64), axis=0))
        tl.debug_barrier()
        # ancestor mask: walk every node's parent chain, L + 1 steps (itself first)
        i = tl.arange(0, NB).to(tl.int64)
        cur = tl.where(i < width, i, -1)
        mrow = mask_ptr + b * width * width + i * width
        for _ in range(n_depth + 1):
            live = cur >= 0
            tl.store(mrow + cur, tl.full(cur.shape, 1, tl.int8), mask=live)
            nxt = tl.load(parents_ptr + out + cur, mask=live, other=-1)
            cur = tl.where(live, nxt, -1)


    @triton.jit(do_not_specialize=["bs", "width"])
    def _verify_mask_kernel(anc_ptr, depths_ptr, prefix_ptr, mask_ptr, pos_ptr, bs, width,
                            BSB: tl.constexpr, BLOCK: tl.constexpr):
        """Columns [c * BLOCK, (c + 1) * BLOCK) of row i of request b of the FULL_MASK (the prefix
        visible, then the node's ancestors and itself); the first chunk also writes node i's
        position prefix + depth. Requests one after the other, N * (prefix + N) entries each."""
        b = tl.program_id(0).to(tl.int64)
        i = tl.program_id(1).to(tl.int64)
        c = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        k = tl.arange(0, BSB)
        pk = tl.load(prefix_ptr + k, mask=k < bs, other=0).to(tl.int64)
        offset = tl.sum(tl.where(k < b, width * (pk + width), 0), axis=0)
        p = tl.load(prefix_ptr + b).to(tl.int64)
        in_tree = (c >= p) & (c < p + width)
        anc = tl.load(anc_ptr + (b * width + i) * width + (c - p), mask=in_tree, other=0)
        value = tl.where(c < p, 1, anc).to(tl.int8)
        tl.store(mask_ptr + offset + i * (p + width) + c, value, mask=c < p + width)
        if tl.program_id(2) == 0:
            depth = tl.load(depths_ptr + b * width + i)
            tl.store(pos_ptr + b * width + i, p + tl.maximum(depth, 0))

    @triton.jit
    def _commit_kernel(accepted_ptr, tokens_ptr, accept_len_ptr, window_ptr, draft_ids_ptr, prefix_ptr,
                       pool_ptr, req_to_token_ptr, r2t_stride, out_tokens_ptr, commit_lens_ptr, new_lens_ptr,
                       draft_slots_ptr, hidden_rows_ptr, positions_ptr, width, steps,
                       NB: tl.constexpr, SB: tl.constexpr):
        """One request's commit (see ddtree.sglang.step.glue.commit_step): the window permuted so the
        accepted path's slots come first in path order and the other slots follow in node order,
        written into its token-table row; the draft's slots, verify rows and positions of the path."""
        b = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, NB).to(tl.int64)                      # node
        j = tl.arange(0, SB).to(tl.int64)                      # path position
        in_n = i < width
        in_s = j < steps
        acc = tl.load(accepted_ptr + b * steps + j, mask=in_s, other=-1)
        match = (acc[None, :] == i[:, None]) & in_s[None, :]   # [NB, SB]
        on_path = tl.max(match.to(tl.int32), axis=1) > 0
        path_pos = tl.sum(tl.where(match, j[None, :], 0), axis=1)
        n_valid = tl.sum((acc >= 0).to(tl.int64), axis=0)
        off_path = (in_n & ~on_path).to(tl.int64)
        rank = tl.where(on_path, path_pos, n_valid + tl.cumsum(off_path, axis=0) - 1)
        p = tl.load(prefix_ptr + b).to(tl.int64)
        row = tl.load(pool_ptr + b).to(tl.int64)
        slot = tl.load(window_ptr + b * width + i, mask=in_n, other=0)
        tl.store(req_to_token_ptr + row * r2t_stride + p + rank, slot, mask=in_n)
        draft = tl.load(draft_ids_ptr + b * width + i, mask=in_n, other=0)
        tl.store(draft_slots_ptr + b * steps + rank, draft, mask=in_n & (rank < steps))
        root_draft = tl.load(draft_ids_ptr + b * width)        # past a window narrower than the path: the root's
        tl.store(draft_slots_ptr + b * steps + j, root_draft + 0 * j, mask=in_s & (j >= width))
        tl.store(hidden_rows_ptr + b * steps + j, b * width + tl.maximum(acc, 0), mask=in_s)
        tl.store(positions_ptr + b * steps + j, p + j, mask=in_s)
        tok = tl.load(tokens_ptr + b * steps + j, mask=in_s, other=0)
        tl.store(out_tokens_ptr + b * steps + j, tl.maximum(tok, 0), mask=in_s)
        n_acc = tl.load(accept_len_ptr + b).to(tl.int64)
        tl.store(commit_lens_ptr + b, (n_acc + 1).to(tl.int32))
        tl.store(new_lens_ptr + b, p + n_acc + 1)


def _chunk_size(kb: int) -> int:
    return max(4096, 32 * kb)


def _fused_topk(logits: torch.Tensor, k: int, id_offset: int, with_log_z: bool):
    """logits [bs, L, V] -> (values [bs, L, k] float32, ids [bs, L, k] int64, log_z [bs, L] or None).

    Two launches: _chunk_kernel (one read of each chunk), _merge_kernel (per row). values are
    log-probs; with_log_z (a TP shard, ids offset by id_offset): the raw logits and log_z instead.
    """
    bs, n_depth, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    kb = _next_pow2(k)
    chunk = max(min(_chunk_size(kb), _next_pow2(vocab)), kb)
    n_chunks = triton.cdiv(vocab, chunk)
    rows = bs * n_depth
    dev = logits.device
    pmax = torch.empty(rows * n_chunks, dtype=torch.float32, device=dev)
    psum = torch.empty(rows * n_chunks, dtype=torch.float32, device=dev)
    pkey = torch.empty(rows * n_chunks * kb, dtype=torch.int64, device=dev)
    warps = 4 if chunk <= 4096 else (8 if chunk <= 8192 else 16)
    group = max(1, min(16, chunk // (2 * kb)))
    _chunk_kernel[(rows, n_chunks)](logits, logits.stride(0), logits.stride(1), n_depth, vocab, n_chunks,
                                    id_offset, pmax, psum, pkey,
                                    CHUNK=chunk, KB=kb, GROUP=group, num_warps=warps)
    values = torch.empty((bs, n_depth, k), dtype=torch.float32, device=dev)
    ids = torch.empty((bs, n_depth, k), dtype=torch.int64, device=dev)
    log_z = torch.empty((bs, n_depth), dtype=torch.float32, device=dev) if with_log_z else None
    nb = max(_next_pow2(n_chunks * kb), kb)
    _merge_kernel[(rows,)](pmax, psum, pkey, values, ids, log_z if with_log_z else values, n_chunks, k,
                           CB=_next_pow2(n_chunks), NB=nb, KB=kb, RAW=with_log_z,
                           num_warps=4 if nb <= 4096 else 8)
    return values, ids, log_z


def draft_candidates(draft_logits: torch.Tensor, k: int) -> Candidates:
    """Fused candidates: [bs, L, V] logits -> top-k log-probs and tokens per depth."""
    logp, tokens, _ = _fused_topk(draft_logits, k, 0, with_log_z=False)
    return Candidates(logp=logp, tokens=tokens)


def shard_candidates(shard_logits: torch.Tensor, k: int, vocab_start: int) -> ShardCandidates:
    """One TP rank's shard [bs, L, Vs] -> ShardCandidates (top-k raw logits, global ids, log_z).

    Equal to ddtree.tp's torch path: ties to the smaller global id; a shard narrower than k pads
    with logit -inf and id ddtree.types.PAD_ID.
    """
    logits, ids, log_z = _fused_topk(shard_logits, k, vocab_start, with_log_z=True)
    return ShardCandidates(logits=logits, ids=ids, log_z=log_z)


def build_tree(cand: Candidates, root_tokens: torch.Tensor, budget: int) -> DraftTree:
    """Level expansion, selection and assembly of all requests in one launch."""
    bs, n_depth, k = cand.logp.shape
    dev = cand.logp.device
    width = budget + 1
    pair_i, pair_j = level_pairs(budget, k, budget, dev)           # [P] each
    n_pairs = pair_i.shape[0]
    lv_score = torch.empty(bs * n_depth * budget, dtype=torch.float32, device=dev)
    lv_par = torch.empty(bs * n_depth * budget, dtype=torch.int64, device=dev)
    lv_tok = torch.empty(bs * n_depth * budget, dtype=torch.int64, device=dev)
    pos = torch.empty(bs * n_depth * budget, dtype=torch.int64, device=dev)
    tokens = torch.empty((bs, width), dtype=torch.int64, device=dev)
    parents = torch.empty((bs, width), dtype=torch.int64, device=dev)
    depths = torch.empty((bs, width), dtype=torch.int64, device=dev)
    scores = torch.empty((bs, width), dtype=torch.float32, device=dev)
    num_nodes = torch.empty((bs,), dtype=torch.int64, device=dev)
    mask = torch.zeros((bs, width, width), dtype=torch.bool, device=dev)
    pb = _next_pow2(n_pairs)
    eb = _next_pow2(n_depth * budget)
    wb = _next_pow2(budget)
    biggest = max(pb, eb)
    warps = 4 if biggest <= 1024 else (8 if biggest <= 4096 else 16)
    _tree_kernel[(bs,)](cand.logp, cand.tokens, root_tokens.to(torch.int64).contiguous(),
                        pair_i, pair_j, n_pairs, lv_score, lv_par, lv_tok, pos,
                        tokens, parents, depths, scores, num_nodes, mask.view(torch.int8),
                        n_depth=n_depth, k=k, budget=budget, PB=pb, WB=wb, EB=eb, NB=_next_pow2(width),
                        num_warps=warps)
    return DraftTree(tokens=tokens, parents=parents, depths=depths, scores=scores,
                     num_nodes=num_nodes, ancestor_mask=mask, max_depth=n_depth)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim of [..., V] (smallest index among ties, like torch.argmax)."""
    shape = logits.shape
    x = logits.reshape(-1, shape[-1])
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, vocab = x.shape
    chunk = min(8192, _next_pow2(vocab))
    n_chunks = triton.cdiv(vocab, chunk)
    pval = torch.empty(rows * n_chunks, dtype=torch.float32, device=x.device)
    pidx = torch.empty(rows * n_chunks, dtype=torch.int32, device=x.device)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    _argmax_chunk_kernel[(rows, n_chunks)](x, x.stride(0), vocab, n_chunks, pval, pidx, CHUNK=chunk, num_warps=8)
    _argmax_merge_kernel[(rows,)](pval, pidx, out, n_chunks, CB=_next_pow2(n_chunks), num_warps=1)
    return out.reshape(shape[:-1])


def walk(tree: DraftTree, targets: torch.Tensor) -> Verdict:
    """Triton version of ddtree.verify.walk_tree (same outputs)."""
    bs, width = tree.tokens.shape
    n_depth = tree.max_depth
    dev = tree.tokens.device
    accepted = torch.empty((bs, n_depth + 1), dtype=torch.int64, device=dev)
    out = torch.empty((bs, n_depth + 1), dtype=torch.int64, device=dev)
    accept_len = torch.empty(bs, dtype=torch.int64, device=dev)
    bonus = torch.empty(bs, dtype=torch.int64, device=dev)
    _walk_kernel[(bs,)](tree.tokens, tree.parents, tree.depths, targets.contiguous(), accepted,
                        accept_len, bonus, out, width, n_depth=n_depth, NB=_next_pow2(width),
                        LB=_next_pow2(n_depth + 1), num_warps=4)
    return Verdict(accepted=accepted, accept_len=accept_len, bonus=bonus, tokens=out)


def verify_mask_into(ancestor_mask: torch.Tensor, depths: torch.Tensor, prefix_lens: torch.Tensor, max_prefix: int,
                     mask: torch.Tensor, positions: torch.Tensor) -> None:
    """Fill mask (bool [sum_b N * (prefix_b + N)]) and positions (int64 [bs, N]) in one launch;
    ancestor_mask bool [bs, N, N], depths int64 [bs, N], prefix_lens [bs] <= max_prefix (host)."""
    bs, width = depths.shape
    block = 1024
    grid = (bs, width, triton.cdiv(max_prefix + width, block))
    # BSB is the same for every batch up to 256 and bs/width are not specialised on: a batch size
    # seen for the first time mid-serving compiles nothing (one compile stalls a step for ~1 s)
    _verify_mask_kernel[grid](ancestor_mask.contiguous().view(torch.int8), depths.contiguous(),
                              prefix_lens.contiguous(), mask.view(torch.int8), positions, bs, width,
                              BSB=max(256, _next_pow2(bs)), BLOCK=block, num_warps=4)


def commit_into(accepted: torch.Tensor, tokens: torch.Tensor, accept_len: torch.Tensor, window: torch.Tensor,
                draft_ids: torch.Tensor, prefix_lens: torch.Tensor, req_pool_indices: torch.Tensor,
                req_to_token: torch.Tensor, out) -> None:
    """One launch of _commit_kernel into `out` (a ddtree.sglang.step.glue.Commit that commit_step allocated)."""
    bs, width = window.shape
    steps = accepted.shape[1]
    if req_to_token.stride(1) != 1:
        raise ValueError("req_to_token must be row-major (stride 1 along a row)")
    _commit_kernel[(bs,)](accepted.contiguous(), tokens.contiguous(), accept_len.contiguous(), window.contiguous(),
                          draft_ids.contiguous(), prefix_lens.contiguous(), req_pool_indices.contiguous(),
                          req_to_token, req_to_token.stride(0), out.out_tokens, out.commit_lens,
                          out.new_seq_lens, out.draft_slots, out.hidden_rows, out.positions,
                          width, steps, NB=_next_pow2(width), SB=_next_pow2(steps), num_warps=4)

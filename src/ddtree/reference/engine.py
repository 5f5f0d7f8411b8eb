"""Batched decoding with the reference pair: autoregressive, DFlash chain, and DDTree.

One round of speculative decoding (see docs/architecture.md):
  draft_block      DFlash block (bonus token + masks) -> draft logits [bs, L, V]
  build_tree       -> DraftTree (chain: budget = L, cap = 1)
  verify_pass      the target over all budget + 1 nodes in one pass (ancestor mask, depth positions)
  verify_tree      -> Verdict (greedy or sample-and-match)
  commit           accepted nodes' K/V compacted to contiguous slots, the rest dropped; the draft's
                   context gets the target hidden states of the accepted nodes; bonus = next root.
Cache convention: a request's cache holds every verified token except the last one (the root);
the root is position `lengths[b]` and is written by the next pass.
"""

from __future__ import annotations

import torch

from ddtree import build_tree, verify_tree
from ddtree.reference.graphed import BUCKETS, GraphRunner
from ddtree.reference.pair import Pair
from ddtree.reference.step import BatchState, Generation, RequestParams, Stage, StepIO, run_marked
from ddtree.reference.target import TargetOutput
from ddtree.settings import DEFAULT_BUDGET, DEFAULT_TOPK_CAP, DDTreeSettings, Schedule, WidthSchedule
from ddtree.types import DraftTree, SamplingParams
from ddtree.verify import node_targets

METHODS = ("ar", "dflash", "ddtree")


def _check(name: str, ok: bool, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: {allowed}")


class Decoder:
    """Decodes batches with one pair and one method; `start` then `step` until `state.done`."""

    def __init__(self, pair: Pair, method: str = "ddtree", budget: int | Schedule = DEFAULT_BUDGET,
                 topk_cap: int | Schedule = DEFAULT_TOPK_CAP,
                 corrupt_every: int = 0, cuda_graphs: bool = False, graph_buckets: tuple[int, ...] | None = None,
                 split_stages: bool = False):
        """cuda_graphs: replay each step as a CUDA graph captured per batch bucket (graph_buckets,
        default 1, 2, 4, ..., 32; see ddtree.reference.graphed); split_stages captures one graph per
        stage (for timing the stages). budget / topk_cap: one value, or a Schedule by running batch
        size (each step's tree takes the width for the requests still running; eager only).
        corrupt_every: TEST ONLY. Every that many verify steps, replace the emitted bonus token of
        a speculative method by another token (the engine itself goes on from the real one), so
        that validation tooling can be shown to catch a broken accepted path. 0 = off."""
        _check("method", method in METHODS, method, f"expected one of {METHODS}")
        self.corrupt_every = corrupt_every if method != "ar" else 0
        self.pair = pair
        self.method = method
        if method != "ar" and pair.draft is None:
            raise ValueError(f"method={method!r} needs a draft model: load one, or use method='ar'")
        self.depth = pair.block_size - 1 if method != "ar" else 0  # L
        if method == "dflash":
            budget, topk_cap = self.depth, 1                      # the chain
        self.schedule = WidthSchedule.of(budget, topk_cap)       # (budget, cap) by running batch size
        # the engine verifies trees shallower than the draft's block and takes any cap (it keeps
        # min(cap, budget, V) candidates): the block rule and cap <= budget are a server's
        steps = self.schedule.steps
        for batch, _ in steps:
            DDTreeSettings(*self.width(batch)).check(cap_within_budget=False)
        widest = self.schedule.widest()
        self.budget, self.topk_cap = widest.budget, widest.topk_cap  # the widest tree: the verify window
        if cuda_graphs and len(steps) > 1:
            raise ValueError(f"budget={budget} / topk_cap={topk_cap}: a schedule by batch size runs eagerly in the "
                             "reference engine (its graphs hold one width per bucket): turn CUDA graphs off "
                             "(--cuda-graph-backend-decode disabled) or give one value")
        p = pair.target.lm_head.weight
        self.device, self.dtype = p.device, p.dtype
        self.capture = tuple(pair.draft.config.target_layer_ids) if method != "ar" else ()
        self.graphs = None
        if cuda_graphs:
            self.graphs = GraphRunner(self, graph_buckets or BUCKETS, split_stages)

    def width(self, running: int) -> tuple[int, int]:
        """(budget, topk_cap) of a step with `running` requests still decoding (>= 1)."""
        running = max(running, 1)
        return self.schedule.at(running)

    @property
    def context_length(self) -> int:
        return self.pair.target.config.max_position_embeddings

    @property
    def window(self) -> int:
        """Cache slots a step may write past the prompt + generated tokens (the verify window)."""
        return self.budget + 1 + self.pair.block_size + 1 if self.method != "ar" else 2

    # ----- set-up -----------------------------------------------------------------------------
    def start(self, prompts: list[list[int]], requests: list[RequestParams], seed: int | None = None) -> BatchState:
        self._check_prompts(prompts, requests)
        bs = len(prompts)
        state = BatchState(
            cache=None, ctx=None,
            lengths=torch.tensor([len(p) - 1 for p in prompts], dtype=torch.int64, device=self.device),
            roots=torch.tensor([p[-1] for p in prompts], dtype=torch.int64, device=self.device),
            params=self._sampling(requests), requests=requests, generator=None,
            outputs=[Generation([], 0, []) for _ in prompts], active=[True] * bs,
            live=torch.ones(bs, dtype=torch.bool, device=self.device), live_of=[True] * bs)
        slots = max(len(p) + r.max_new_tokens for p, r in zip(prompts, requests)) + self.window
        bucket = self.graphs.claim(state, slots) if self.graphs is not None else None
        if bucket is not None:
            self.graphs.prepare(state, bucket, seed)           # captures first: warm-up writes the cache
        else:
            state.cache = self.pair.target.new_cache(bs, slots)
            state.ctx = self.pair.draft.new_context(bs, slots) if self.method != "ar" else None
            if seed is not None:
                state.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._prefill(state, prompts)
        return state

    def cancel(self, state: BatchState) -> None:
        """End every request of a batch now (finish_reason 'cancelled'); frees its graph bucket."""
        for b, out in enumerate(state.outputs):
            if state.active[b]:
                out.finish_reason = "cancelled"
        state.active = [False] * len(state.active)
        self._sync_live(state)

    def close(self) -> None:
        """Release this decoder's CUDA graphs and their memory (GraphRunner.close); eager decoding
        keeps working afterwards. A no-op without graphs."""
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None

    def _check_prompts(self, prompts: list[list[int]], requests: list[RequestParams]) -> None:
        vocab = self.pair.target.config.vocab_size
        _check("prompts", len(prompts) >= 1 and len(prompts) == len(requests), len(prompts),
               "expected a non-empty list with one RequestParams per prompt")
        for i, (p, r) in enumerate(zip(prompts, requests)):
            _check(f"prompts[{i}]", len(p) >= 1, p, "expected at least one token")
            _check(f"prompts[{i}]", all(isinstance(t, int) and 0 <= t < vocab for t in p), p[:8],
                   f"expected token ids in [0, {vocab})")
            _check(f"max_new_tokens[{i}]", isinstance(r.max_new_tokens, int) and r.max_new_tokens >= 1,
                   r.max_new_tokens, "expected an integer >= 1")
            _check(f"prompts[{i}] + max_new_tokens", len(p) + r.max_new_tokens <= self.context_length,
                   len(p) + r.max_new_tokens, f"expected at most the context length {self.context_length}")
            _check(f"temperature[{i}]", r.temperature >= 0, r.temperature, "expected >= 0 (0 = greedy)")
            _check(f"top_p[{i}]", 0 < r.top_p <= 1, r.top_p, "expected 0 < top_p <= 1")
            _check(f"min_p[{i}]", 0 <= r.min_p < 1, r.min_p, "expected 0 <= min_p < 1")

    def _sampling(self, reqs: list[RequestParams]) -> SamplingParams:
        dev = self.device

        def col(values, dtype):
            return torch.tensor(values, dtype=dtype, device=dev)

        greedy = all(r.temperature == 0 for r in reqs)
        return SamplingParams(
            temperature=col([r.temperature for r in reqs], torch.float32),
            top_k=None if all(r.top_k <= 0 for r in reqs) else col([r.top_k for r in reqs], torch.int64),
            top_p=None if all(r.top_p >= 1 for r in reqs) else col([r.top_p for r in reqs], torch.float32),
            min_p=None if all(r.min_p <= 0 for r in reqs) else col([r.min_p for r in reqs], torch.float32),
            all_greedy=greedy)

    def _prefill(self, state: BatchState, prompts: list[list[int]]) -> None:
        """Cache every prompt token but the last (the first root); feed the draft its context."""
        width = max(len(p) - 1 for p in prompts)
        if width == 0:
            return
        bs = len(prompts)
        tokens = torch.zeros((bs, width), dtype=torch.int64, device=self.device)
        for b, p in enumerate(prompts):
            tokens[b, : len(p) - 1] = torch.tensor(p[:-1], dtype=torch.int64)
        pos = torch.arange(width, device=self.device).expand(bs, width)          # [bs, T]
        causal = pos[:, :, None] >= torch.arange(state.cache.slots, device=self.device)[None, None, :]
        out = self.pair.target(tokens, pos, state.cache, pos, causal, capture=self.capture)
        if state.ctx is not None:
            self.pair.draft.extend_context(state.ctx, out.hidden, pos, pos)

    # ----- one round --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, state: BatchState, marks=None) -> list[list[int]]:
        """One target pass for every active request; returns the tokens each request emitted.

        marks (timing): one (start, end) pair with .record() per stage, recorded around each stage
        (eager) or each stage's graph (a split capture); None in normal use.
        """
        self._sync_live(state)
        if state.graph_bucket is not None:
            if self.graphs is None:
                raise RuntimeError("this batch was started under CUDA graphs and the decoder was closed "
                                   "(Decoder.close): finish or cancel batches before closing the decoder")
            return self.finish_step(state, self.graphs.replay(state, marks))
        io = self.step_io(state)
        run_marked([lambda stage=stage: stage(io) for _, stage in self.stages()], marks)
        return self.finish_step(state, io)

    @staticmethod
    def _sync_live(state: BatchState) -> None:
        """Mirror `active` (host; the commit and callers such as a server's cancel change it) into
        the device flags a step reads; copies only when it changed."""
        if state.live_of != state.active:
            state.live.copy_(torch.tensor(state.active, device=state.live.device))
            state.live_of = list(state.active)

    def step_io(self, state: BatchState) -> StepIO:
        budget, topk_cap = self.width(sum(state.active))           # a host list: no synchronisation
        return StepIO(roots=state.roots, lengths=state.lengths, live=state.live, params=state.params,
                      generator=state.generator, cache=state.cache, ctx=state.ctx, budget=budget, topk_cap=topk_cap)

    def finish_step(self, state: BatchState, io: StepIO) -> list[list[int]]:
        """Host side of a step (its one synchronisation): log-probs if asked, then the commit."""
        top = max(r.logprobs_top for r in state.requests)
        info = self._logprob_info(io.node_logits, io.emitted, top) if top > 0 else None
        return self._commit_host(state, io.emitted, io.accept, info)

    def stages(self) -> list[tuple[str, Stage]]:
        """The step as named stages, each a function of a StepIO (no host synchronisation inside)."""
        if self.method == "ar":
            return [("target", self._stage_ar_target), ("verify", self._stage_ar_verify),
                    ("accept", self._stage_ar_accept)]
        return [("draft", self._stage_draft), ("build", self._stage_build), ("target", self._stage_target),
                ("verify", self._stage_verify), ("accept", self._stage_accept)]

    def _logprob_info(self, logits: torch.Tensor, emitted: torch.Tensor, top: int):
        """logits [bs, E, V] at the emitting nodes -> host lists of (token log-prob, top-k ids, top-k log-probs)."""
        lsm = torch.log_softmax(logits.float(), dim=-1)                           # [bs, E, V]
        tok_lp = lsm.gather(-1, emitted.clamp(min=0)[..., None])[..., 0]           # [bs, E]
        best = lsm.topk(min(top, lsm.shape[-1]), dim=-1)
        return tok_lp.tolist(), best.indices.tolist(), best.values.tolist()

    # ar: one token per step
    def _stage_ar_target(self, io: StepIO) -> None:
        pos = io.lengths[:, None]                                                 # [bs, 1]
        mask = torch.arange(io.cache.slots, device=self.device)[None, None, :] <= pos[:, :, None]
        io.out = self.pair.target(io.roots[:, None], pos, io.cache, pos, mask)

    def _stage_ar_verify(self, io: StepIO) -> None:
        io.targets = node_targets(io.out.logits, io.params, io.generator)[:, 0]   # [bs]

    def _stage_ar_accept(self, io: StepIO) -> None:
        zero = torch.zeros_like(io.lengths)
        self._advance(io, zero, io.targets)
        io.emitted, io.accept, io.node_logits = io.targets[:, None], zero, io.out.logits

    # dflash / ddtree: draft block -> tree -> one verify pass -> verdict -> commit
    def _stage_draft(self, io: StepIO) -> None:
        io.draft_logits = self.pair.draft(io.roots, io.lengths, io.ctx, io.lengths)  # [bs, L, V]

    def _stage_build(self, io: StepIO) -> None:
        # a graph's StepIO carries no width (0): its bucket was captured at the decoder's one width
        io.tree = build_tree(io.draft_logits, io.roots, budget=io.budget or self.budget,
                             topk_cap=io.topk_cap or self.topk_cap)

    def _stage_target(self, io: StepIO) -> None:
        io.out = self._verify_pass(io, io.tree)

    def _stage_verify(self, io: StepIO) -> None:
        p = io.params
        temperature = 0.0 if p.all_greedy else p.temperature
        io.verdict = verify_tree(io.tree, io.out.logits, temperature, top_p=p.top_p, top_k=p.top_k,
                                 min_p=p.min_p, generator=io.generator)

    def _stage_accept(self, io: StepIO) -> None:
        verdict = io.verdict
        self._commit_device(io, io.out, verdict.accepted)
        self._advance(io, verdict.accept_len, verdict.bonus)
        vocab = io.out.logits.shape[-1]
        io.node_logits = io.out.logits.gather(1, verdict.accepted.clamp(min=0)[..., None].expand(-1, -1, vocab))
        io.emitted, io.accept = verdict.tokens, verdict.accept_len                # [bs, L+1], [bs]

    def _verify_pass(self, state: StepIO, tree: DraftTree) -> TargetOutput:
        """All N tree nodes in one target pass: node i at slot lengths + i, position root + depth."""
        bs, n = tree.tokens.shape
        slots = state.lengths[:, None] + torch.arange(n, device=self.device)       # [bs, N]
        s = state.cache.slots
        prefix = torch.arange(s, device=self.device)[None, :] < state.lengths[:, None]  # [bs, S]
        mask = prefix[:, None, :].expand(bs, n, s).clone()
        mask.scatter_(2, slots[:, None, :].expand(bs, n, n), tree.ancestor_mask)  # node i sees its ancestors
        return self.pair.target(tree.tokens, tree.positions(state.lengths), state.cache, slots, mask,
                                capture=self.capture)

    def _commit_device(self, state: StepIO, out: TargetOutput, accepted: torch.Tensor) -> None:
        """Keep the accepted path's K/V at slots lengths + 0..k; extend the draft's context."""
        steps = torch.arange(accepted.shape[1], device=self.device)                # [L+1]
        dst = state.lengths[:, None] + steps                                      # [bs, L+1]
        src = state.lengths[:, None] + torch.where(accepted >= 0, accepted, steps)
        state.cache.move(src, dst)
        hidden = out.hidden.gather(1, accepted.clamp(min=0)[..., None].expand(-1, -1, out.hidden.shape[-1]))
        self.pair.draft.extend_context(state.ctx, hidden, dst, dst)

    def _advance(self, io: StepIO, accept_len: torch.Tensor, bonus: torch.Tensor) -> None:
        """Move live requests past this step, in place (the buffers may be a graph's static ones)."""
        io.lengths.copy_(torch.where(io.live, io.lengths + accept_len + 1, io.lengths))
        io.roots.copy_(torch.where(io.live, bonus, io.roots))

    def _commit_host(self, state: BatchState, emitted: torch.Tensor, accept: torch.Tensor,
                     info=None) -> list[list[int]]:
        """Append each active request's tokens up to its stop token or limit (one host sync)."""
        rows, accepts = emitted.tolist(), accept.tolist()
        vocab = self.pair.target.config.vocab_size
        new: list[list[int]] = []
        for b, req in enumerate(state.requests):
            if not state.active[b]:
                new.append([])
                continue
            gen = state.outputs[b]
            gen.num_verify_steps += 1
            gen.accept_lengths.append(accepts[b])
            fresh = []
            step_tokens = rows[b][: accepts[b] + 1]
            if self.corrupt_every and gen.num_verify_steps % self.corrupt_every == 0:
                step_tokens[-1] = (step_tokens[-1] + vocab // 2) % vocab          # TEST ONLY, see __init__
            for j, tok in enumerate(step_tokens):
                gen.tokens.append(tok)
                if info is not None and req.logprobs_top > 0:
                    tok_lp, ids, lps = info
                    own = tok_lp[b][j] if tok == rows[b][j] else None  # a corrupted token: not computed
                    k = req.logprobs_top
                    gen.logprobs.append((own, list(zip(ids[b][j][:k], lps[b][j][:k]))))
                fresh.append(tok)
                if tok in req.stop_token_ids:
                    gen.finish_reason = "stop"
                    state.active[b] = False
                    break
                if len(gen.tokens) >= req.max_new_tokens:
                    gen.finish_reason = "length"
                    state.active[b] = False
                    break
            new.append(fresh)
        return new


def generate(pair: Pair, prompts: list[list[int]], *, max_new_tokens: int, method: str = "ar",
             budget: int | Schedule = DEFAULT_BUDGET, topk_cap: int | Schedule = DEFAULT_TOPK_CAP, temperature: float = 0.0, top_p: float = 1.0,
             top_k: int = -1, min_p: float = 0.0, seed: int | None = None,
             stop_token_ids=None) -> list[Generation]:
    """Decode a batch of prompts (lists of token ids) to completion with one method."""
    decoder = Decoder(pair, method, budget, topk_cap)
    req = RequestParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                        min_p=min_p, stop_token_ids=frozenset(stop_token_ids or ()))
    state = decoder.start(prompts, [req] * len(prompts), seed=seed)
    while not state.done:
        decoder.step(state)
    return state.outputs

"""Test-bed diagnostics of the DDTREE verify pass (issue 44): what it computes at every tree node, what it leaves
in the KV cache, and a deliberate fault that a test must catch. Off unless asked for; never on a served host (the
deploy's input check refuses both variables in k26_service_env).

  SGLANG_DDTREE_DUMP=DIR        each decode step (the first SGLANG_DDTREE_DUMP_STEPS of the process, default 400)
                                writes DIR/step-<pid>-<n>.pt with, per request: its id, its token ids so far (prompt
                                + output), the committed prefix length, the tree (tokens, parents, depths, node
                                count), the verify pass's logits at every node [N, V] float32 (as the target gave
                                them, before any processing), and the target's KV of the committed prefix from
                                SGLang's pool, every layer (MLA: the latent + rope row; else keys and values)
  SGLANG_DDTREE_FAULT=sibling   every tree node also sees its earlier siblings in the verify mask: a broken tree
                                mask, for showing that a check fails on it. The accept walk is unchanged.
  SGLANG_DDTREE_FAULT=stale-penalties  every node penalised with the step start's counts instead of its own path's
                                (SGLang's DFLASH way): for showing that the penalty test fails on it.
  SGLANG_DDTREE_FAULT=drop-leaf every step's tree loses its last node (a leaf) before the verify and the verdict:
                                still exact, but the chain verifies L - 1 of DFLASH's L drafted tokens - for showing
                                that the chain-against-DFLASH test fails on a chain that is not DFLASH's.
  The faults' trees are made here (leak_siblings, hide_paths_from_penalties, drop_last_node); the workers that use
  them, chosen at start-up, are faults.py's.

The dump reads the device (a host copy per step): a diagnostics mode like the step profiler, not a served one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ddtree import switches
from ddtree.types import DraftTree

DEFAULT_STEPS = 400
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Diagnostics:
    """The dump switches (SGLANG_DDTREE_DUMP, _DUMP_STEPS), read once at start-up (SGLANG_DDTREE_FAULT picks the
    worker's class instead: faults.py)."""

    dump_dir: Path | None = None
    dump_steps: int = DEFAULT_STEPS

    @classmethod
    def from_switches(cls, read: switches.Switches) -> Diagnostics:
        return cls(dump_dir=read.dump, dump_steps=read.dump_steps)


def leak_siblings(tree: DraftTree) -> DraftTree:
    """The deliberate fault: every node also sees the siblings before it (same parent, lower index).
    ancestor_mask bool [bs, N, N] row i gains column j for j < i with parents[i] == parents[j] >= 0."""
    n = tree.width
    same_parent = (tree.parents[:, :, None] == tree.parents[:, None, :]) & (tree.parents[:, :, None] >= 0)
    earlier = torch.ones((n, n), dtype=torch.bool, device=tree.tokens.device).tril(-1)      # [N, N] j < i
    return dataclasses.replace(tree, ancestor_mask=tree.ancestor_mask | (same_parent & earlier))


def hide_paths_from_penalties(tree: DraftTree) -> DraftTree:
    """The deliberate fault stale-penalties: the tree as the penalties see it, every node's path below the root
    hidden (ancestor_mask keeps the root column only), so each node gets the step start's counts - how SGLang's
    DFLASH verify applies penalties over its block. Used for the penalties only; attention keeps the real tree."""
    root_only = torch.zeros_like(tree.ancestor_mask)
    root_only[:, :, 0] = True
    return dataclasses.replace(tree, ancestor_mask=tree.ancestor_mask & root_only)


def drop_last_node(tree: DraftTree) -> DraftTree:
    """The deliberate fault drop-leaf: each request's last valid node (index num_nodes - 1; a leaf, since children
    follow their parent) becomes padding - the root's token, parent and depth -1, score -inf, attending to itself
    only - and num_nodes drops by one; a tree of the root alone is left as it is. Every tensor [bs, N] as in
    DraftTree; no host synchronisation."""
    n = tree.width
    has_node = tree.num_nodes > 1                                                           # [bs]
    index = torch.arange(n, device=tree.tokens.device)
    drop = (index[None, :] == (tree.num_nodes - 1)[:, None]) & has_node[:, None]           # [bs, N]
    alone = torch.eye(n, dtype=torch.bool, device=tree.tokens.device)                       # [N, N]
    return dataclasses.replace(
        tree, tokens=torch.where(drop, tree.tokens[:, :1], tree.tokens),
        parents=torch.where(drop, -1, tree.parents), depths=torch.where(drop, -1, tree.depths),
        scores=torch.where(drop, float("-inf"), tree.scores), num_nodes=tree.num_nodes - has_node.to(torch.int64),
        ancestor_mask=torch.where(drop[:, :, None], alone[None], tree.ancestor_mask))


def read_prefix_kv(pool, slots: torch.Tensor) -> dict[str, torch.Tensor]:
    """The target's KV rows at `slots` (int64 [P], pool ids) for every layer of `pool`:
    MLA -> {"latent": [layers, P, 1, kv_lora_rank + rope]}; else {"key": [layers, P, H, D], "value": ...}."""
    layers = range(int(pool.start_layer), int(pool.start_layer) + int(pool.layer_num))
    if hasattr(pool, "kv_lora_rank"):
        return {"latent": torch.stack([pool.get_key_buffer(i)[slots] for i in layers]).cpu()}
    return {"key": torch.stack([pool.get_key_buffer(i)[slots] for i in layers]).cpu(),
            "value": torch.stack([pool.get_value_buffer(i)[slots] for i in layers]).cpu()}


@dataclass
class StepDump:
    """Writes one file per decode step until `limit` steps were written (this process)."""

    folder: Path
    limit: int
    written: int = 0

    def wanted(self) -> bool:
        return self.written < self.limit

    def write(self, reqs, tree: DraftTree, logits: torch.Tensor, prefix_lens: torch.Tensor, slot_rows: torch.Tensor,
              pool) -> Path:
        """reqs: the batch's SGLang requests; logits [bs * N, V]; prefix_lens int64 [bs]; slot_rows int64 [bs, W]
        (each request's req_to_token row: pool ids of its tokens, virtual = physical on a plain pool)."""
        bs, n = tree.tokens.shape
        rows = logits.view(bs, n, -1).float().cpu()                                           # [bs, N, V]
        prefix = prefix_lens.cpu().tolist()
        records = []
        for b, req in enumerate(reqs):
            p = int(prefix[b])
            records.append({
                "rid": str(req.rid), "token_ids": [int(t) for t in req.origin_input_ids] + [int(t) for t in req.output_ids],
                "prefix": p, "tree_tokens": tree.tokens[b].cpu(), "parents": tree.parents[b].cpu(),
                "depths": tree.depths[b].cpu(), "num_nodes": int(tree.num_nodes[b]), "logits": rows[b],
                "kv": read_prefix_kv(pool, slot_rows[b, :p].to(torch.int64))})
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"step-{os.getpid()}-{self.written:05d}.pt"
        torch.save({"step": self.written, "requests": records}, path)
        self.written += 1
        return path


def dump_step(dump: StepDump, target_runner, batch, tree: DraftTree, logits: torch.Tensor,
              prefix_lens: torch.Tensor) -> None:
    """One decode step written: its trees, verify logits [bs * N, V] and each request's prefix KV (read from the
    target's pool by req_to_token ids)."""
    if target_runner.kv_index_translator.needs_read_translate:                        # a property
        raise RuntimeError("SGLANG_DDTREE_DUMP reads the KV pool by req_to_token ids: this pool translates "
                           "them (sliding window or a moving pool); unset it")
    rows = target_runner.req_to_token_pool.req_to_token[batch.req_pool_indices]            # [bs, W]
    dump.write(batch.reqs, tree, logits, prefix_lens, rows, target_runner.token_to_kv_pool)


def announce(diagnostics: Diagnostics) -> None:
    """Say loudly at start-up that a dump is on: it slows every step (a fault says so itself: faults.py)."""
    if diagnostics.dump_dir is not None:
        logger.warning("DDTREE diagnostics: every decode step's tree, verify logits and prefix KV are written to %s "
                       "(the first %d steps); a test-bed mode, slow", diagnostics.dump_dir, diagnostics.dump_steps)

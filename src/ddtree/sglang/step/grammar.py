"""Constrained decoding (JSON schema, regex, EBNF, structural tag) on a DDTREE server, with SGLang 0.5.23's
grammar objects (xgrammar by default).

For a batch with grammars, between the draft and the verify pass (tree_worker's "grammar" stage):
  1. the scheduler's grammar barrier, when it hands one (it advances the previous batch's matchers);
  2. the draft candidates of the requests with a grammar come to the host (the one device wait of a
     constrained step: the tree of such a request depends on its matcher, which lives on the host);
  3. each such request's tree is rebuilt on the host by ddtree.grammar_tree.build_legal_tree - the budget
     best draft paths its grammar allows, with the matcher's bitmask at every node - and written over its
     row of the device tree; the other requests keep the device build;
  4. the bitmask [bs * N, W] (all tokens allowed on the rows of requests without a grammar and on padding)
     goes to the device, and the verdict applies it to the verify logits after penalties and logit bias,
     before the argmax or the draw - the order in which SGLang's sampler masks NONE's logits (its logit bias
     comes after the mask there; adding a finite bias to a masked -inf leaves it -inf).

The scheduler then advances each matcher over the committed tokens, as for DFLASH (its result processor's
advance_grammar_fsm), so the next step's root state is the committed answer's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.constrained.base_grammar_backend import GrammarMask

from ddtree.grammar_tree import build_legal_tree, legal_rows, replace_rows
from ddtree.types import Candidates, DraftTree


@dataclass
class GrammarStep:
    """A constrained step's tree (grammar rows rebuilt) and the bitmask its verdict applies."""

    tree: DraftTree
    mask: GrammarMask     # vocab_mask int32 [bs * N, ceil(V / 32)] on the device
    nodes: int            # tree nodes of the constrained requests (roots included)
    pruned: int           # draft candidates their grammars forbade


def grammar_rows(reqs) -> list[int]:
    """Batch rows whose request decodes under a grammar."""
    return [i for i, req in enumerate(reqs) if getattr(req, "grammar", None) is not None]


def constrain_step(reqs, cand: Candidates, tree: DraftTree, budget: int, vocab_size: int,
                   barrier=None) -> GrammarStep | None:
    """The tree with every constrained request's row rebuilt under its grammar, and the step's bitmask;
    None when no request of the batch has a grammar. reqs: the batch's requests in row order."""
    if barrier is not None:
        barrier()
    rows = grammar_rows(reqs)
    if not rows:
        return None
    bs, n = tree.tokens.shape
    handle = reqs[rows[0]].grammar
    mask = handle.allocate_vocab_mask(vocab_size=vocab_size, batch_size=bs * n, device="cpu")  # [bs*N, W] all allowed
    index = torch.tensor(rows, dtype=torch.int64)
    on_dev = index.to(cand.logp.device)
    logp = cand.logp.index_select(0, on_dev).cpu()                   # float32 [g, L, K]  (waits for the draft)
    tokens = cand.tokens.index_select(0, on_dev).cpu()               # int64 [g, L, K]
    roots = tree.tokens[:, 0].index_select(0, on_dev).cpu()          # int64 [g]
    legal = [build_legal_tree(logp[j], tokens[j], int(roots[j]), budget, reqs[r].grammar, mask[r * n:(r + 1) * n])
             for j, r in enumerate(rows)]
    device = tree.tokens.device
    return GrammarStep(tree=replace_rows(tree, index, legal_rows(legal, n)),
                       mask=GrammarMask(handle, handle.move_vocab_mask(mask, device)),
                       nodes=sum(len(t.tokens) for t in legal), pruned=sum(t.pruned for t in legal))

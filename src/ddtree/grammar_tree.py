"""DDTree under a grammar: the `budget` best draft paths the grammar allows, and each node's token bitmask.

A request with constrained decoding (JSON schema, regex, EBNF, structural tag) carries a grammar matcher
whose state is the answer committed so far (the tree's root included: the scheduler advanced it over every
committed token). Its tree is built on the host, one request at a time, by best-first search over the
draft's candidates:

  * a path is scored as in ddtree.tree (float32 sum of the draft's log-probs, depth by depth);
  * a candidate is kept only if the grammar state at its parent allows its token, so the budget is spent
    on legal paths only (an illegal draft token could never be accepted: the target's token at its parent
    is drawn under the same mask);
  * a node whose path ends the grammar (its stop token) gets no children;
  * every kept node's row of the bitmask is the grammar's mask at the node's own path: the verify pass's
    target token at that node is drawn under it, as NONE's token at that position would be.

Without pruning (a grammar that allows every candidate) the node set is ddtree.tree's: the global best
`budget` paths are prefix-closed (log-probs <= 0), and best-first pops them in score order. Ties are
broken by a push counter here, by a static index there; equal-score ties at the budget's edge may pick
another node of the same score.

The matcher is moved between paths by rolling back to the common prefix and accepting the rest (PathCursor)
and is returned to the root's state before the build returns. The grammar object is duck-typed as SGLang
0.5.23's BaseGrammarObject: accept_token(int), rollback(k), is_terminated(), fill_vocab_mask(mask, row).

Host work, one fill per node: callers run it only for requests that have a grammar (the rest of the batch
keeps the device build).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import torch

from ddtree import _checks
from ddtree.tree import ancestor_mask
from ddtree.types import DraftTree


@dataclass
class LegalTree:
    """One request's tree in DraftTree order (node 0 = root; parents before children; scores non-increasing)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    pruned: int = 0       # candidates popped and dropped because the grammar forbids them at their parent

    def add(self, token: int, parent: int, depth: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(depth)
        self.scores.append(score)
        return len(self.tokens) - 1

    def path(self, node: int) -> list[int]:
        """The tokens from the root's child down to `node` (the root itself is already in the grammar)."""
        out = []
        while node > 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]


class PathCursor:
    """A grammar matcher kept on one path below the root; moved by rollback to the common prefix + accepts."""

    def __init__(self, grammar):
        self.grammar = grammar
        self.path: list[int] = []

    def move(self, path: list[int]) -> None:
        common = 0
        while common < min(len(self.path), len(path)) and self.path[common] == path[common]:
            common += 1
        if len(self.path) > common:
            self.grammar.rollback(len(self.path) - common)
        for token in path[common:]:
            self.grammar.accept_token(int(token))
        self.path = list(path)

    def home(self) -> None:
        """Back to the root's state (the state the build found)."""
        self.move([])


def allows(mask_row: np.ndarray, token: int) -> bool:
    """Whether a packed bitmask row (int32 [ceil(V / 32)], 32 tokens per word) allows `token`."""
    word = token >> 5
    return word < mask_row.shape[0] and (int(mask_row[word]) >> (token & 31)) & 1 == 1


@dataclass(order=True)
class _Frontier:
    """A candidate child on the heap: (parent node, depth, rank) with its path score."""

    neg_score: float
    tie: int
    parent: int = field(compare=False)
    depth: int = field(compare=False)      # the child's depth, 1..L
    rank: int = field(compare=False)       # its rank among the depth's K candidates


def build_legal_tree(logp: torch.Tensor, tokens: torch.Tensor, root: int, budget: int, grammar,
                     mask_rows: torch.Tensor) -> LegalTree:
    """One request: logp float32 [L, K] and tokens int64 [L, K] (cpu, best first per depth; -inf = none),
    the root token, the budget, its grammar at the root's state, and its bitmask rows int32 [budget + 1, W]
    (cpu; row i is filled for node i; rows of unfilled nodes are left as they are). Returns the tree."""
    _checks.check_positive_int("budget", budget)
    if mask_rows.shape[0] != budget + 1:
        raise _checks.fail("mask_rows.shape", tuple(mask_rows.shape), f"expected [{budget + 1}, W]: one row per node")
    lp = logp.numpy().astype(np.float32)                         # [L, K]
    tk = tokens.numpy()                                          # [L, K]
    masks = mask_rows.numpy()                                    # a view: fills land in mask_rows
    max_depth, k = lp.shape
    tree, cursor = LegalTree(), PathCursor(grammar)
    tree.add(int(root), -1, 0, 0.0)
    heap: list[_Frontier] = []
    tie = 0

    def push(parent: int, depth: int, rank: int) -> None:
        nonlocal tie
        if depth > max_depth or rank >= k or not np.isfinite(lp[depth - 1, rank]):
            return
        score = np.float32(tree.scores[parent]) + lp[depth - 1, rank]
        heapq.heappush(heap, _Frontier(-float(score), tie, parent, depth, rank))
        tie += 1

    def open_node(node: int) -> bool:
        """Fill the node's mask at its path; False when its path ended the grammar (no children then)."""
        cursor.move(tree.path(node))
        if grammar.is_terminated():
            return False
        grammar.fill_vocab_mask(mask_rows, node)
        return True

    try:
        if open_node(0):
            push(0, 1, 0)
        while heap and len(tree.tokens) <= budget:
            item = heapq.heappop(heap)
            push(item.parent, item.depth, item.rank + 1)                     # the next sibling candidate
            token = int(tk[item.depth - 1, item.rank])
            if not allows(masks[item.parent], token):
                tree.pruned += 1
                continue
            node = tree.add(token, item.parent, item.depth, -item.neg_score)
            if open_node(node):
                push(node, item.depth + 1, 0)                                 # its best child
    finally:
        cursor.home()
    return tree


def legal_rows(trees: list[LegalTree], width: int) -> DraftTree:
    """The host trees as DraftTree rows of `width` nodes (padding as ddtree.tree pads: the root's token,
    parent -1, depth -1, score -inf), on the cpu; max_depth is the deepest node's (at least 1)."""
    g = len(trees)
    tokens = torch.empty((g, width), dtype=torch.int64)
    parents = torch.full((g, width), -1, dtype=torch.int64)
    depths = torch.full((g, width), -1, dtype=torch.int64)
    scores = torch.full((g, width), float("-inf"), dtype=torch.float32)
    for i, t in enumerate(trees):
        n = len(t.tokens)
        if n > width:
            raise _checks.fail("tree size", n, f"expected at most {width} nodes (budget + 1)")
        tokens[i] = t.tokens[0]
        tokens[i, :n] = torch.tensor(t.tokens)
        parents[i, :n] = torch.tensor(t.parents)
        depths[i, :n] = torch.tensor(t.depths)
        scores[i, :n] = torch.tensor(t.scores, dtype=torch.float32)
    max_depth = max([1, *(max(t.depths) for t in trees)])
    num_nodes = torch.tensor([len(t.tokens) for t in trees], dtype=torch.int64)
    return DraftTree(tokens=tokens, parents=parents, depths=depths, scores=scores, num_nodes=num_nodes,
                     ancestor_mask=ancestor_mask(parents, max_depth), max_depth=max_depth)


def replace_rows(tree: DraftTree, rows: torch.Tensor, part: DraftTree) -> DraftTree:
    """`tree` (any device) with the requests at `rows` (int64 [g]) replaced by `part`'s rows (cpu or same
    device); max_depth stays the tree's (the draft's L bounds both)."""
    dev = tree.tokens.device
    idx = rows.to(dev)

    def put(full: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return full.index_copy(0, idx, new.to(dev, non_blocking=True))

    return DraftTree(tokens=put(tree.tokens, part.tokens), parents=put(tree.parents, part.parents),
                     depths=put(tree.depths, part.depths), scores=put(tree.scores, part.scores),
                     num_nodes=put(tree.num_nodes, part.num_nodes),
                     ancestor_mask=put(tree.ancestor_mask, part.ancestor_mask), max_depth=tree.max_depth)

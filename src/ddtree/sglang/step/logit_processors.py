"""Custom logit processors at every DDTREE node, each seeing its own node's path (SGLang 0.5.23's interface).

SGLang calls a processor as `processor(logits [rows, V], custom_params: list[dict | None])`, one dict per
row: the request's `custom_params`, into which its scheduler puts `"__req__"` (a proxy of the Req) for
processors that read the answer so far (`req.origin_input_ids + req.output_ids`: thinking budgets, n-gram
blockers). NONE calls it once per step with one row per request. SGLang's DFLASH verify calls it with a row
per block position and the same Req for all of them, so a processor that reads the answer sees the step's
start at every position.

Here each tree node's row gets its request's dict with `"__req__"` replaced by a NodeRequest: the Req with
`output_ids` extended by the node's path below the root (the root is already the answer's last token) - what
the Req would hold if that path had been committed, which is what NONE's processor sees when it decodes the
token after that node. Dicts without `"__req__"` (processors that read only their parameters) are passed as
they are. Processors run after penalties, logit bias and the grammar's mask, as NONE's sampler runs them.

The tree's tokens and parents come to the host for this (one device wait, only in steps with a processor).
"""

from __future__ import annotations

import torch

from ddtree.types import DraftTree

REQ_KEY = "__req__"


def extended(ids, path: list[int]):
    """`ids` + `path` in `ids`' own container: SGLang 0.5.23's Req keeps origin_input_ids and output_ids as
    array('q'), and processors add the two (`req.origin_input_ids + req.output_ids`), which fails for an array
    and a list (the H200 run of 2026-12-03: the n-gram blocker crashed the scheduler on a list here)."""
    out = ids[:]                       # a list slice is a list, an array slice an array of the same typecode
    out.extend(path)
    return out


class NodeRequest:
    """A Req seen from one tree node: output_ids = the committed answer + the node's path below the root, in
    the Req's own container type; every other attribute is the Req's."""

    __slots__ = ("_req", "output_ids")

    def __init__(self, req, path: list[int]):
        object.__setattr__(self, "_req", req)
        object.__setattr__(self, "output_ids", extended(req.output_ids, path))

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_req"), name)

    def __setattr__(self, name, value):
        raise AttributeError(f"a tree node's view of a request is read-only (tried to set {name})")


def node_paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """One request's tree on the host -> for each node, its tokens below the root down to itself ([] for the
    root and for padding). Parents precede their children (DraftTree order)."""
    paths: list[list[int]] = []
    for j, (token, parent) in enumerate(zip(tokens, parents)):
        paths.append([] if j == 0 or parent < 0 else [*paths[parent], token])
    return paths


def node_params(params: dict | None, path: list[int]) -> dict | None:
    if not params or REQ_KEY not in params:
        return params
    return {**params, REQ_KEY: NodeRequest(params[REQ_KEY], path)}


def apply_node_processors(logits: torch.Tensor, info, tree: DraftTree) -> None:
    """logits [bs * N, V] in place: every processor of SGLang's SamplingBatchInfo (`custom_logit_processor`:
    entries of processor, request rows, their device indices; `custom_params` per request) on all N node rows
    of its requests, each node with its own path."""
    bs, n = tree.tokens.shape
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()          # host copies (the step waits here)
    offsets = torch.arange(n, device=logits.device)
    for entry in info.custom_logit_processor.values():
        indices = (entry.indices.to(logits.device)[:, None] * n + offsets).flatten()   # [rows * N]
        params = []
        for r in entry.rows:
            paths = node_paths(tokens[r], parents[r])
            params += [node_params(info.custom_params[r], paths[j]) for j in range(n)]
        result = entry.processor(logits.index_select(0, indices), params)
        logits.index_copy_(0, indices, result.to(logits.dtype))

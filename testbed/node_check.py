"""Tree against path, node by node (issue 44): the logits a DDTREE verify pass gives at every tree node against
the logits the same model gives for that node's path run as a plain sequence, and the KV a DDTREE server leaves
for its committed tokens against what a prefill of the same tokens writes. Pure torch and Python (CPU-tested in
tests/unit/test_node_check.py); the GPU test (test_node_logits.py) feeds it the servers' step dumps
(ddtree.sglang.diagnostics.step_dump) and the plain runs' log-probs.

A node's path run: the request's committed tokens, then the tree's tokens from the root to the node, sent to a
server without speculation with `logprob_start_len` = the root's position, so that SGLang returns the top
log-probs of every input token from the root on (its prefill kernels, no tree mask): entry k + 1 is the distribution
after the path's k-th token; SGLang 0.5.23 gives None for the first entry (seen on the H200, 2026-12-03). One request
per leaf covers every node on the leaf's path.

The rule (`compare`): a tree passes when it sits inside its control's distribution - the same comparison for a
chain (budget = block - 1, cap 1: no node has a sibling, so no mask fault can show there) on the same pair:
  - the share of the tree's nodes whose |delta log-prob| is above the control's 95th percentile is at most twice the
    control's own share above it + 2 points (a rounding-like tree sits near 5%; the threshold is the control's, so
    its sampling noise is the control's too), and
  - the tree's largest |delta| is at most twice the control's largest + `slack` (0.02).
A deliberate fault (every node sees its earlier siblings) must fail the same rule (the GPU test shows it does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

LOGP_FLOOR = -12.0      # tokens compared: those the path run gives more than e^-12 (the rest is rounding of nothing)
QUANTILE = 0.95
SLACK = 0.02


@dataclass(frozen=True)
class DumpedRequest:
    """One request at one decode step, as a -dump server wrote it (step_dump.StepDump)."""

    rid: str
    step: int
    token_ids: list[int]          # prompt + output so far (the last one is the tree's root)
    prefix: int                   # committed tokens (their KV is in the pool)
    tree_tokens: list[int]        # [N]
    parents: list[int]            # [N] -1 root / padding
    depths: list[int]             # [N] -1 padding
    num_nodes: int
    logits: torch.Tensor          # float32 [N, V] the verify pass's
    kv: dict[str, torch.Tensor] = field(default_factory=dict)   # [layers, prefix, ...] of the committed prefix

    @property
    def context(self) -> list[int]:
        return self.token_ids[: self.prefix]


def load_dumps(folder: Path) -> list[DumpedRequest]:
    """Every request record of every step file in `folder`, in the order the steps were written."""
    out = []
    for path in sorted(Path(folder).glob("step-*.pt")):
        data = torch.load(path, map_location="cpu", weights_only=False)
        for r in data["requests"]:
            out.append(DumpedRequest(rid=r["rid"], step=int(data["step"]), token_ids=list(r["token_ids"]),
                                     prefix=int(r["prefix"]), tree_tokens=r["tree_tokens"].tolist(),
                                     parents=r["parents"].tolist(), depths=r["depths"].tolist(),
                                     num_nodes=int(r["num_nodes"]), logits=r["logits"].float(), kv=r.get("kv", {})))
    return out


def node_path(parents: list[int], node: int) -> list[int]:
    """Node indices from the root to `node` (parents precede children)."""
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def leaves(parents: list[int], num_nodes: int) -> list[int]:
    """The valid nodes (the first num_nodes) that are no valid node's parent."""
    inner = {parents[i] for i in range(num_nodes) if parents[i] >= 0}
    return [i for i in range(num_nodes) if i not in inner]


@dataclass(frozen=True)
class PathQuery:
    """One plain run covering the nodes of one root-to-leaf path."""

    input_ids: list[int]          # context + the path's tokens + one more (so the leaf's next-token log-probs come back)
    logprob_start_len: int        # the root's position: entry k + 1 is the distribution after the path's k-th token
    nodes: list[int]              # the path's nodes, root first


def path_queries(rec: DumpedRequest) -> list[PathQuery]:
    if rec.token_ids[rec.prefix] != rec.tree_tokens[0]:
        raise ValueError(f"request {rec.rid} step {rec.step}: the tree's root {rec.tree_tokens[0]} is not the token "
                         f"after the committed prefix ({rec.token_ids[rec.prefix]}): the dump and the request disagree")
    out = []
    for leaf in leaves(rec.parents, rec.num_nodes):
        nodes = node_path(rec.parents, leaf)
        tokens = [rec.tree_tokens[i] for i in nodes]
        out.append(PathQuery(rec.context + tokens + [tokens[-1]], rec.prefix, nodes))
    return out


def dense_logprobs(entry: list, vocab: int) -> torch.Tensor:
    """SGLang's top log-probs at one position ([logprob, token id, text] items) -> float32 [V], -inf where absent."""
    out = torch.full((vocab,), -math.inf)
    for item in entry:
        out[int(item[1])] = float(item[0])
    return out


@dataclass(frozen=True)
class NodeDelta:
    depth: int
    max_abs: float                # max over compared tokens of |tree log-prob - path log-prob|
    mean_abs: float
    top1_same: bool
    path_gap: float               # the path run's own top-1 minus top-2 log-prob (a near tie when small)


def node_delta(tree_logits: torch.Tensor, path_logp: torch.Tensor, depth: int) -> NodeDelta:
    """tree_logits [V] raw (any scale), path_logp [V] log-probs (-inf where the run gave none)."""
    tree_logp = torch.log_softmax(tree_logits.double(), -1)
    path = path_logp.double()
    keep = path > LOGP_FLOOR
    diff = (tree_logp[keep] - path[keep]).abs()
    top2 = path.topk(2).values
    return NodeDelta(depth=depth, max_abs=float(diff.max()), mean_abs=float(diff.mean()),
                     top1_same=int(tree_logp.argmax()) == int(path.argmax()), path_gap=float(top2[0] - top2[1]))


def request_deltas(rec: DumpedRequest, runs: dict[int, list[list]]) -> dict[int, NodeDelta]:
    """runs: leaf -> SGLang's input_top_logprobs of that leaf's PathQuery (one entry per path token). Every valid
    node gets one delta (a node on several paths is compared once, from the first run that covers it)."""
    vocab = rec.logits.shape[-1]
    out: dict[int, NodeDelta] = {}
    for query in path_queries(rec):
        entries = list(runs[query.nodes[-1]])[1:]          # the first: the root's own token (None in SGLang 0.5.23)
        if len(entries) != len(query.nodes):
            raise ValueError(f"request {rec.rid} step {rec.step}: {len(entries)} log-prob entries for a path of "
                             f"{len(query.nodes)} nodes (logprob_start_len {query.logprob_start_len})")
        for node, entry in zip(query.nodes, entries):
            if node not in out:
                out[node] = node_delta(rec.logits[node], dense_logprobs(entry, vocab), rec.depths[node])
    return out


def quantile(values: list[float], q: float) -> float:
    return float(torch.tensor(values, dtype=torch.float64).quantile(q)) if values else math.nan


@dataclass(frozen=True)
class Summary:
    nodes: int
    mean: float
    p99: float
    max: float
    top1_agree: float
    by_depth: dict[int, tuple[int, float, float, float]]    # depth -> (nodes, mean, p99, max) of max_abs

    def row(self) -> str:
        return (f"{self.nodes} nodes, |delta| mean {self.mean:.4f} p99 {self.p99:.4f} max {self.max:.4f}, "
                f"top-1 agreement {self.top1_agree:.4f}")


def summarize(deltas: list[NodeDelta]) -> Summary:
    values = [d.max_abs for d in deltas]
    by_depth = {}
    for depth in sorted({d.depth for d in deltas}):
        v = [d.max_abs for d in deltas if d.depth == depth]
        by_depth[depth] = (len(v), sum(v) / len(v), quantile(v, 0.99), max(v))
    return Summary(nodes=len(values), mean=sum(values) / max(1, len(values)), p99=quantile(values, 0.99),
                   max=max(values, default=math.nan),
                   top1_agree=sum(d.top1_same for d in deltas) / max(1, len(deltas)), by_depth=by_depth)


@dataclass(frozen=True)
class Verdict:
    passed: bool
    over: float                   # share of the tree's nodes above the control's 95th percentile
    control_over: float           # the control's own share above it
    bound: float                  # 2 x the control's max + slack
    reason: str


def compare(tree: list[NodeDelta], control: list[NodeDelta], slack: float = SLACK) -> Verdict:
    """The tree's node deltas against its chain control's (module docstring)."""
    if not tree or not control:
        return Verdict(False, math.nan, math.nan, math.nan,
                       f"no nodes to compare (tree {len(tree)}, control {len(control)})")
    threshold = quantile([d.max_abs for d in control], QUANTILE)
    over = sum(d.max_abs > threshold for d in tree) / len(tree)
    control_over = sum(d.max_abs > threshold for d in control) / len(control)
    bound = 2 * max(d.max_abs for d in control) + slack
    worst = max(d.max_abs for d in tree)
    problems = []
    if over > 2 * control_over + 0.02:
        problems.append(f"{over:.1%} of tree nodes above the control's p95 {threshold:.4f} (the control's own "
                        f"{control_over:.1%}; allowed {2 * control_over + 0.02:.1%})")
    if worst > bound:
        problems.append(f"tree max {worst:.4f} > 2 x control max + {slack} = {bound:.4f}")
    return Verdict(not problems, over, control_over, bound, "; ".join(problems) or "inside the control's distribution")


# --- the KV cache --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KVDelta:
    """A served request's committed KV against a prefill's of the same tokens, per region (max over layers)."""

    prompt_max: float             # positions [0, prompt): both written by a prefill
    answer_max: float             # positions [prompt, common): the served request's by its verify passes
    answer_mean: float
    worst_position: int           # where answer_max is (absolute position)


def kv_delta(served: DumpedRequest, prefilled: DumpedRequest, prompt_len: int) -> KVDelta:
    """served: a request's last dumped step; prefilled: the first step of a request whose prompt was served's
    context (so its prefix KV was written by one prefill). |delta| relative to each layer's largest |value|."""
    common = min(served.prefix, prefilled.prefix)
    if served.token_ids[:common] != prefilled.token_ids[:common]:
        raise ValueError(f"requests {served.rid} and {prefilled.rid} do not share their first {common} tokens")
    if not 0 < prompt_len < common:
        raise ValueError(f"prompt_len {prompt_len} is invalid: expected 0 < prompt_len < {common} (the common prefix)")
    per_pos = []
    for name, a in served.kv.items():
        b = prefilled.kv[name]
        a, b = a[:, :common].float(), b[:, :common].float()                                  # [layers, P, ...]
        scale = b.abs().flatten(1).amax(1).clamp(min=1e-6)                                    # [layers]
        d = ((a - b).abs().flatten(2).amax(2) / scale[:, None]).amax(0)                        # [P]
        per_pos.append(d)
    d = torch.stack(per_pos).amax(0)                                                           # [P]
    answer = d[prompt_len:]
    return KVDelta(prompt_max=float(d[:prompt_len].max()), answer_max=float(answer.max()),
                   answer_mean=float(answer.mean()), worst_position=prompt_len + int(answer.argmax()))

"""The statistical rule for a target whose expert routing bf16 can flip (issue 44, item 3: top 2 of 8 experts).

On such a target no speculative path is token-for-token equal to plain decoding, SGLang's own DFLASH included: a
verify pass over several tokens rounds differently from a one-token decode step, a router's top-k comparison flips,
and the logits move by up to about a nat. So DDTREE is judged against SGLang's DFLASH on the same prompts, not
against identity:

- every answer is walked against plain decoding (NONE) to its end: at each parting the verdict of referee.judge
  (a bf16 near tie, the float32 model's own choice, a float32 near tie, or a real difference) is recorded, plain
  decoding is re-anchored on the speculative prefix, and the walk goes on (at most `limit` partings an answer;
  the tokens counted stop at the last one then);
- DDTREE is no worse than DFLASH when none of three one-sided tests rejects at `alpha` (0.01):
  1. partings per token (an exact conditional binomial test of two Poisson rates: given k_tree + k_control
     partings over n_tree and n_control tokens, k_tree ~ Binomial(k_tree + k_control, n_tree / (n_tree + n_control))
     when the rates are equal);
  2. real differences per token (the float32 referee's verdict), by the same test;
  3. the bf16 gaps of the partings (how far the token taken lies below plain decoding's best): a one-sided
     Mann-Whitney U test that DDTREE's are larger.
A tree-mask fault (a node that sees a sibling) adds partings and larger gaps; the GPU test shows the rule fails it.

The temperature-0 rule of the pairs where identity is decidable walks the same way (partings_of) but stops at the
first real difference or past four near ties (strict_walk; test_ddtree_server.near_ties_against_plain).

Pure Python over the walk's callables: the rules and the walk are checked on the CPU (tests/unit/test_partings.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from testbed.referee import Parting, TopLogprobs, judge

ALPHA = 0.01             # each of the three tests rejects "no worse" below this p-value
LIMIT = 12               # partings walked per answer at most
STRICT_LIMIT = 4         # near ties an answer may pass under the temperature-0 rule


@dataclass(frozen=True)
class PlainModel:
    """What the walk asks of plain decoding (NONE): its top-k next tokens after a context, its greedy
    continuation of a context (n tokens), and optionally the float32 referee's next-token log-probs [V]."""
    next_top: Callable[[list[int]], TopLogprobs]
    continue_greedy: Callable[[list[int], int], list[int]]
    float32_logprobs: Callable[[list[int]], object] | None = None


@dataclass
class AnswerWalk:
    """One speculative answer walked against plain decoding to its end."""
    tokens: int                                           # tokens compared
    partings: list[Parting] = field(default_factory=list)


def partings_of(plain: PlainModel, prompt: list[int], want: list[int], have: list[int]) -> Iterator[Parting]:
    """Every parting of `have` (a speculative answer) from plain decoding's `want`, in order, each judged
    (referee.judge); after each, plain decoding is re-anchored on `have`'s prefix through the parting (it must then
    give `have`'s next tokens). The consumer stops where its rule stops: nothing past the last parting it takes is
    asked of plain decoding."""
    at = 0
    while (at := _first_difference(want, have, at)) is not None:
        context = prompt + have[:at]
        top = plain.next_top(context)
        exact = None if plain.float32_logprobs is None else (lambda c=context: plain.float32_logprobs(c))
        yield judge(at, want[at] if at < len(want) else max(top, key=top.get), have[at], top, exact)
        rest = len(have) - at - 1
        want = have[:at + 1] + (plain.continue_greedy(prompt + have[:at + 1], rest) if rest else [])
        at += 1


def walk_answer(plain: PlainModel, prompt: list[int], want: list[int], have: list[int],
                limit: int = LIMIT) -> AnswerWalk:
    """`have` against plain decoding's `want` to its end (at most `limit` partings): the statistical rule's walk."""
    walk = AnswerWalk(tokens=len(have))
    for parting in partings_of(plain, prompt, want, have):
        walk.partings.append(parting)
        if len(walk.partings) >= limit:
            walk.tokens = parting.position + 1
            break
    return walk


def strict_walk(plain: PlainModel, prompt: list[int], want: list[int], have: list[int],
                limit: int = STRICT_LIMIT) -> tuple[list, str | None]:
    """The temperature-0 rule on targets where identity is decidable (test_ddtree_server and the tests built on it):
    `have` against plain decoding's `want` until the first real difference or past `limit` near ties. Returns the
    partings met (Parting.record() of a passed one; the bf16 gap of a failed one) and why it failed (None: it
    passed)."""
    records: list = []
    for parting in partings_of(plain, prompt, want, have):
        records.append(parting.record() if parting.passed else round(parting.bf16_gap, 5))
        if not parting.passed:
            return records, parting.reason()
        if len(records) > limit:
            return records, f"more than {limit} near ties"
    return records, None


def _first_difference(want: list[int], have: list[int], start: int) -> int | None:
    """The first position >= start where `have` differs from `want` (a `want` that ends early differs)."""
    for i in range(start, len(have)):
        if i >= len(want) or want[i] != have[i]:
            return i
    return None


@dataclass
class Tally:
    """A method's partings over all its answers."""
    name: str
    tokens: int = 0
    partings: list[Parting] = field(default_factory=list)

    def add(self, walk: AnswerWalk) -> None:
        self.tokens += walk.tokens
        self.partings += walk.partings

    @property
    def real(self) -> list[Parting]:
        return [p for p in self.partings if not p.passed]

    @property
    def gaps(self) -> list[float]:
        return [p.bf16_gap for p in self.partings]

    def per_1000(self, partings: Sequence[Parting] | None = None) -> float:
        count = len(self.partings if partings is None else partings)
        return 1000.0 * count / self.tokens if self.tokens else 0.0

    def summary(self) -> dict:
        gaps = sorted(self.gaps)
        return {"tokens": self.tokens, "partings": len(self.partings), "per 1000": round(self.per_1000(), 2),
                "real": len(self.real), "real per 1000": round(self.per_1000(self.real), 2),
                "gap median": round(gaps[len(gaps) // 2], 4) if gaps else None,
                "gap max": round(gaps[-1], 4) if gaps else None}


@dataclass(frozen=True)
class Comparison:
    """The three one-sided p-values of `tree` against `control` (small: the tree is worse)."""
    tree: str
    control: str
    p_partings: float
    p_real: float
    p_gaps: float
    alpha: float = ALPHA

    @property
    def no_worse(self) -> bool:
        return min(self.p_partings, self.p_real, self.p_gaps) >= self.alpha

    def reason(self) -> str:
        failed = [name for name, p in (("partings per token", self.p_partings), ("real differences per token",
                  self.p_real), ("parting gaps", self.p_gaps)) if p < self.alpha]
        verdict = "no worse" if not failed else "worse in " + ", ".join(failed)
        return (f"{self.tree} against {self.control}: {verdict} (p partings {self.p_partings:.3g}, real "
                f"{self.p_real:.3g}, gaps {self.p_gaps:.3g}; alpha {self.alpha})")


def rate_pvalue(k_tree: int, n_tree: int, k_control: int, n_control: int) -> float:
    """One-sided p-value that the tree's events per token exceed the control's (exact conditional binomial)."""
    from scipy import stats

    if n_tree <= 0 or n_control <= 0:
        raise ValueError(f"token counts must be positive: tree {n_tree}, control {n_control}")
    total = k_tree + k_control
    if total == 0:
        return 1.0
    return float(stats.binomtest(k_tree, total, n_tree / (n_tree + n_control), alternative="greater").pvalue)


def gaps_pvalue(tree: Sequence[float], control: Sequence[float]) -> float:
    """One-sided Mann-Whitney U p-value that the tree's gaps are larger than the control's (1.0 without both)."""
    from scipy import stats

    if not tree or not control:
        return 1.0
    return float(stats.mannwhitneyu(list(tree), list(control), alternative="greater").pvalue)


def compare(tree: Tally, control: Tally, alpha: float = ALPHA) -> Comparison:
    return Comparison(tree.name, control.name,
                      rate_pvalue(len(tree.partings), tree.tokens, len(control.partings), control.tokens),
                      rate_pvalue(len(tree.real), tree.tokens, len(control.real), control.tokens),
                      gaps_pvalue(tree.gaps, control.gaps), alpha)

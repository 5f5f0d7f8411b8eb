"""Random cases of the reference engine's losslessness: DDTREE against plain greedy decoding in float64, over
shapes and settings the fixed tests do not list - a dense or a Kimi-shaped (MLA + MoE + YaRN) pair of random
weights, vocabulary 6..300, block 2..8, budget 1..64 or a schedule by running batch, cap 1..8 or a schedule,
1..12 prompts of 1..41 tokens at once, 1..40 new tokens, a stop id or none.

`make test` runs a fixed sample (FUZZ_SAMPLE seeds); `make fuzz-engine` runs K26_FUZZ_CASES seeds from
K26_FUZZ_START (default 200 from 0) and reports each failing seed, which reproduces alone.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pytest
import torch

from ddtree.reference import generate, init_pair
from ddtree.settings import Schedule

from .conftest import kimi_shaped_configs, small_vocab_pair

FUZZ_SAMPLE = range(6)


@dataclass
class Case:
    """One random case: the pair, the prompts and the decoding settings."""
    pair: object
    vocab: int
    prompts: list[list[int]]
    max_new_tokens: int
    stop_ids: list[int]
    budget: int | Schedule
    cap: int | Schedule

    def describe(self) -> str:
        kind = "mla" if getattr(self.pair.target.config, "kv_lora_rank", None) else "dense"
        return (f"{kind} vocab {self.vocab} block {self.pair.draft.config.block_size} budget {self.budget} "
                f"cap {self.cap} prompts {[len(p) for p in self.prompts]} new {self.max_new_tokens} stops {self.stop_ids}")


def dense_pair(rng: random.Random, vocab: int):
    block_size = rng.choice([2, 3, 4, 8])
    seed, std = rng.randrange(1000), rng.choice([0.1, 0.2, 0.4])
    return small_vocab_pair(vocab, seed=seed, std=std, block_size=block_size)


def kimi_shaped_pair(rng: random.Random, vocab: int):
    configs = kimi_shaped_configs(vocab, block_size=rng.choice([2, 4, 8]), mask_token_id=vocab - 1, bos_token_id=0,
                                  eos_token_id=1)
    return init_pair(*configs, rng.randrange(1000), std=rng.choice([0.08, 0.3]))


def width(rng: random.Random, high: int) -> int | Schedule:
    """One value, or (three times in ten) a schedule of 2-3 steps by running batch size."""
    if rng.random() < 0.3:
        starts = sorted(rng.sample(range(2, 13), rng.randrange(1, 3)))
        return Schedule(((1, rng.randint(1, high)),) + tuple((s, rng.randint(1, high)) for s in starts))
    return rng.randint(1, high)


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    kimi = rng.random() < 0.4
    vocab = rng.choice([10, 40, 260] if kimi else [6, 8, 12, 32, 300])
    pair = (kimi_shaped_pair if kimi else dense_pair)(rng, vocab)
    pair.target.double()
    pair.draft.double()
    prompts = [[0] + [rng.randrange(2, vocab - 1) for _ in range(rng.randint(0, 40))] for _ in range(rng.randint(1, 12))]
    stops = rng.sample(range(2, vocab - 1), rng.randint(0, 1)) if vocab < 50 else []
    return Case(pair, vocab, prompts, rng.randint(1, 40), stops, width(rng, 64), width(rng, 8))


def check(seed: int) -> None:
    case = make_case(seed)
    with torch.no_grad():
        plain = generate(case.pair, case.prompts, max_new_tokens=case.max_new_tokens, method="ar",
                         stop_token_ids=case.stop_ids)
        tree = generate(case.pair, case.prompts, max_new_tokens=case.max_new_tokens, method="ddtree",
                        budget=case.budget, topk_cap=case.cap, stop_token_ids=case.stop_ids)
    for i, (a, b) in enumerate(zip(plain, tree)):
        assert b.tokens == a.tokens, f"seed {seed} ({case.describe()}): prompt {i}: plain {a.tokens}, ddtree {b.tokens}"
        assert b.num_verify_steps <= a.num_verify_steps, f"seed {seed}: more verify steps than tokens"


def fuzz_seeds() -> range:
    if os.environ.get("K26_FUZZ_CASES"):
        start = int(os.environ.get("K26_FUZZ_START", "0"))
        return range(start, start + int(os.environ["K26_FUZZ_CASES"]))
    return FUZZ_SAMPLE


@pytest.mark.parametrize("seed", fuzz_seeds())
def test_ddtree_gives_plain_decodings_tokens_on_a_random_case(seed):
    check(seed)


def test_the_cases_cover_both_architectures_schedules_and_stops():
    """The generator reaches what it claims (over the first 40 seeds), so the sample is not all one kind."""
    cases = [make_case(s) for s in range(40)]
    assert any(getattr(c.pair.target.config, "kv_lora_rank", None) for c in cases)
    assert any(not getattr(c.pair.target.config, "kv_lora_rank", None) for c in cases)
    assert any(isinstance(c.budget, Schedule) for c in cases) and any(isinstance(c.cap, Schedule) for c in cases)
    assert any(c.stop_ids for c in cases) and any(len(c.prompts) > 8 for c in cases)

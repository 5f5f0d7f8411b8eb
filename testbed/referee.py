"""The float32 referee of a temperature-0 parting: where a speculative server's greedy tokens first part
from plain decoding's, the model without bf16's rounding (the reference engine in float32, with the
weights the export serves) says whether the token taken is one it would take.

A parting passes when
- plain decoding's own (bf16) log-probs there put the token taken within a near tie of its best (two tokens or
  more: an exact three-way tie was met on the H200, 2026-12-03); or
- with a referee: the token taken is the float32 model's argmax ("exact"), or the float32 model itself puts
  the token taken within a near tie of its best ("float32 tie": any bf16 evaluation may flip such a choice; a
  mixture-of-experts target flips routing choices too, so SGLang's own paths part from plain decoding well
  past one bf16 step, H200 2026-12-02).
Anything else is a real difference. The same NEAR_TIE bounds both the bf16 and the float32 gap.

With penalties (`processed_referee`) the referee applies the request's penalties to the float32 logits as SGLang's
penalizers define them (`penalised`), so a parting under a penalised request is judged by the penalised float32
model: a penalty counted wrong moves a logit by the penalty itself (0.3-0.8 nats in the tests), which no rounding
covers.

Nothing here imports torch or SGLang at import time: the judgement is checked on the CPU
(tests/reference/test_referee.py), the GPU tests build the referee on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# Plain decoding's own top-2 log-prob gap below which a bf16 near tie may flip between kernels
# (the verify pass attends over N tokens at once, the plain decode step over one): 2 bf16 ulps of a
# log-prob between 4 and 8. Larger gaps are real differences.
NEAR_TIE = 0.0625


@dataclass(frozen=True)
class Parting:
    """Where a speculative answer first parts from plain decoding's, and the verdict."""
    position: int
    plain_token: int
    taken_token: int
    bf16_gap: float                    # how far the token taken lies below plain decoding's best there
    kind: str                          # "near tie" | "exact" | "float32 tie" | "real difference"
    float32_best: int | None = None    # the referee's argmax (None: no referee asked)
    float32_gap: float | None = None   # referee's logp(plain token) - logp(token taken)

    @property
    def passed(self) -> bool:
        return self.kind != "real difference"

    def record(self):
        """What the test report shows for a passed parting (compact, as before: the bf16 gap alone for a near tie)."""
        if self.kind == "near tie":
            return round(self.bf16_gap, 5)
        return (self.kind, round(self.bf16_gap, 5), round(self.float32_gap, 5))

    def reason(self) -> str:
        text = (f"position {self.position}: token {self.taken_token} where plain decoding's token is {self.plain_token} "
                f"and the token taken lies {self.bf16_gap:.4f} below it")
        if self.float32_best is not None:
            text += (f"; the float32 model picks {self.float32_best}, and puts the token taken {self.float32_gap:.4f} "
                     f"below plain decoding's")
        return text


TopLogprobs = dict[int, float]     # plain decoding's top-k next tokens: token -> log-prob (k >= 2)


def best_gap(top: TopLogprobs) -> float:
    """The log-prob gap between the two best tokens of `top`."""
    first, second = sorted(top.values(), reverse=True)[:2]
    return first - second


def gap_to(top: TopLogprobs, token: int) -> float:
    """How far `token` lies below the best of `top`; a token outside `top` lies at least as far as its last."""
    return max(top.values()) - top.get(token, min(top.values()))


def is_near_tie(top: TopLogprobs, token: int) -> bool:
    """`token` is among `top` and within NEAR_TIE of its best (a two-way or wider near tie: bf16 may flip any of
    the tokens inside it; an exact three-way tie is as legitimate a choice as a two-way one)."""
    return token in top and gap_to(top, token) <= NEAR_TIE


def judge(position: int, plain_token: int, taken_token: int, plain_top: TopLogprobs,
          float32_logprobs: Callable[[], object] | None = None) -> Parting:
    """The verdict on one parting. plain_top: plain decoding's own top-k log-probs there (bf16); float32_logprobs:
    called only past a bf16 near tie, it gives the referee's next-token log-probs [V] on the shared prefix (a torch
    tensor); None without a referee."""
    bf16_gap = gap_to(plain_top, taken_token)
    if is_near_tie(plain_top, taken_token):
        return Parting(position, plain_token, taken_token, bf16_gap, "near tie")
    if float32_logprobs is None:
        return Parting(position, plain_token, taken_token, bf16_gap, "real difference")
    return float32_parting(position, plain_token, taken_token, bf16_gap, float32_logprobs())


def float32_parting(position: int, plain_token: int, taken_token: int, bf16_gap: float, logprobs) -> Parting:
    """The referee's verdict from its next-token log-probs [V] on the shared prefix (a torch tensor): the token
    taken is its argmax ("exact"), within NEAR_TIE of its best ("float32 tie"), or neither ("real difference")."""
    values, tokens = logprobs.topk(min(8, logprobs.numel()))                   # [k], [k]
    float32_top = {int(t): float(v) for t, v in zip(tokens, values)}
    gap = float(logprobs[plain_token] - logprobs[taken_token])
    best = int(tokens[0])
    if taken_token == best:
        kind = "exact"
    elif is_near_tie(float32_top, taken_token):
        kind = "float32 tie"
    else:
        kind = "real difference"
    return Parting(position, plain_token, taken_token, bf16_gap, kind, best, gap)


@dataclass
class Referee:
    """context (token ids) -> the float32 model's next-token log-probs [V]."""
    logprobs: Callable[[list[int]], object]

    def choice(self, context: list[int]) -> int:
        return int(self.logprobs(context).argmax())


def target_referee(target, device: str) -> Referee:
    """A Referee over a reference TargetLM already on `device` in float32."""
    import torch

    def logprobs(context: list[int]):
        with torch.no_grad():
            logits = target.forward_sequence(torch.tensor([context], device=device)).logits[0, -1]   # [V]
        return torch.log_softmax(logits.float(), -1)
    return Referee(logprobs)


def penalised(logits, output: list[int], sampling: dict):
    """A request's penalties on float32 next-token logits [V] after `output` (its answer so far), as SGLang 0.5.23's
    penalizers define them over the output: frequency (minus frequency x count), presence (minus presence once),
    min_new_tokens (the request's stop_token_ids at -inf while the output is shorter), then repetition (a token in
    the output: its logit divided by the penalty if positive, multiplied if negative) - additive first, then
    scaling, SGLang's speculative order (the referee is for order-free combinations). Returns log-probs [V]."""
    import torch

    logits = logits.float().clone()
    counts = torch.bincount(torch.tensor(output, dtype=torch.int64, device=logits.device),
                            minlength=logits.numel())[: logits.numel()].float()                 # [V]
    logits -= float(sampling.get("frequency_penalty", 0.0)) * counts
    logits -= float(sampling.get("presence_penalty", 0.0)) * (counts > 0).float()
    if len(output) < int(sampling.get("min_new_tokens", 0) or 0):
        logits[list(sampling.get("stop_token_ids") or [])] = float("-inf")
    repetition = float(sampling.get("repetition_penalty", 1.0))
    if repetition != 1.0:
        seen = counts > 0
        scaled = torch.where(logits < 0, logits * repetition, logits / repetition)
        logits = torch.where(seen, scaled, logits)
    return torch.log_softmax(logits, -1)


def processed_referee(target, device: str, prompt_len: int, sampling: dict) -> Referee:
    """A Referee over a reference TargetLM in float32 with one request's penalties applied (penalised): context =
    prompt (its first prompt_len tokens) + the answer so far."""
    import torch

    def logprobs(context: list[int]):
        with torch.no_grad():
            logits = target.forward_sequence(torch.tensor([context], device=device)).logits[0, -1]   # [V]
        return penalised(logits, context[prompt_len:], sampling)
    return Referee(logprobs)


def bf16_served_pair(ref_dir: Path, device: str):
    """The reference pair in float32 on `device`, its weights rounded to bf16 as the export stores them:
    what SGLang computes, without SGLang's bf16 activations."""
    import torch

    from ddtree.reference.pair import load_pair

    pair = load_pair(Path(ref_dir), device=device, dtype=torch.float32)
    with torch.no_grad():
        for model in (pair.target, pair.draft):
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    return pair


def int4_served_target(ref_dir: Path, device: str):
    """The trained target as the INT4 export serves it, in float32 on `device`: each routed expert's weight
    replaced by its INT4 values times its bf16 scales (from the float32 weights as the export quantized them),
    every other weight rounded to bf16."""
    import torch

    from ddtree.reference.export import int4_roundtrip
    from ddtree.reference.pair import load_pair

    target = load_pair(Path(ref_dir), device=device, dtype=torch.float32).target
    with torch.no_grad():
        served = {id(getattr(expert, name).weight): int4_roundtrip(getattr(expert, name).weight)
                  for layer in target.layers for expert in getattr(layer.mlp, "experts", [])
                  for name in ("gate_proj", "up_proj", "down_proj")}
        for p in target.parameters():
            p.copy_(served[id(p)].to(p.device) if id(p) in served else p.to(torch.bfloat16).float())
    return target

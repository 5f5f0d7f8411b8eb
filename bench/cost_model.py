"""A cost model of one DDTREE verify step on the production host (issue 32, item 6): Kimi K2.6 at
TP 8 on 8 x RTX PRO 6000 Blackwell over PCIe, from published rates and the model's shapes. No GPU.

    python bench/cost_model.py [--context 4096] [--bus-gbps 20] [--allreduce-latency-us 40] [--json]

A step verifies T = batch x (budget + 1) tokens (NONE: T = batch). Its time, per GPU, is modelled as

  weights   bytes read once per step: attention, shared experts, the dense layer and the LM head
            (bf16, split 8 ways), plus every routed expert at least one of the T tokens picks
            (INT4), whose expected count per layer is E x (1 - (1 - k/E)^T) for uniform routing
  kv        the latent KV cache the attention reads: MLA's latent is replicated on every TP rank,
            so each GPU reads batch x context x (kv_lora + rope) x 2 bytes x layers
  compute   2 x active parameters x T / 8 FLOPs at the dense BF16 rate (INT4 weight-only GEMMs
            dequantise to BF16)
  memory    max(weights + kv over the memory bandwidth, compute over the BF16 rate)
  allreduce two per layer (attention out, MoE out) of T x hidden bf16: ring all-reduce over PCIe,
            2 (n - 1) / n x bytes over the bus bandwidth plus a fixed latency each
  overhead  a fixed per-step host + launch cost (the scheduler, sampling, the tree build)

and tokens per step = batch x tokens per verify step at that budget (an input: the test bed's
trained pair by default, not Kimi's draft). Every assumption is a field of Hardware or KimiShape
with its source; docs/cost-model.md lists them and what would replace each with a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Hardware:
    """One RTX PRO 6000 Blackwell Server Edition per rank, 8 ranks over PCIe 5.0 (no NVLink)."""
    gpus: int = 8
    memory_gbps: float = 1792.0            # GDDR7, published
    bf16_tflops: float = 250.0             # dense tensor rate, an estimate (GB202 class; see docs)
    memory_efficiency: float = 0.7         # share of the peak bandwidth a decode GEMM reaches
    compute_efficiency: float = 0.5        # share of the peak rate a skinny INT4 x BF16 GEMM reaches
    bus_gbps: float = 20.0                 # NCCL all-reduce bus bandwidth over PCIe, 8 ranks (estimate)
    allreduce_latency_us: float = 40.0     # per all-reduce, small messages over PCIe (estimate)
    step_overhead_ms: float = 1.5          # host and launches per step with CUDA graphs (estimate)


@dataclass(frozen=True)
class KimiShape:
    """Kimi K2.6's text model (DeepSeek-V3 layout), from its config."""
    layers: int = 61
    dense_layers: int = 1
    hidden: int = 7168
    heads: int = 64
    q_lora: int = 1536
    kv_lora: int = 512
    qk_nope: int = 128
    qk_rope: int = 64
    v_head: int = 128
    experts: int = 384
    active_experts: int = 8
    shared_experts: int = 1
    expert_inter: int = 2048
    dense_inter: int = 18432
    vocab: int = 163840
    active_params: float = 32e9
    int4_bytes_per_param: float = 0.53     # 4 bits + group scales (group 32, bf16)

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    def attention_params(self) -> int:
        qk = self.qk_nope + self.qk_rope
        return (self.hidden * self.q_lora + self.q_lora * self.heads * qk + self.hidden * (self.kv_lora + self.qk_rope)
                + self.kv_lora * self.heads * (self.qk_nope + self.v_head) + self.heads * self.v_head * self.hidden)

    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_inter

    def kv_bytes_per_token(self) -> int:
        return (self.kv_lora + self.qk_rope) * 2 * self.layers


# tokens per verify step (accepted + 1) measured with the trained byte-level pair, cap 8, batch 1,
# temperature 0 (docs/benchmarks.md, "Full table"): a stand-in until the host's own sweep measures
# Kimi's draft
TEST_BED_TOKENS_PER_STEP = {8: 2.80, 16: 3.53, 32: 3.78, 64: 3.98}


@dataclass(frozen=True)
class StepCost:
    batch: int
    budget: int            # 0 = NONE
    tokens: int            # T, tokens through the target this step
    weights_gb: float      # per GPU
    kv_gb: float           # per GPU
    memory_ms: float
    compute_ms: float
    allreduce_ms: float
    step_ms: float
    tokens_per_s: float


def expected_experts(tokens: int, shape: KimiShape) -> float:
    """Distinct routed experts per layer that at least one of `tokens` tokens picks (uniform routing)."""
    return shape.experts * (1 - (1 - shape.active_experts / shape.experts) ** tokens)


def weight_bytes(tokens: int, shape: KimiShape, hw: Hardware) -> float:
    """Weight bytes one GPU reads in a step of `tokens` tokens."""
    bf16 = 2 * (shape.attention_params() * shape.layers
                + shape.shared_experts * shape.expert_params() * shape.moe_layers
                + 3 * shape.hidden * shape.dense_inter * shape.dense_layers
                + shape.hidden * shape.vocab)
    routed = expected_experts(tokens, shape) * shape.expert_params() * shape.int4_bytes_per_param * shape.moe_layers
    return (bf16 + routed) / hw.gpus


def allreduce_ms(tokens: int, shape: KimiShape, hw: Hardware) -> float:
    message = tokens * shape.hidden * 2
    one = 2 * (hw.gpus - 1) / hw.gpus * message / (hw.bus_gbps * 1e9) * 1e3 + hw.allreduce_latency_us / 1e3
    return 2 * shape.layers * one


def step_cost(batch: int, budget: int, context: int, tokens_per_verify: float, shape: KimiShape = KimiShape(),
              hw: Hardware = Hardware()) -> StepCost:
    """One step of `batch` requests at `context` tokens each; budget 0 = NONE (one token each)."""
    tokens = batch * (budget + 1) if budget else batch
    weights = weight_bytes(tokens, shape, hw)
    kv = batch * context * shape.kv_bytes_per_token()
    memory = (weights + kv) / (hw.memory_gbps * 1e9 * hw.memory_efficiency) * 1e3
    compute = 2 * shape.active_params * tokens / hw.gpus / (hw.bf16_tflops * 1e12 * hw.compute_efficiency) * 1e3
    reduce = allreduce_ms(tokens, shape, hw)
    step = max(memory, compute) + reduce + hw.step_overhead_ms
    emitted = batch * (tokens_per_verify if budget else 1.0)
    return StepCost(batch, budget, tokens, weights / 1e9, kv / 1e9, memory, compute, reduce, step, emitted / step * 1e3)


@dataclass
class Prediction:
    batches: list[int]
    budgets: list[int]
    costs: dict[tuple[int, int], StepCost] = field(default_factory=dict)

    def best_budget(self, batch: int) -> int:
        """The budget with the most tokens/s at this batch (0 = NONE wins)."""
        return max([0, *self.budgets], key=lambda b: self.costs[(batch, b)].tokens_per_s)

    def schedule(self) -> str:
        """`1:64,8:16,...` over the batches, DDTREE's best budget at each (NONE's loads left at the
        smallest budget, listed separately by none_wins)."""
        steps: list[tuple[int, int]] = []
        for i, batch in enumerate(self.batches):
            best = max(self.budgets, key=lambda b: self.costs[(batch, b)].tokens_per_s)
            if not steps or steps[-1][1] != best:
                steps.append((1 if i == 0 else batch, best))
        return str(steps[0][1]) if len(steps) == 1 else ",".join(f"{b}:{v}" for b, v in steps)

    def none_wins(self) -> list[int]:
        return [b for b in self.batches if self.best_budget(b) == 0]


def predict(batches: list[int], budgets: list[int], context: int, tokens_per_step: dict[int, float],
            shape: KimiShape = KimiShape(), hw: Hardware = Hardware()) -> Prediction:
    out = Prediction(batches, budgets)
    for batch in batches:
        out.costs[(batch, 0)] = step_cost(batch, 0, context, 1.0, shape, hw)
        for budget in budgets:
            out.costs[(batch, budget)] = step_cost(batch, budget, context, tokens_per_step[budget], shape, hw)
    return out


def table(pred: Prediction) -> str:
    head = "| batch | " + " | ".join(["NONE"] + [f"b{b}" for b in pred.budgets]) + " | best | NONE step ms | b32 step ms (weights / allreduce) |"
    lines = [head, "|" + "---|" * (len(pred.budgets) + 5)]
    for batch in pred.batches:
        cells = [f"{pred.costs[(batch, b)].tokens_per_s:,.0f}" for b in [0, *pred.budgets]]
        best = pred.best_budget(batch)
        none, b32 = pred.costs[(batch, 0)], pred.costs.get((batch, 32))
        split = (f"{b32.step_ms:.1f} ({b32.memory_ms:.1f} / {b32.allreduce_ms:.1f})" if b32 else "-")
        lines.append(f"| {batch} | " + " | ".join(cells) + f" | {'NONE' if best == 0 else f'b{best}'} | "
                     f"{none.step_ms:.1f} | {split} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=4096, help="tokens of context per request (KV read per step)")
    ap.add_argument("--bus-gbps", type=float, default=Hardware.bus_gbps, help="NCCL all-reduce bus bandwidth, GB/s")
    ap.add_argument("--allreduce-latency-us", type=float, default=Hardware.allreduce_latency_us)
    ap.add_argument("--batches", default="1,2,4,8,16,32,48")
    ap.add_argument("--json", action="store_true", help="print the costs as JSON rows instead of the table")
    args = ap.parse_args(argv)
    hw = Hardware(bus_gbps=args.bus_gbps, allreduce_latency_us=args.allreduce_latency_us)
    batches = [int(b) for b in args.batches.split(",")]
    pred = predict(batches, sorted(TEST_BED_TOKENS_PER_STEP), args.context, TEST_BED_TOKENS_PER_STEP, hw=hw)
    if args.json:
        print(json.dumps([asdict(c) for c in pred.costs.values()], indent=1))
        return 0
    print(f"Kimi K2.6, TP 8 over PCIe: predicted tokens/s per host, context {args.context}, "
          f"all-reduce bus {hw.bus_gbps} GB/s + {hw.allreduce_latency_us} us, tokens per verify step of the test bed's pair")
    print(table(pred))
    print(f"\nschedule (DDTREE's best budget by running batch): {pred.schedule()}; "
          f"NONE predicted faster at batch {', '.join(map(str, pred.none_wins())) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A cost model of one verify step of Kimi K2.6 at TP 8 on 8 x RTX PRO 6000 Blackwell over PCIe (issue 32, item 6),
checked against a measured curve: the test bed's timing rig of one TP-8 rank (issue 69, bench/kimi_rank.py).

    python bench/cost_model.py [--context 4096] [--bus-gbps 20] [--allreduce-latency-us 40] [--json]
    python bench/cost_model.py --check RIG.json [--rig-gpu h100]   the model against the rig, every row

Per rank (one of the 8 GPUs), one forward of T tokens for `batch` requests of `context` tokens each:

  bytes     per layer: attention in bf16 (q_a and kv_a replicated on every rank; q_b, kv_b and o split 8 ways), the
            dense MLP (layer 0) or the shared expert (bf16, split) plus every routed expert at least one of the T
            tokens picks (INT4 with group scales, split); the latent KV cache, batch x context x (512 + 64) x 2 bytes
            (replicated on every rank); once per step: the LM head's slice
  flops     2 x T x the weights a token uses (attention, the dense MLP or the shared expert and its k routed
            experts, the LM head) + the attention over the context (absorbed MLA: 2 x T x context x heads x 1,088)
  step      layers x (kernel floor + bytes / bandwidth + flops / rate) + the LM head + all-reduce + host overhead:
            reading weights and computing are summed, not overlapped (the rig's curve says so: issue 69)
  all-reduce  two per layer of T x hidden bf16 over PCIe, ring: 2 (n - 1) / n x bytes / bus + a latency each - the one
            term nothing here measures (NCCL's formula with an assumed bus bandwidth and latency)

The distinct routed experts of T tokens are a routing assumption: uniform (E x (1 - (1 - k / E)^T), SGLang's
SGLANG_SIMULATE_UNIFORM_EXPERTS in expectation), round-robin (min(E, k T): no two tokens share an expert) or
measured. The bandwidth, the rate and the kernel floor are the calibration: on the rig they are read from its own
curve (the copy bandwidth, and the floor and rate that its T = 1 and largest-T steps leave); for the production host
the rig's are carried over by the ratios in docs/cost-model.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Hardware:
    """What one rank reaches, and the bus between ranks. Defaults: one RTX PRO 6000 Blackwell Server Edition per rank,
    8 ranks over PCIe 5.0 (no NVLink), with the rig's H100 calibration carried over (docs/cost-model.md)."""
    name: str = "RTX PRO 6000 Blackwell x 8 (PCIe)"
    gpus: int = 8
    memory_gbps: float = 1792.0 * 0.85     # GDDR7 1,792 GB/s published x the share the rig's H100 reached in a copy
    tflops: float = 140.0                  # reached bf16 rate of decode/verify GEMMs (the rig's, scaled; see docs)
    layer_floor_us: float = 110.0          # fixed cost of one layer's kernels under a CUDA graph (the rig's)
    bus_gbps: float = 20.0                 # NCCL all-reduce bus bandwidth over PCIe, 8 ranks (estimate)
    allreduce_latency_us: float = 40.0     # per all-reduce, small messages over PCIe (estimate)
    host_overhead_ms: float = 1.5          # scheduler, sampling, the tree build per step outside the forward (estimate)
    allreduce: bool = True                 # False on the rig: one rank alone, no bus


@dataclass(frozen=True)
class KimiShape:
    """Kimi K2.6's text model (DeepSeek-V3 layout), from its config; per-rank widths divide by the TP size."""
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
    int4_bytes_per_param: float = 0.5 + 2 / 32     # 4 bits + a bf16 scale per group of 32

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    def attention_params(self, tp: int) -> float:
        """One layer's attention weights on one rank: q_a and kv_a (with the rope key) replicated, the rest split."""
        qk = self.qk_nope + self.qk_rope
        replicated = self.hidden * self.q_lora + self.hidden * (self.kv_lora + self.qk_rope)
        split = (self.q_lora * self.heads * qk + self.kv_lora * self.heads * (self.qk_nope + self.v_head)
                 + self.heads * self.v_head * self.hidden)
        return replicated + split / tp

    def expert_params(self, tp: int) -> float:
        return 3 * self.hidden * self.expert_inter / tp

    def dense_params(self, tp: int) -> float:
        return 3 * self.hidden * self.dense_inter / tp

    def head_params(self, tp: int) -> float:
        return self.hidden * self.vocab / tp

    def kv_bytes_per_token(self) -> int:
        """One layer's latent KV of one token (replicated on every rank)."""
        return (self.kv_lora + self.qk_rope) * 2

    def attention_flops_per_context_token(self, tp: int) -> float:
        """Absorbed MLA: each query head scores the 576-wide latent and reads back the 512-wide one."""
        return 2 * self.heads / tp * (2 * self.kv_lora + self.qk_rope)


def distinct_experts(tokens: int, shape: KimiShape, routing: str = "uniform",
                     measured: dict[int, float] | None = None) -> float:
    """Routed experts per layer that at least one of `tokens` tokens picks."""
    if measured and tokens in measured:
        return measured[tokens]
    e, k = shape.experts, shape.active_experts
    if routing == "uniform":
        return e * (1 - (1 - k / e) ** tokens)
    if routing == "round-robin":
        return min(e, k * tokens)
    raise ValueError(f"routing {routing!r} is invalid: expected uniform or round-robin")


def expected_experts(tokens: int, shape: KimiShape) -> float:
    """Uniform routing (the production model's assumption)."""
    return distinct_experts(tokens, shape, "uniform")


@dataclass(frozen=True)
class Forward:
    """One forward of `tokens` tokens on one rank, in its terms (ms) and sizes (GB per rank)."""
    tokens: int
    batch: int
    experts: float             # distinct routed experts a MoE layer reads
    weights_gb: float
    kv_gb: float
    memory_ms: float
    compute_ms: float
    floor_ms: float
    allreduce_ms: float

    @property
    def ms(self) -> float:
        return self.memory_ms + self.compute_ms + self.floor_ms + self.allreduce_ms


def weight_bytes(tokens: int, shape: KimiShape, hw: Hardware, routing: str = "uniform",
                 measured: dict[int, float] | None = None) -> float:
    """Weight bytes one rank reads in a forward of `tokens` tokens."""
    tp = hw.gpus
    bf16 = 2 * (shape.attention_params(tp) * shape.layers + shape.dense_params(tp) * shape.dense_layers
                + shape.shared_experts * shape.expert_params(tp) * shape.moe_layers + shape.head_params(tp))
    routed = (distinct_experts(tokens, shape, routing, measured) * shape.expert_params(tp)
              * shape.int4_bytes_per_param * shape.moe_layers)
    return bf16 + routed


def forward_flops(tokens: int, batch: int, context: int, shape: KimiShape, tp: int) -> float:
    per_token = (shape.attention_params(tp) * shape.layers + shape.dense_params(tp) * shape.dense_layers
                 + (shape.shared_experts + shape.active_experts) * shape.expert_params(tp) * shape.moe_layers
                 + shape.head_params(tp))
    attention = tokens * context * shape.attention_flops_per_context_token(tp) * shape.layers
    return 2 * tokens * per_token + attention


def allreduce_ms(tokens: int, shape: KimiShape, hw: Hardware) -> float:
    if not hw.allreduce or hw.gpus == 1:
        return 0.0
    message = tokens * shape.hidden * 2
    one = 2 * (hw.gpus - 1) / hw.gpus * message / (hw.bus_gbps * 1e9) * 1e3 + hw.allreduce_latency_us / 1e3
    return 2 * shape.layers * one


def forward_cost(tokens: int, batch: int, context: int, shape: KimiShape = KimiShape(), hw: Hardware = Hardware(),
                 routing: str = "uniform", measured: dict[int, float] | None = None) -> Forward:
    """One forward of `tokens` tokens for `batch` requests of `context` tokens each (a verify of width w: w x batch)."""
    weights = weight_bytes(tokens, shape, hw, routing, measured)
    kv = batch * context * shape.kv_bytes_per_token() * shape.layers
    return Forward(tokens=tokens, batch=batch, experts=distinct_experts(tokens, shape, routing, measured),
                   weights_gb=weights / 1e9, kv_gb=kv / 1e9,
                   memory_ms=(weights + kv) / (hw.memory_gbps * 1e9) * 1e3,
                   compute_ms=forward_flops(tokens, batch, context, shape, hw.gpus) / (hw.tflops * 1e12) * 1e3,
                   floor_ms=shape.layers * hw.layer_floor_us / 1e3, allreduce_ms=allreduce_ms(tokens, shape, hw))


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


def step_cost(batch: int, budget: int, context: int, tokens_per_verify: float, shape: KimiShape = KimiShape(),
              hw: Hardware = Hardware()) -> StepCost:
    """One step of `batch` requests at `context` tokens each; budget 0 = NONE (one token each)."""
    tokens = batch * (budget + 1) if budget else batch
    f = forward_cost(tokens, batch, context, shape, hw)
    step = f.ms + hw.host_overhead_ms
    emitted = batch * (tokens_per_verify if budget else 1.0)
    return StepCost(batch, budget, tokens, f.weights_gb, f.kv_gb, f.memory_ms + f.floor_ms, f.compute_ms,
                    f.allreduce_ms, step, emitted / step * 1e3)


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


# --- the model against the rig (issue 69) ---------------------------------------------------------------------------

TOLERANCE = 0.20      # issue 69: the model predicts every rig step within 20%


@dataclass(frozen=True)
class RigPoint:
    """One measured forward of the rig: T tokens for `batch` requests, its time and what it was."""
    kind: str              # decode (one-batch bench) or verify (DDTREE's verify stage)
    routing: str
    tokens: int
    batch: int
    width: int
    ms: float


@dataclass
class RigData:
    layers: int
    gpu: str
    context: int
    copy_gbps: float
    points: list[RigPoint]


def load_rig(path: Path) -> RigData:
    """bench/kimi_rank.py's rig.json as the model's points."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--check {path}: not a readable rig.json ({err}); write it with bench/kimi_rank.py report")
    if not data.get("copy_gbps") or not data.get("decode_ms"):
        raise ValueError(f"--check {path}: the rig holds no copy bandwidth or no decode curve; run its experts and "
                         "decode steps (bench/kimi_rank.sh) before checking the model")
    points = [RigPoint("decode", routing, int(t), int(t), 1, ms) for routing, by_t in data["decode_ms"].items()
              for t, ms in by_t.items()]
    points += [RigPoint("verify", r["routing"], r["tokens"], r["batch"], r["width"], r["verify_ms"])
               for r in data.get("verify", [])]
    return RigData(int(data["layers"]), data.get("gpu", ""), int(data.get("input_len", 128)), float(data["copy_gbps"]),
                   points)


def rig_shape(layers: int) -> KimiShape:
    return KimiShape(layers=layers)


def calibrate(rig: RigData, shape: KimiShape) -> Hardware:
    """The rig's hardware: bandwidth = its device copy; the kernel floor and the reached rate from two of its own
    points (uniform decode at the smallest and the largest T): solved from their two equations, nothing fitted to
    the points in between."""
    curve = sorted((p for p in rig.points if p.kind == "decode" and p.routing == "uniform"), key=lambda p: p.tokens)
    if len(curve) < 3:
        raise ValueError("the rig's uniform decode curve has fewer than 3 points: the floor and the rate need two, "
                         "the check at least one more")
    lo, hi = curve[0], curve[-1]
    hw = Hardware(name=f"rig: {rig.gpu}", memory_gbps=rig.copy_gbps, tflops=1.0, layer_floor_us=0.0, allreduce=False)
    f_lo, f_hi = (forward_cost(p.tokens, p.batch, rig.context, shape, hw) for p in (lo, hi))
    flops_lo, flops_hi = (forward_flops(p.tokens, p.batch, rig.context, shape, hw.gpus) for p in (lo, hi))
    compute_s = (hi.ms - f_hi.memory_ms) - (lo.ms - f_lo.memory_ms)              # ms of compute between the two
    if compute_s <= 0:
        raise ValueError(f"the rig's T={hi.tokens} step ({hi.ms} ms) leaves no compute time over T={lo.tokens} "
                         f"({lo.ms} ms) after its bytes: the bandwidth or the curve is wrong")
    tflops = (flops_hi - flops_lo) / (compute_s / 1e3) / 1e12
    floor_ms = lo.ms - f_lo.memory_ms - flops_lo / (tflops * 1e12) * 1e3
    return replace(hw, tflops=round(tflops, 1), layer_floor_us=round(1e3 * floor_ms / shape.layers, 1))


@dataclass(frozen=True)
class Checked:
    point: RigPoint
    predicted_ms: float

    @property
    def error(self) -> float:
        return self.predicted_ms / self.point.ms - 1


def check(rig: RigData, hw: Hardware, shape: KimiShape) -> list[Checked]:
    return [Checked(p, forward_cost(p.tokens, p.batch, rig.context, shape, hw, p.routing).ms) for p in rig.points]


def check_table(rig: RigData, hw: Hardware, rows: list[Checked]) -> str:
    out = [f"the model against the rig ({rig.layers} layers, {rig.gpu}): bandwidth {hw.memory_gbps} GB/s (device copy), "
           f"rate {hw.tflops} TFLOPS and kernel floor {hw.layer_floor_us} us a layer (from its smallest and largest "
           f"uniform decode), context {rig.context}", "",
           "| kind | routing | T | batch x width | measured ms | predicted ms | error |", "|---|---|---|---|---|---|---|"]
    for c in sorted(rows, key=lambda c: (c.point.kind, c.point.routing, c.point.tokens)):
        p = c.point
        flag = "" if abs(c.error) <= TOLERANCE else " **over 20%**"
        out.append(f"| {p.kind} | {p.routing} | {p.tokens} | {p.batch} x {p.width} | {p.ms:.2f} | {c.predicted_ms:.2f} | "
                   f"{100 * c.error:+.1f}%{flag} |")
    worst = max(rows, key=lambda c: abs(c.error))
    out += ["", f"worst: {100 * worst.error:+.1f}% ({worst.point.kind} {worst.point.routing} T={worst.point.tokens}); "
                f"{sum(abs(c.error) <= TOLERANCE for c in rows)}/{len(rows)} within {TOLERANCE:.0%}"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=4096, help="tokens of context per request (KV read per step)")
    ap.add_argument("--bus-gbps", type=float, default=Hardware.bus_gbps, help="NCCL all-reduce bus bandwidth, GB/s")
    ap.add_argument("--allreduce-latency-us", type=float, default=Hardware.allreduce_latency_us)
    ap.add_argument("--batches", default="1,2,4,8,16,32,48")
    ap.add_argument("--json", action="store_true", help="print the costs as JSON rows instead of the table")
    ap.add_argument("--check", type=Path, help="a rig.json of bench/kimi_rank.py: the model against every row")
    args = ap.parse_args(argv)
    if args.check:
        try:
            rig = load_rig(args.check)
            shape = rig_shape(rig.layers)
            hw = calibrate(rig, shape)
        except ValueError as err:
            print(f"cost_model: {err}", file=sys.stderr)
            return 2
        rows = check(rig, hw, shape)
        print(check_table(rig, hw, rows))
        return 0 if all(abs(c.error) <= TOLERANCE for c in rows) else 1
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

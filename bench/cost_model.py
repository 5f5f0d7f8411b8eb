"""A cost model of one verify step of Kimi K2.6 at TP 8 on 8 x RTX PRO 6000 Blackwell over PCIe (issue 32, item 6),
checked against a measured curve: the test bed's timing rig of one TP-8 rank (issue 69, bench/kimi_rank.py).

    python -m bench.cost_model [--context 4096] [--bus-gbps 20] [--allreduce-latency-us 40] [--json]
    python -m bench.cost_model --check RIG.json     the model fitted on part of a rig and checked on the rest

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
measured. The bandwidth, the rate and the kernel floor are the calibration: on the rig the bandwidth is its device
copy and the rest is fitted on its uniform decode curve and its narrowest and widest verify widths (calibrate); for
the production host the rig's are carried over by the ratios in docs/cost-model.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


# The rig's calibration (H100 80GB HBM3, 2026-12-06, docs/data/h100-2026-12-06-kimi-rank-rig.json; `--check` prints
# it again): what the production defaults below carry over, each by a ratio named where it is used
RIG_COPY_SHARE = 3039.2 / 3350.0       # device copy / the H100 SXM's published 3,350 GB/s
RIG_EXPERT_EFFICIENCY = 0.83           # Marlin's routed-expert reads / the device copy bandwidth
RIG_RATE_SHARE = 342.7 / 989.0         # reached rate / the H100 SXM's dense bf16 peak
RIG_LAYER_FLOOR_US = 83.7              # a layer's kernels under a CUDA graph, whatever T
RIG_VERIFY_FIXED_MS, RIG_VERIFY_US_PER_TOKEN = 0.58, 10.32    # DDTREE's verify stage over a decode forward


@dataclass(frozen=True)
class Hardware:
    """What one rank reaches, and the bus between ranks. Defaults: one RTX PRO 6000 Blackwell Server Edition per rank,
    8 ranks over PCIe 5.0 (no NVLink), with the rig's H100 calibration carried over by the ratios above
    (docs/cost-model.md says why each ratio and what would replace it)."""
    name: str = "RTX PRO 6000 Blackwell x 8 (PCIe)"
    gpus: int = 8
    memory_gbps: float = round(1792.0 * RIG_COPY_SHARE, 1)   # GDDR7's published 1,792 GB/s x the rig's copy share
    expert_efficiency: float = RIG_EXPERT_EFFICIENCY          # share of memory_gbps Marlin reaches on routed experts
    tflops: float = round(250.0 * RIG_RATE_SHARE, 1)         # an estimated dense bf16 peak (250) x the rig's share
    layer_floor_us: float = RIG_LAYER_FLOOR_US                # the rig's (kernel count and launch chain alike)
    verify_fixed_ms: float = RIG_VERIFY_FIXED_MS              # a verify pass's own cost over a decode forward ...
    verify_us_per_token: float = RIG_VERIFY_US_PER_TOKEN      # ... fixed, and per verified token
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


def unrouted_params(shape: KimiShape, tp: int) -> float:
    """The bf16 weights one rank reads for any token: attention, the dense layer, the shared experts, the LM head."""
    return (shape.attention_params(tp) * shape.layers + shape.dense_params(tp) * shape.dense_layers
            + shape.shared_experts * shape.expert_params(tp) * shape.moe_layers + shape.head_params(tp))


def weight_bytes(tokens: int, shape: KimiShape, hw: Hardware, routing: str = "uniform",
                 measured: dict[int, float] | None = None) -> tuple[float, float]:
    """(bf16 bytes, routed INT4 expert bytes) one rank reads in a forward of `tokens` tokens."""
    tp = hw.gpus
    routed = (distinct_experts(tokens, shape, routing, measured) * shape.expert_params(tp)
              * shape.int4_bytes_per_param * shape.moe_layers)
    return 2 * unrouted_params(shape, tp), routed


def forward_flops(tokens: int, batch: int, context: int, shape: KimiShape, tp: int) -> float:
    per_token = unrouted_params(shape, tp) + shape.active_experts * shape.expert_params(tp) * shape.moe_layers
    attention = tokens * context * shape.attention_flops_per_context_token(tp) * shape.layers
    return 2 * tokens * per_token + attention


def allreduce_ms(tokens: int, shape: KimiShape, hw: Hardware) -> float:
    if not hw.allreduce or hw.gpus == 1:
        return 0.0
    message = tokens * shape.hidden * 2
    one = 2 * (hw.gpus - 1) / hw.gpus * message / (hw.bus_gbps * 1e9) * 1e3 + hw.allreduce_latency_us / 1e3
    return 2 * shape.layers * one


def forward_cost(tokens: int, batch: int, context: int, shape: KimiShape = KimiShape(), hw: Hardware = Hardware(),
                 routing: str = "uniform", measured: dict[int, float] | None = None, verify: bool = False) -> Forward:
    """One forward of `tokens` tokens for `batch` requests of `context` tokens each; verify: DDTREE's verify pass of
    width tokens / batch (its own fixed and per-token cost over a decode forward added to the floor)."""
    bf16, routed = weight_bytes(tokens, shape, hw, routing, measured)
    kv = batch * context * shape.kv_bytes_per_token() * shape.layers
    floor = shape.layers * hw.layer_floor_us / 1e3
    if verify:
        floor += hw.verify_fixed_ms + tokens * hw.verify_us_per_token / 1e3
    return Forward(tokens=tokens, batch=batch, experts=distinct_experts(tokens, shape, routing, measured),
                   weights_gb=(bf16 + routed) / 1e9, kv_gb=kv / 1e9,
                   memory_ms=((bf16 + kv) / hw.memory_gbps + routed / (hw.memory_gbps * hw.expert_efficiency)) / 1e6,
                   compute_ms=forward_flops(tokens, batch, context, shape, hw.gpus) / (hw.tflops * 1e12) * 1e3,
                   floor_ms=floor, allreduce_ms=allreduce_ms(tokens, shape, hw))


# Tokens per verify step (accepted + 1) by setting: "chain" is DFLASH's (block 8), an int a DDTREE budget (cap 8).
ACCEPTS = {
    # the decidable Kimi-shaped pair (MLA + MoE, block 8), greedy, as issue 69 quotes it: the default
    "kimi-pair": {"chain": 4.59, 8: 4.64, 32: 4.96, 64: 5.09},
    # the trained byte-level pair (docs/benchmarks.md "Full table", cap 8, batch 1): budgets only
    "test-bed": {8: 2.80, 16: 3.53, 32: 3.78, 64: 3.98},
    # Kimi-K2.5-DFlash's published chain on GSM8K (5.3) with the Kimi-shaped pair's tree gains over its chain
    "published": {"chain": 5.3, 8: 5.3 * 4.64 / 4.59, 32: 5.3 * 4.96 / 4.59, 64: 5.3 * 5.09 / 4.59},
}
DFLASH_BLOCK = 8              # the production draft's block: DFLASH verifies 8 tokens a request


@dataclass(frozen=True)
class Setting:
    """What one server runs: NONE (one token a request a step), DFLASH (its chain of DFLASH_BLOCK tokens), or DDTREE
    at a budget (budget + 1 tokens a request)."""
    name: str
    width: int                 # tokens a request sends through the target a step
    tokens_per_step: float     # tokens a request emits a step

    @property
    def speculative(self) -> bool:
        return self.name != "NONE"

    @property
    def budget(self) -> int | None:
        return int(self.name[1:]) if self.name.startswith("b") else None


def settings(accepts: dict) -> list[Setting]:
    out = [Setting("NONE", 1, 1.0)]
    if "chain" in accepts:
        out.append(Setting("DFLASH", DFLASH_BLOCK, accepts["chain"]))
    return out + [Setting(f"b{b}", b + 1, accepts[b]) for b in sorted(k for k in accepts if k != "chain")]


@dataclass(frozen=True)
class StepCost:
    batch: int
    setting: str
    tokens: int            # T, tokens through the target this step
    weights_gb: float      # per GPU
    kv_gb: float           # per GPU
    memory_ms: float       # reads and the kernel floor
    compute_ms: float
    allreduce_ms: float
    step_ms: float
    tokens_per_s: float


def step_cost(batch: int, setting: Setting, context: int, shape: KimiShape = KimiShape(),
              hw: Hardware = Hardware()) -> StepCost:
    """One step of `batch` requests at `context` tokens each."""
    tokens = batch * setting.width
    f = forward_cost(tokens, batch, context, shape, hw, verify=setting.speculative)
    step = f.ms + hw.host_overhead_ms
    return StepCost(batch, setting.name, tokens, f.weights_gb, f.kv_gb, f.memory_ms + f.floor_ms, f.compute_ms,
                    f.allreduce_ms, step, batch * setting.tokens_per_step / step * 1e3)


@dataclass
class Prediction:
    batches: list[int]
    settings: list[Setting]
    costs: dict[tuple[int, str], StepCost] = field(default_factory=dict)

    def best(self, batch: int) -> str:
        """The setting with the most tokens/s at this batch."""
        return max((s.name for s in self.settings), key=lambda n: self.costs[(batch, n)].tokens_per_s)

    def schedule(self) -> str:
        """`1:8,16:32,...` over the batches: DDTREE's best budget at each (where NONE or DFLASH is faster still, the
        budget that comes closest; wins() says where)."""
        trees = [s for s in self.settings if s.budget is not None]
        steps: list[tuple[int, int]] = []
        for i, batch in enumerate(self.batches):
            best = max(trees, key=lambda s: self.costs[(batch, s.name)].tokens_per_s).budget
            if not steps or steps[-1][1] != best:
                steps.append((1 if i == 0 else batch, best))
        return str(steps[0][1]) if len(steps) == 1 else ",".join(f"{b}:{v}" for b, v in steps)

    def wins(self, name: str) -> list[int]:
        return [b for b in self.batches if self.best(b) == name]


def predict(batches: list[int], accepts: dict, context: int, shape: KimiShape = KimiShape(),
            hw: Hardware = Hardware()) -> Prediction:
    out = Prediction(batches, settings(accepts))
    for batch in batches:
        for s in out.settings:
            out.costs[(batch, s.name)] = step_cost(batch, s, context, shape, hw)
    return out


def table(pred: Prediction) -> str:
    names = [s.name for s in pred.settings]
    head = ("| batch | " + " | ".join(names) + " | best | NONE step ms | " +
            " | ".join(f"{n} step ms (reads / all-reduce)" for n in names if n in ("DFLASH", "b32")) + " |")
    lines = [head, "|" + "---|" * (len(names) + 3 + sum(n in ("DFLASH", "b32") for n in names))]
    for batch in pred.batches:
        cells = [f"{pred.costs[(batch, n)].tokens_per_s:,.0f}" for n in names]
        splits = [f"{c.step_ms:.1f} ({c.memory_ms:.1f} / {c.allreduce_ms:.1f})"
                  for c in (pred.costs[(batch, n)] for n in names if n in ("DFLASH", "b32"))]
        lines.append(f"| {batch} | " + " | ".join(cells) + f" | {pred.best(batch)} | "
                     f"{pred.costs[(batch, 'NONE')].step_ms:.1f} | " + " | ".join(splits) + " |")
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


def rig_hardware(rig: RigData) -> Hardware:
    return Hardware(name=f"rig: {rig.gpu}", memory_gbps=rig.copy_gbps, expert_efficiency=1.0, tflops=1.0,
                    layer_floor_us=0.0, verify_fixed_ms=0.0, verify_us_per_token=0.0, allreduce=False)


def least_squares(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(a, b) minimising sum(((a + b x - r) / y)^2) over rows (x, r, y): a line fitted in relative error."""
    s00 = s01 = s11 = v0 = v1 = 0.0
    for x, r, y in rows:
        w = 1 / y ** 2
        s00, s01, s11, v0, v1 = s00 + w, s01 + w * x, s11 + w * x * x, v0 + w * r, v1 + w * x * r
    det = s00 * s11 - s01 * s01
    if abs(det) < 1e-30:
        raise ValueError("the rig's points cannot separate a fixed cost from a per-unit one: give points at more T")
    return (v0 * s11 - v1 * s01) / det, (s00 * v1 - s01 * v0) / det


def fit_forward(points: list[RigPoint], rig: RigData, shape: KimiShape) -> Hardware:
    """The forward's calibration on decode points: bandwidth = the device copy; for each share of it that routed expert
    reads reach (0.50 .. 1.00), the floor and the rate that fit the points best (a line in their relative error);
    the share whose fit is best."""
    base = rig_hardware(rig)
    best: tuple[float, Hardware] | None = None
    for share in (x / 100 for x in range(50, 101)):
        hw = replace(base, expert_efficiency=share)
        rows = []
        for p in points:
            f = forward_cost(p.tokens, p.batch, rig.context, shape, hw)
            rows.append((forward_flops(p.tokens, p.batch, rig.context, shape, hw.gpus) / 1e9, p.ms - f.memory_ms, p.ms))
        floor_ms, ms_per_gflop = least_squares(rows)
        if ms_per_gflop <= 0 or floor_ms <= 0:
            continue
        fitted = replace(hw, tflops=round(1 / ms_per_gflop, 1), layer_floor_us=round(1e3 * floor_ms / shape.layers, 1))
        sse = sum((forward_cost(p.tokens, p.batch, rig.context, shape, fitted).ms / p.ms - 1) ** 2 for p in points)
        if best is None or sse < best[0]:
            best = (sse, fitted)
    if best is None:
        raise ValueError("no bandwidth share from 0.50 to 1.00 gives the rig's decode curve a positive floor and rate: "
                         "the curve or the copy bandwidth is wrong")
    return best[1]


def fit_verify(points: list[RigPoint], rig: RigData, shape: KimiShape, hw: Hardware) -> Hardware:
    """A verify pass's own cost over a decode forward of its T tokens: fixed + per token, fitted (a line in relative
    error) on the verify points given."""
    rows = [(p.tokens, p.ms - forward_cost(p.tokens, p.batch, rig.context, shape, hw, p.routing).ms, p.ms)
            for p in points]
    fixed, per_token = least_squares(rows)
    return replace(hw, verify_fixed_ms=round(fixed, 2), verify_us_per_token=round(1e3 * per_token, 2))


@dataclass(frozen=True)
class Calibration:
    hw: Hardware
    fit: list[RigPoint]            # the points the constants were read from; every other point is a check


def calibrate(rig: RigData, shape: KimiShape) -> Calibration:
    """Fitted on the uniform decode curve (the forward) and on the uniform verify rows of the narrowest and the widest
    width (the verify pass's own cost); checked on everything else: the widths between, and round-robin routing."""
    decode = [p for p in rig.points if p.kind == "decode" and p.routing == "uniform"]
    if len(decode) < 4:
        raise ValueError(f"the rig's uniform decode curve has {len(decode)} points: the fit takes three constants, the "
                         "check needs more; run the rig's decode step at more T")
    hw = fit_forward(decode, rig, shape)
    verify = [p for p in rig.points if p.kind == "verify" and p.routing == "uniform"]
    if not verify:
        return Calibration(hw, decode)
    ends = (min(p.width for p in verify), max(p.width for p in verify))
    fit = [p for p in verify if p.width in ends]
    return Calibration(fit_verify(fit, rig, shape, hw) if len(fit) >= 2 else hw, decode + fit)


@dataclass(frozen=True)
class Checked:
    point: RigPoint
    predicted_ms: float
    fitted: bool

    @property
    def error(self) -> float:
        return self.predicted_ms / self.point.ms - 1


def check(rig: RigData, cal: Calibration, shape: KimiShape) -> list[Checked]:
    return [Checked(p, forward_cost(p.tokens, p.batch, rig.context, shape, cal.hw, p.routing,
                                    verify=p.kind == "verify").ms, p in cal.fit) for p in rig.points]


def check_table(rig: RigData, cal: Calibration, rows: list[Checked]) -> str:
    hw = cal.hw
    out = [f"the model against the rig ({rig.layers} layers, {rig.gpu}, context {rig.context}): bandwidth "
           f"{hw.memory_gbps} GB/s (its device copy), of which routed expert reads reach {hw.expert_efficiency:.2f}; "
           f"rate {hw.tflops} TFLOPS; kernel floor {hw.layer_floor_us} us a layer; a verify pass {hw.verify_fixed_ms} ms "
           f"+ {hw.verify_us_per_token} us a token over a decode forward", "",
           "| kind | routing | T | batch x width | measured ms | predicted ms | error | role |", "|---|---|---|---|---|---|---|---|"]
    for c in sorted(rows, key=lambda c: (c.point.kind, c.point.routing, c.point.width, c.point.tokens)):
        p = c.point
        flag = "" if abs(c.error) <= TOLERANCE else " **over 20%**"
        out.append(f"| {p.kind} | {p.routing} | {p.tokens} | {p.batch} x {p.width} | {p.ms:.2f} | {c.predicted_ms:.2f} | "
                   f"{100 * c.error:+.1f}%{flag} | {'fit' if c.fitted else 'check'} |")
    checks = [c for c in rows if not c.fitted] or rows
    worst = max(checks, key=lambda c: abs(c.error))
    out += ["", f"{sum(abs(c.error) <= TOLERANCE for c in rows)}/{len(rows)} within {TOLERANCE:.0%}; worst check "
                f"{100 * worst.error:+.1f}% ({worst.point.kind} {worst.point.routing} {worst.point.batch} x "
                f"{worst.point.width}); worst fit {100 * max((abs(c.error) for c in rows if c.fitted), default=0):.1f}%"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=4096, help="tokens of context per request (KV read per step)")
    ap.add_argument("--bus-gbps", type=float, default=Hardware.bus_gbps, help="NCCL all-reduce bus bandwidth, GB/s")
    ap.add_argument("--allreduce-latency-us", type=float, default=Hardware.allreduce_latency_us)
    ap.add_argument("--batches", default="1,2,4,8,16,32,48")
    ap.add_argument("--json", action="store_true", help="print the costs as JSON rows instead of the table")
    ap.add_argument("--accepts", choices=sorted(ACCEPTS), default="kimi-pair",
                    help="tokens per verify step by setting (see ACCEPTS)")
    ap.add_argument("--check", type=Path, help="a rig.json of bench/kimi_rank.py: the model against every row")
    args = ap.parse_args(argv)
    if args.check:
        try:
            rig = load_rig(args.check)
            shape = rig_shape(rig.layers)
            cal = calibrate(rig, shape)
        except ValueError as err:
            print(f"cost_model: {err}", file=sys.stderr)
            return 2
        rows = check(rig, cal, shape)
        print(check_table(rig, cal, rows))
        return 0 if all(abs(c.error) <= TOLERANCE for c in rows) else 1
    hw = Hardware(bus_gbps=args.bus_gbps, allreduce_latency_us=args.allreduce_latency_us)
    batches = [int(b) for b in args.batches.split(",")]
    pred = predict(batches, ACCEPTS[args.accepts], args.context, hw=hw)
    if args.json:
        print(json.dumps([asdict(c) for c in pred.costs.values()], indent=1))
        return 0
    print(f"Kimi K2.6, TP 8 over PCIe ({hw.name}): predicted tokens/s per host, context {args.context}, all-reduce bus "
          f"{hw.bus_gbps} GB/s + {hw.allreduce_latency_us} us, tokens per verify step: {args.accepts} "
          f"({', '.join(f'{k}: {v:.2f}' for k, v in ACCEPTS[args.accepts].items())})")
    print(table(pred))
    wins = {s.name: pred.wins(s.name) for s in pred.settings}
    print(f"\nDDTREE's best budget by running batch: {pred.schedule()}; first at each batch: "
          + "; ".join(f"{n} at {', '.join(map(str, b))}" for n, b in wins.items() if b))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a small byte-level target + DFlash drafts (block 8 and 16) on Python's standard library.

Run on the lent H200:  PYTHONPATH=src python3 -m training.train_pair --out DIR [--minutes 8]

Corpus: the .py files of the running Python's standard library (every machine has them), one
<bos> + bytes per file; the held-out split is by file (a seeded 5% of the files), never by byte
offset. Stages, each limited by its share of --minutes of wall time:
  target  TargetLM, next-byte cross-entropy on 512-byte windows (bf16 autocast, AdamW, warm-up
          then cosine decay over the stage's time);
  drafts  DFlashDraft per block size on the frozen target's hidden states: 16 anchors per window,
          each a block (root byte, then masks) that sees the context before its root; loss = mean
          cross-entropy over depths 1..L (--depth-decay D: position k weighted by exp(-(k - 1) / D), as DFlash
          weights a block's early positions up);
  distill (--distill F, optional) a share F of the drafts' batches comes from the target's own greedy
          continuations of training windows (first half the corpus, second half the target's argmax tokens,
          anchors in the second half): at temperature 0 a draft is accepted where it predicts the target's
          greedy tokens, not the corpus's, so this is what DFlash drafts are trained on (the target's answers);
  --target-from DIR (optional) loads DIR/target instead of training one: the whole budget goes to the drafts,
          and a draft of the same configuration in DIR/draft is trained on from its weights (a warm start).
  accept  with --train-prompts, each draft's accept length counted offline (ddtree.reference.offline) on the
          target's greedy answers to the speed sweep's 1-request prompts (bench/sglang_speed.py's mixed set):
          DFLASH's chain and DDTREE b32 / b64 c8. On 2026-12-05's redrafted pair (float32 on the CPU) it came
          within 0.05 of what SGLang's server reported for the same prompts (H100, bf16: chain 3.82 / 3.83, b32
          4.80 / 4.81, b64 5.03 / 5.08): a draft's check without staging SGLang.
Writes DIR/b8 and DIR/b16 (each a pair directory load_pair reads: target/ + draft/),
DIR/heldout_prompts.json (prompts cut from held-out files at line starts) and DIR/train.json
(configuration, losses, held-out losses, per-depth draft top-1 accuracy, offline accept lengths); prints them.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import math
import random
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from ddtree.reference.config import DraftConfig, TargetConfig, load_config
from ddtree.reference.draft import DFlashDraft
from ddtree.reference.pair import Pair, load_draft, load_target, save_model, save_pair
from ddtree.reference.target import TargetLM
from ddtree.reference.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


@dataclass
class Corpus:
    train: torch.Tensor          # int64 [n] the training files, each <bos> + bytes, concatenated
    heldout: torch.Tensor        # int64 [m] the held-out files, likewise
    heldout_files: list[str]
    train_files: int


@dataclass
class Texts:
    """The raw bytes of the files, per split: prompts are cut from them."""

    heldout: list[bytes]
    train: list[bytes]


def load_corpus(seed: int, heldout_share: float = 0.05) -> tuple[Corpus, Texts]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    rng = random.Random(seed)
    held = set(rng.sample(range(len(files)), max(1, int(len(files) * heldout_share))))
    train, heldout, held_names, held_texts, train_texts = [], [], [], [], []
    bos = np.array([TOK.bos_token_id], dtype=np.int16)
    for i, path in enumerate(files):
        data = path.read_bytes()
        ids = np.concatenate([bos, np.frombuffer(data, dtype=np.uint8).astype(np.int16)])
        if i in held:
            heldout.append(ids)
            held_names.append(str(path.relative_to(root)))
            held_texts.append(data)
        else:
            train.append(ids)
            train_texts.append(data)
    corpus = Corpus(torch.from_numpy(np.concatenate(train)).long(), torch.from_numpy(np.concatenate(heldout)).long(),
                    held_names, len(files) - len(held))
    return corpus, Texts(held_texts, train_texts)


# Model sizes: "h200" (~25M target, minutes on the H200) and "small" (~5M target: a 1-2 minute GPU run
# for the SGLang test bed, or a long CPU run). The draft reads target layers below the last one: SGLang captures a
# layer's output as the input of the next layer, so the last layer cannot feed a DFlash draft there.
SIZES = {
    "h200": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=64, target_layer_ids=[1, 4, 6], draft_layers=2),
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, target_layer_ids=[1, 3, 4], draft_layers=2),
    # Kimi K2.6's shapes scaled down (issue 31): its text model's MLA at its own latent widths (SGLang's
    # Triton MLA decode kernel is built for kv_lora_rank 512 + rope 64), YaRN factor 64 over 4,096, one dense
    # layer then MoE (8 routed experts, top 2, one shared, noaux_tc); the draft keeps z-lab's Kimi DFlash
    # layout in proportion (8 : 1 query : KV heads, six target layers below the last one)
    "kimi": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=4, head_dim=192, target_layer_ids=[0, 1, 2, 3, 5, 6], draft_layers=2,
                 target_extra=dict(q_lora_rank=192, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                   v_head_dim=128, rope_theta=50000.0, n_routed_experts=8, num_experts_per_tok=2,
                                   n_shared_experts=1, moe_intermediate_size=256, first_k_dense_replace=1,
                                   routed_scaling_factor=2.827,
                                   rope_scaling={"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                                                 "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0,
                                                 "mscale_all_dim": 1.0}),
                 draft_extra=dict(num_attention_heads=8, num_key_value_heads=1, head_dim=32)),
}
# Kimi-shaped pairs on which temperature-0 identity is decidable (issue 44): MLA with dense MLPs in every layer, and
# MoE whose routing cannot flip (every routed expert active for every token: no top-k choice for bf16 to tip)
SIZES["kimi-dense"] = {**SIZES["kimi"], "target_extra": {**SIZES["kimi"]["target_extra"], "first_k_dense_replace": 8}}
SIZES["kimi-allexp"] = {**SIZES["kimi"], "target_extra": {**SIZES["kimi"]["target_extra"], "num_experts_per_tok": 8}}
# GPU device time is the scarce budget (30 minutes a session): a whole pair fits one 10-minute call; a draft trained
# on (--target-from) runs in the background and may take half the session
MAX_MINUTES = {"cuda": 8.0, "cuda-draft": 15.0, "cpu": 90.0}


def configs(block_size: int, size: str = "h200") -> tuple[TargetConfig, DraftConfig]:
    s = dict(SIZES[size])
    layer_ids, draft_layers = s.pop("target_layer_ids"), s.pop("draft_layers")
    target_extra, draft_extra = s.pop("target_extra", {}), s.pop("draft_extra", {})
    target = TargetConfig(**{**s, **target_extra}, max_position_embeddings=2048)
    s.pop("num_hidden_layers")
    draft = DraftConfig(**{**s, **draft_extra}, num_hidden_layers=draft_layers, block_size=block_size,
                        target_layer_ids=layer_ids, mask_token_id=TOK.mask_token_id)
    return target, draft


def windows(data: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """batch random windows [batch, length] of the stream (on data's device)."""
    start = torch.randint(0, data.numel() - length, (batch,), generator=gen)
    return data[(start[:, None] + torch.arange(length)).to(data.device)]


def lr_at(step_fraction: float, peak: float, warmup: float = 0.03) -> float:
    if step_fraction < warmup:
        return peak * step_fraction / warmup
    progress = (step_fraction - warmup) / (1 - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def target_loss(target: TargetLM, x: torch.Tensor) -> torch.Tensor:
    logits = target.forward_sequence(x[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def depth_weights(depth: int, decay: float, device=None) -> torch.Tensor:
    """[depth] loss weights of block positions 1..depth, mean 1: uniform for decay 0, else exp(-(k - 1) / decay),
    DFlash's reweighting toward a block's early positions (a drafted token counts only when every earlier one in its
    block was accepted)."""
    k = torch.arange(depth, dtype=torch.float32, device=device)
    w = torch.ones_like(k) if decay == 0 else torch.exp(-k / decay)
    return w * depth / w.sum()


def draft_loss(target: TargetLM, draft: DFlashDraft, x: torch.Tensor, anchors_per_seq: int,
               gen: torch.Generator, low: int = 1, decay: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over depths, weighted by depth_weights(decay) (decay 0: the plain mean); also the per-depth
    top-1 accuracy [L]. Anchors (block roots) at positions low .. t - depth - 1 (a distilled window's second half:
    every label a target's greedy token)."""
    bs, t = x.shape
    depth = draft.config.block_size - 1
    with torch.no_grad():
        hidden = target.forward_sequence(x, capture=tuple(draft.config.target_layer_ids)).hidden
    anchors = torch.randint(low, t - depth, (bs, anchors_per_seq), generator=gen).to(x.device)   # [bs, K]
    logits = draft.block_logits(hidden, x, anchors)                                          # [bs, K, L, V]
    labels = x.gather(1, (anchors[:, :, None] + torch.arange(1, depth + 1, device=x.device)).reshape(bs, -1))
    labels = labels.view(bs, anchors_per_seq, depth)
    each = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    loss = (each.view(bs, anchors_per_seq, depth) * depth_weights(depth, decay, x.device)).mean()
    accuracy = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))                       # [L]
    return loss, accuracy


@dataclass
class TrainRun:
    losses: list[float]      # every log_every-th step's loss
    steps: int               # optimiser steps taken in the stage's time


def train(model, params, loss_fn, seconds: float, peak_lr: float, log_every: int, name: str,
          tick: Callable[[TrainRun], None] | None = None, tick_every: float = 0.0) -> TrainRun:
    """AdamW for `seconds` of wall time; `tick` (a snapshot) is called with the run so far every `tick_every`
    seconds and once at the end."""
    opt = torch.optim.AdamW(params, lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    start, losses, step, ticked = time.perf_counter(), [], 0, 0.0
    while (elapsed := time.perf_counter() - start) < seconds:
        for group in opt.param_groups:
            group["lr"] = lr_at(elapsed / seconds, peak_lr)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):
            loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % log_every == 0:
            losses.append(float(loss))
            print(f"{name} step {step:5d} {elapsed:6.1f}s loss {losses[-1]:.4f}", flush=True)
        if tick is not None and elapsed - ticked >= tick_every:
            tick(TrainRun(list(losses), step))
            ticked = elapsed
    print(f"{name}: {step} steps in {time.perf_counter() - start:.0f}s", flush=True)
    if tick is not None:
        tick(TrainRun(list(losses), step))
    return TrainRun(losses, step)


@dataclass
class Snapshots:
    """A draft's weights so far, written every `every` seconds of its training (and at its end) to
    dir/s<block>-<steps>/pair/b<block>/draft (bf16: one carried part) beside pair/train.json (the report so far, the
    draft's entry marked "snapshot"), and dir/current swapped to it (a symlink replaced in one rename; the two newest
    kept, so a packer reading the older one still finds it): a machine taken back mid-training leaves what was
    trained so far to bring back (speed_sweep.sh snapshot), put over the pair (put_draft.sh) and trained on."""

    dir: Path
    every: float              # seconds

    def write(self, draft: DFlashDraft, report: dict, block: int, run: TrainRun, seconds: float) -> Path:
        d = self.dir / f"s{block}-{run.steps:06d}"
        save_model(draft, TOK, d / "pair" / f"b{block}" / "draft", dtype=torch.bfloat16)
        snap = json.loads(json.dumps(report))
        snap["drafts"][f"b{block}"] = {"config": asdict(draft.config), "losses": run.losses, "steps": run.steps,
                                       "snapshot": {"seconds": round(seconds, 1), "dtype": "bfloat16"}}
        (d / "pair" / "train.json").write_text(json.dumps(snap, indent=1))
        link = self.dir / "current.new"
        link.unlink(missing_ok=True)
        link.symlink_to(d.name)
        link.replace(self.dir / "current")
        for old in sorted(self.dir.glob(f"s{block}-*"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        return d

    def tick(self, draft: DFlashDraft, report: dict, block: int) -> Callable[[TrainRun], None]:
        began = time.perf_counter()
        return lambda run: self.write(draft, report, block, run, time.perf_counter() - began)


@torch.no_grad()
def greedy_windows(target: TargetLM, data: torch.Tensor, count: int, length: int, gen: torch.Generator,
                   chunk: int = 512) -> torch.Tensor:
    """`count` windows of `length` tokens: the first half a training window, the second half the target's greedy
    continuation of it (TargetLM.greedy_continue: argmax with a KV cache) -> int64 [count, length] on data's
    device."""
    half = length // 2
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=data.device.type == "cuda"):
        rows = [target.greedy_continue(windows(data, min(chunk, count - start), half, gen), length - half)
                for start in range(0, count, chunk)]                                        # [c, length] each
    return torch.cat(rows)


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cached_greedy_windows(target: TargetLM, data: torch.Tensor, count: int, length: int, gen: torch.Generator,
                          cache: Path, target_file: Path) -> torch.Tensor:
    """greedy_windows through a file: read from `cache` when it was made from the same target weights (target_file's
    sha256) with as many windows of this length, else generated and written there. An exclusive lock on cache.lock
    lets trainings started side by side on one target generate them once (the others wait, then read). int64
    [count, length] on data's device."""
    digest = file_digest(target_file)
    with open(f"{cache}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if Path(cache).exists():
            with safe_open(str(cache), "pt") as f:
                made_from = f.metadata().get("target_sha256")
                kept = f.get_tensor("windows")                                        # int16 [N, length]
            if made_from != digest or kept.shape[1] != length or kept.shape[0] < count:
                raise SystemExit(f"--distill-cache {cache} is invalid here: it holds {kept.shape[0]} windows of "
                                 f"{kept.shape[1]} tokens from target {made_from}, asked {count} of {length} from "
                                 f"target {digest} ({target_file}); remove it or give another file")
            print(f"distill: {count} greedy continuations read from {cache}", flush=True)
            return kept[:count].to(device=data.device, dtype=torch.int64)
        made = greedy_windows(target, data, count, length, gen)                                # [count, length]
        partial = Path(f"{cache}.partial")
        save_file({"windows": made.to(torch.int16).cpu()}, str(partial), metadata={"target_sha256": digest})
        partial.replace(cache)
        return made


@dataclass
class OfflineAccept:
    """One tree's accept length on the target's greedy continuations of the speed sweep's 1-request prompts, counted
    offline (ddtree.reference.offline): SGLang's spec_accept_length at temperature 0 (completion tokens / verify
    steps, per request, then the mean) on the same prompts should come out close to it."""

    tree: str                 # "chain b7 c1", "b32 c8"
    accept_length: float      # mean over the prompts
    seen: float               # the prompts cut from training files
    heldout: float            # the held-out ones


ACCEPT_BUDGETS = (32, 64)    # the DDTREE trees (cap 8) a training judges its draft by: the sweep's widest


def accept_trees(block: int, budgets: tuple[int, ...] = ACCEPT_BUDGETS) -> list[tuple[int, int]]:
    """(budget, cap) of DFLASH's chain and the DDTREE trees of these budgets (cap 8)."""
    return [(block - 1, 1)] + [(b, 8) for b in budgets]


@torch.no_grad()
def offline_accepts(pair: Pair, prompts: list[list[int]], new_tokens: int,
                    budgets: tuple[int, ...] = ACCEPT_BUDGETS) -> list[OfflineAccept]:
    """prompts: sglang_speed.mixed_prompts's order (even index a training-file prompt, odd a held-out one); budgets:
    the DDTREE trees (cap 8) counted beside DFLASH's chain."""
    from ddtree.reference.offline import offline_accept_lengths

    dev = pair.target.lm_head.weight.device
    depth = pair.block_size - 1
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        answers = [pair.target.greedy_continue(torch.tensor([p], device=dev), new_tokens + depth + 1)[0, len(p):]
                   .tolist() for p in prompts]
        found = []
        for budget, cap in accept_trees(pair.block_size, budgets):
            # SGLang's prefill gives the first token; verify steps, rooted at it, emit the other new_tokens - 1
            per = [new_tokens / len(offline_accept_lengths(pair, p + a[:1], a[1:], budget=budget, topk_cap=cap,
                                                           max_new_tokens=new_tokens - 1))
                   for p, a in zip(prompts, answers)]
            name = f"chain b{budget} c1" if cap == 1 else f"b{budget} c{cap}"
            found.append(OfflineAccept(name, sum(per) / len(per), sum(per[0::2]) / len(per[0::2]),
                                       sum(per[1::2]) / max(len(per[1::2]), 1)))
    return found


def accepts_line(found: list[OfflineAccept]) -> str:
    """'chain b7 c1 3.82 (3.90 / 3.74); b32 c8 ...': each tree's accept length (training-file / held-out prompts)."""
    return "; ".join(f"{a.tree} {a.accept_length:.2f} ({a.seen:.2f} / {a.heldout:.2f})" for a in found)


def start_draft(cfg: DraftConfig, target: TargetLM, target_from: str | None,
                dev: torch.device) -> tuple[DFlashDraft, str | None]:
    """A new draft, or the one beside --target-from's target when its configuration is `cfg` (trained on from its
    weights), and where it started (None: new)."""
    kept = Path(target_from) / "draft" if target_from else None
    if kept is not None and (kept / "config.json").is_file():
        if asdict(load_config(kept / "config.json", DraftConfig)) == asdict(cfg):
            print(f"draft b{cfg.block_size}: trained on from {kept}", flush=True)
            return load_draft(kept, target, device=dev).train(), str(kept)
        print(f"draft b{cfg.block_size}: {kept} has another configuration, a new draft is trained", flush=True)
    return DFlashDraft(cfg, target.config.hidden_size, target.embed_tokens, target.lm_head).to(dev), None


def pick_rows(data: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    """`batch` random rows of a [N, T] tensor."""
    return data[torch.randint(0, data.shape[0], (batch,), generator=gen).to(data.device)]


@torch.no_grad()
def evaluate(fn, batches: int) -> float:
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):
        return sum(float(fn()) for _ in range(batches)) / batches


def heldout_prompts(texts: list[bytes], count: int, length: int, seed: int) -> list[list[int]]:
    """Prompts of about `length` bytes that start at a line start inside the given files (held-out ones, or
    training ones for --train-prompts)."""
    rng = random.Random(seed)
    usable = [t for t in texts if len(t) > 4 * length]
    prompts = []
    while len(prompts) < count:
        text = rng.choice(usable)
        at = text.rfind(b"\n", 0, rng.randrange(0, len(text) - 2 * length)) + 1
        prompts.append([TOK.bos_token_id] + list(text[at: at + length]))
    return prompts


def speed_prompts(heldout: list[list[int]], seen: list[list[int]], count: int) -> list[list[int]]:
    """The speed sweep's first `count` prompts (sglang_speed.mixed_prompts); none without both kinds."""
    if not (heldout and seen and count):
        return []
    from bench.sglang_speed import mixed_prompts

    return mixed_prompts(heldout, seen, count)


def arguments(argv=None) -> argparse.Namespace:
    """The command line, each value checked against the others (argparse's error names the flag and the value)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (DIR/b8, DIR/b16, ...)")
    ap.add_argument("--minutes", type=float, default=8.0,
                    help="wall-time budget of all training (at most 8 on a GPU, 90 on the CPU)")
    ap.add_argument("--size", choices=sorted(SIZES), default="h200", help="model sizes (see SIZES)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--block-sizes", default="8,16")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--train-prompts", type=int, default=0,
                    help="also write DIR/train_prompts.json: this many prompts cut from training files (text the "
                         "pair has seen, on which a draft accepts more - a speed benchmark's high-acceptance share)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--distill", type=float, default=0.0,
                    help="share of the drafts' batches drawn from the target's greedy continuations (0..1)")
    ap.add_argument("--distill-windows", type=int, default=8192,
                    help="how many greedy continuations to generate (--seq tokens each, half of them greedy)")
    ap.add_argument("--target-from", help="a pair folder whose target/ is loaded instead of training one")
    ap.add_argument("--depth-decay", type=float, default=0.0,
                    help="weight the drafts' loss at block position k by exp(-(k - 1) / DECAY) (0: every position "
                         "alike; held-out losses stay unweighted)")
    ap.add_argument("--accept-prompts", type=int, default=24,
                    help="with --train-prompts: each draft's offline accept length on the speed sweep's first this "
                         "many prompts (its 1-request row's set; 0: none)")
    ap.add_argument("--accept-tokens", type=int, default=192, help="new tokens per prompt of that count")
    ap.add_argument("--snapshot-every", type=float, default=0.0,
                    help="seconds between snapshots of each draft's weights so far in --snapshot-dir (0: none)")
    ap.add_argument("--snapshot-dir", help="where the snapshots go (see Snapshots); needed with --snapshot-every")
    ap.add_argument("--distill-cache",
                    help="with --target-from: read the greedy continuations from this file, or write them there (one "
                         "generation for trainings side by side on one target)")
    args = ap.parse_args(argv)
    kind = ("cuda-draft" if args.target_from else "cuda") if args.device.startswith("cuda") else "cpu"
    if not 0 < args.minutes <= MAX_MINUTES[kind]:
        ap.error(f"--minutes {args.minutes} is invalid: expected 0 < minutes <= {MAX_MINUTES[kind]:g} on "
                 f"{args.device}{' for a draft trained on (--target-from)' if args.target_from else ''}")
    if args.depth_decay < 0:
        ap.error(f"--depth-decay {args.depth_decay} is invalid: expected 0 (no weighting) or a positive decay length "
                 "in block positions, e.g. 4")
    if not 0 <= args.distill <= 1:
        ap.error(f"--distill {args.distill} is invalid: expected a share 0..1 of the drafts' batches")
    if args.target_from and not (Path(args.target_from) / "target" / "config.json").is_file():
        ap.error(f"--target-from {args.target_from} is invalid: it has no target/config.json (give a pair folder "
                 "train_pair.py wrote, e.g. DIR/b8)")
    if args.accept_prompts < 0 or args.accept_tokens < 2:
        ap.error(f"--accept-prompts {args.accept_prompts} / --accept-tokens {args.accept_tokens} is invalid: expected "
                 "0 or more prompts and at least 2 tokens")
    if args.snapshot_every < 0 or (args.snapshot_every > 0) != bool(args.snapshot_dir):
        ap.error(f"--snapshot-every {args.snapshot_every} with --snapshot-dir {args.snapshot_dir} is invalid: give "
                 "both (seconds > 0 and a folder) or neither")
    if args.distill_cache and not args.target_from:
        ap.error(f"--distill-cache {args.distill_cache} is invalid without --target-from: a target trained here "
                 "is new, so no cache can hold its continuations")
    return args


@dataclass
class Training:
    """What a run's stages share: the arguments, the data on the device [bytes], the target, the report, the time
    budget (seconds) and the drafts' share of it, the greedy continuations of the distillation."""

    args: argparse.Namespace
    dev: torch.device
    gen: torch.Generator
    texts: object                    # the corpus's texts (training and held-out), for the prompts
    train_data: torch.Tensor         # uint8 [train bytes]
    held_data: torch.Tensor          # uint8 [held-out bytes]
    target: TargetLM
    report: dict
    budget: float                    # seconds of training
    draft_share: float               # the drafts' share of the budget (1 with --target-from)
    distilled: torch.Tensor | None = None     # [N, seq] greedy continuations
    held_greedy: torch.Tensor | None = None   # [32, seq] the same on held-out text


def prepare(args: argparse.Namespace) -> Training:
    """Seeds, the corpus on the device, the target (loaded with --target-from, else new) and the report's head."""
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    corpus, texts = load_corpus(args.seed)
    dev = torch.device(args.device)
    train_data, held_data = corpus.train.to(dev), corpus.heldout.to(dev)
    print(f"corpus: {corpus.train_files} training files ({train_data.numel() / 1e6:.1f} MB), "
          f"{len(corpus.heldout_files)} held-out files ({held_data.numel() / 1e6:.2f} MB)", flush=True)
    target_cfg, _ = configs(block_sizes(args)[0], args.size)
    if args.target_from:
        target = load_target(Path(args.target_from) / "target", device=dev)[0]
        if asdict(target.config) != asdict(target_cfg):
            raise SystemExit(f"--target-from {args.target_from} is invalid with --size {args.size}: its target's "
                             f"config.json differs from that size's target ({asdict(target.config)} against "
                             f"{asdict(target_cfg)}); give the size it was trained with")
    else:
        target = TargetLM(target_cfg).to(dev)
    report = {"seed": args.seed, "minutes": args.minutes, "size": args.size, "device": str(dev), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
              "target_config": asdict(target_cfg), "heldout_files": corpus.heldout_files,
              "train_files": corpus.train_files, "drafts": {}, "target_from": args.target_from,
              "distill": args.distill, "depth_decay": args.depth_decay, "batch": args.batch}
    return Training(args, dev, gen, texts, train_data, held_data, target, report, args.minutes * 60,
                    1.0 if args.target_from else 0.45)


def block_sizes(args: argparse.Namespace) -> list[int]:
    return [int(b) for b in args.block_sizes.split(",")]


def train_target(t: Training) -> None:
    """The target's share of the budget (nothing with --target-from); the target frozen afterwards."""
    args = t.args
    if not args.target_from:
        t.report["target_losses"] = train(
            t.target, list(t.target.parameters()),
            lambda: target_loss(t.target, windows(t.train_data, args.batch, args.seq + 1, t.gen)),
            0.55 * t.budget, 1.5e-3, 100, "target").losses
    t.target.eval().requires_grad_(False)


def distill(t: Training) -> None:
    """With --distill: the target's greedy continuations (from --distill-cache when it holds them); the drafts pay
    for the time they take."""
    args = t.args
    if args.distill <= 0:
        return
    began = time.perf_counter()
    if args.distill_cache:
        t.distilled = cached_greedy_windows(t.target, t.train_data, args.distill_windows, args.seq, t.gen,
                                            Path(args.distill_cache),
                                            Path(args.target_from) / "target" / "model.safetensors")  # [N, seq]
    else:
        t.distilled = greedy_windows(t.target, t.train_data, args.distill_windows, args.seq, t.gen)    # [N, seq]
    spent = time.perf_counter() - began
    t.budget = max(t.budget * t.draft_share - spent, 1.0) / t.draft_share
    t.report["distill_windows"], t.report["distill_seconds"] = int(t.distilled.shape[0]), round(spent, 1)
    print(f"distill: {t.distilled.shape[0]} greedy continuations of {args.seq // 2} tokens in {spent:.0f}s",
          flush=True)
    t.held_greedy = greedy_windows(t.target, t.held_data, 32, args.seq, t.gen)                  # [32, seq]


def target_heldout(t: Training) -> None:
    args = t.args
    t.report["target_heldout_loss"] = evaluate(
        lambda: target_loss(t.target, windows(t.held_data, args.batch, args.seq + 1, t.gen)), 20)
    print(f"target held-out loss {t.report['target_heldout_loss']:.4f} nats/byte", flush=True)


def train_draft(t: Training, block: int, n_blocks: int) -> Pair:
    """One block size's draft: trained on its share of the budget (snapshots as asked), its held-out loss and top-1
    by depth (and on the target's greedy continuations with --distill) in the report."""
    args, target, gen = t.args, t.target, t.gen
    _, draft_cfg = configs(block, args.size)
    draft, warm_from = start_draft(draft_cfg, target, args.target_from, t.dev)

    def step(data=t.train_data, d=draft):
        if t.distilled is not None and torch.rand((), generator=gen).item() < args.distill:
            return draft_loss(target, d, pick_rows(t.distilled, args.batch // 2, gen), 16, gen,
                              low=args.seq // 2 - 1, decay=args.depth_decay)[0]
        return draft_loss(target, d, windows(data, args.batch // 2, args.seq, gen), 16, gen,
                          decay=args.depth_decay)[0]

    snapshots = Snapshots(Path(args.snapshot_dir), args.snapshot_every) if args.snapshot_every else None
    run = train(draft, list(draft.parameters()), step, t.draft_share * t.budget / n_blocks, 2e-3, 100,
                f"draft b{block}", snapshots and snapshots.tick(draft, t.report, block),
                snapshots.every if snapshots else 0.0)
    draft.eval()
    autocast = dict(device_type="cuda", dtype=torch.bfloat16, enabled=t.dev.type == "cuda")
    with torch.no_grad(), torch.autocast(**autocast):
        results = [draft_loss(target, draft, windows(t.held_data, args.batch // 2, args.seq, gen), 16, gen)
                   for _ in range(10)]
    held_loss = sum(float(r[0]) for r in results) / len(results)
    accuracy = (sum(r[1] for r in results) / len(results)).tolist()
    t.report["drafts"][f"b{block}"] = {"config": asdict(draft_cfg), "warm_start": warm_from, "losses": run.losses,
                                       "steps": run.steps, "heldout_loss": held_loss,
                                       "heldout_top1_by_depth": accuracy}
    print(f"draft b{block} held-out loss {held_loss:.4f}; top-1 by depth "
          + " ".join(f"{a:.2f}" for a in accuracy), flush=True)
    if t.held_greedy is not None:          # what acceptance at temperature 0 follows: the target's own tokens
        with torch.no_grad(), torch.autocast(**autocast):
            greedy_acc = draft_loss(target, draft, t.held_greedy, 16, gen, low=args.seq // 2 - 1)[1].tolist()
        t.report["drafts"][f"b{block}"]["heldout_greedy_top1_by_depth"] = greedy_acc
        print(f"draft b{block} on the target's greedy continuations of held-out text: top-1 by depth "
              + " ".join(f"{a:.2f}" for a in greedy_acc), flush=True)
    return Pair(target=target, draft=draft, tokenizer=TOK)


def count_accepts(t: Training, pair: Pair, block: int, accept_on: list) -> None:
    """The draft's offline accept length on the speed sweep's 1-request prompts, into the report."""
    if not accept_on:
        return
    found = offline_accepts(pair, accept_on, t.args.accept_tokens)
    t.report["drafts"][f"b{block}"]["offline_accept"] = [asdict(a) for a in found]
    print(f"draft b{block} offline accept length on the speed sweep's {len(accept_on)} 1-request prompts x "
          f"{t.args.accept_tokens} tokens (training-file / held-out): {accepts_line(found)}", flush=True)


def main(argv=None) -> int:
    args = arguments(argv)
    t = prepare(args)
    train_target(t)
    distill(t)
    target_heldout(t)
    prompts = heldout_prompts(t.texts.heldout, args.prompts, 256, args.seed)
    seen = heldout_prompts(t.texts.train, args.train_prompts, 256, args.seed + 1) if args.train_prompts else []
    accept_on = speed_prompts(prompts, seen, args.accept_prompts)
    blocks = block_sizes(args)
    for block in blocks:
        pair = train_draft(t, block, len(blocks))
        count_accepts(t, pair, block, accept_on)
        save_pair(pair, Path(args.out) / f"b{block}")
    out = Path(args.out)
    (out / "heldout_prompts.json").write_text(json.dumps(prompts))
    if args.train_prompts:
        (out / "train_prompts.json").write_text(json.dumps(seen))
    (out / "train.json").write_text(json.dumps(t.report, indent=1))
    return 0

if __name__ == "__main__":
    sys.exit(main())

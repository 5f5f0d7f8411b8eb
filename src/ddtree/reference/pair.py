"""Save and load a target + draft pair: DIR/target, DIR/draft (config.json + model.safetensors each)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ddtree.reference.config import DraftConfig, TargetConfig, load_config
from ddtree.reference.draft import DFlashDraft
from ddtree.reference.target import TargetLM
from ddtree.reference.tokenizer import ByteTokenizer


@dataclass
class Pair:
    target: TargetLM
    draft: DFlashDraft
    tokenizer: ByteTokenizer

    @property
    def block_size(self) -> int:
        return self.draft.config.block_size


def init_pair(target_cfg: TargetConfig, draft_cfg: DraftConfig, seed: int, std: float = 0.02) -> Pair:
    """Deterministic random initialisation (normal with `std` for matrices; norms at 1)."""
    g = torch.Generator().manual_seed(seed)
    target = TargetLM(target_cfg)
    draft = DFlashDraft(draft_cfg, target_cfg.hidden_size, target.embed_tokens, target.lm_head)
    with torch.no_grad():
        for model in (target, draft):
            for name, p in sorted(model.named_parameters()):
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * std)
        target.embed_tokens.weight.mul_(1.0 / std)  # embeddings of unit scale, as in trained models
    return Pair(target=target, draft=draft, tokenizer=ByteTokenizer(vocab_size=target_cfg.vocab_size))


def save_model(model: torch.nn.Module, tokenizer: ByteTokenizer, d: Path, dtype: torch.dtype | None = None) -> None:
    """One model of a pair into folder d: config.json, model.safetensors (its own dtype, or `dtype`: bf16 halves a
    draft snapshot's bytes to carry; loading casts back to the model's dtype), tokenizer.json."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(model.config.to_json(), indent=2, sort_keys=True) + "\n")
    tensors = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(d / "tokenizer.json")


def save_pair(pair: Pair, out: Path) -> None:
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        save_model(model, pair.tokenizer, Path(out) / name)


def _load_weights(model: torch.nn.Module, path: Path) -> None:
    file = path / "model.safetensors"
    if not file.exists():
        raise FileNotFoundError(f"{file}: weights not found")
    state = load_file(str(file))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{file}: weights do not match config.json (missing {missing}, unexpected {unexpected})")


def load_target(path: Path, *, device="cpu", dtype=torch.float32) -> tuple[TargetLM, ByteTokenizer]:
    path = Path(path)
    model = TargetLM(load_config(path / "config.json", TargetConfig))
    _load_weights(model, path)
    tok_file = path / "tokenizer.json"
    tokenizer = ByteTokenizer.load(tok_file) if tok_file.exists() else ByteTokenizer()
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def load_draft(path: Path, target: TargetLM, *, device="cpu", dtype=torch.float32) -> DFlashDraft:
    path = Path(path)
    cfg = load_config(path / "config.json", DraftConfig)
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < target.config.num_hidden_layers]
    if bad:
        raise ValueError(f"{path}/config.json: target_layer_ids {bad} outside the target's "
                         f"{target.config.num_hidden_layers} layers")
    model = DFlashDraft(cfg, target.config.hidden_size, target.embed_tokens, target.lm_head)
    _load_weights(model, path)
    return model.to(device=device, dtype=dtype).eval()


def load_pair(path, *, device="cpu", dtype=torch.float32) -> Pair:
    """Load DIR/target and DIR/draft as written by `python -m ddtree.reference.init`."""
    path = Path(path)
    target, tokenizer = load_target(path / "target", device=device, dtype=dtype)
    draft = load_draft(path / "draft", target, device=device, dtype=dtype)
    return Pair(target=target, draft=draft, tokenizer=tokenizer)

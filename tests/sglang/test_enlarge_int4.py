"""The enlarged Kimi-shaped pair's INT4 form (ddtree.reference.enlarge, issue 69): its routed experts dequantize to the
small INT4 export's (zero-padded), the added ones to zero, and the written pair is sharded by layer under SGLang's
names. Runs in the SGLang contract venv (compressed-tensors is there)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="run in the SGLang contract venv (make test)")

from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32  # noqa: E402
from safetensors import safe_open  # noqa: E402

from ddtree.reference.enlarge import Enlargement, Int4Experts, pad, write_enlarged  # noqa: E402
from ddtree.reference.export import INT4_GROUP, int4_roundtrip  # noqa: E402
from ddtree.reference.pair import init_pair  # noqa: E402

from ..reference.conftest import kimi_shaped_configs  # noqa: E402

BIG = Enlargement(hidden=256, heads=8, q_lora=96, dense_inter=160, experts=20, vocab=300, extra_layers=2)


def small_pair():
    target_cfg, draft_cfg = kimi_shaped_configs()
    target_cfg.num_experts_per_tok, target_cfg.moe_intermediate_size = 8, 64      # INT4 groups of 32 along 64
    return init_pair(target_cfg, draft_cfg, seed=5, std=0.08)


def dequant(packs: dict, stem: str) -> torch.Tensor:
    shape = torch.Size(packs[stem + "weight_shape"].tolist())
    q = unpack_from_int32(packs[stem + "weight_packed"], 4, shape).float()
    return q * packs[stem + "weight_scale"].to(torch.bfloat16).float().repeat_interleave(INT4_GROUP, dim=1)


def test_int4_experts_dequantize_to_the_small_int4_pairs_and_the_added_ones_to_zero():
    experts = Int4Experts()
    w = torch.randn(40, 64) * 0.1
    real = experts.real("e.", pad(w, (40, 256)))
    torch.testing.assert_close(dequant(real, "e.")[:, :64], int4_roundtrip(w))
    assert torch.count_nonzero(dequant(real, "e.")[:, 64:]) == 0
    assert torch.count_nonzero(dequant(experts.zero("z.", (256, 64)), "z.")) == 0
    rand = experts.random("r.", (40, 256), 0.05, torch.Generator().manual_seed(0))
    assert rand["r.weight_packed"].shape == (40, 32) and 0.03 < dequant(rand, "r.").std() < 0.08
def test_the_written_pair_is_sharded_by_layer_under_sglangs_names(tmp_path):
    pair = small_pair()
    config = write_enlarged(pair, tmp_path, BIG, int4=True)
    assert (config["num_hidden_layers"], config["hidden_size"], config["n_routed_experts"]) == (6, 256, 20)
    assert config["quantization_config"]["format"] == "pack-quantized"
    index = json.loads((tmp_path / "target/model.safetensors.index.json").read_text())["weight_map"]
    assert index["lm_head.weight"] == "model-globals.safetensors"
    assert index["model.layers.5.mlp.experts.19.down_proj.weight_packed"] == "model-005.safetensors"
    assert "model.layers.0.mlp.gate_proj.weight" in index and "model.layers.0.mlp.experts.0.gate_proj.weight_packed" \
        not in index                                                  # layer 0 stays dense
    with safe_open(str(tmp_path / "target/model-001.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.1.mlp.shared_experts.gate_proj.weight").dtype == torch.bfloat16
        assert f.get_tensor("model.layers.1.mlp.experts.3.up_proj.weight_packed").dtype == torch.int32
    draft = json.loads((tmp_path / "draft/config.json").read_text())
    assert draft["hidden_size"] == 256 and draft["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    assert draft["num_target_layers"] == 6

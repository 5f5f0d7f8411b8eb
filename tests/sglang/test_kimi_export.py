"""The Kimi-shaped test pair's two export forms that the GPU test bed loads (issue 31), checked on the
CPU with the pinned stack: the INT4 routed experts (compressed-tensors W4A16, pack-quantized, group 32,
as Kimi K2.6 ships them) and the KimiK25 wrapper's text-only processor stand-in, read by SGLang 0.5.23's
own code. Runs in the SGLang contract venv (compressed-tensors, transformers and sglang are there)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="run in the SGLang contract venv (make test)")
pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from safetensors.torch import load_file  # noqa: E402

from ddtree.reference.config import DraftConfig, TargetConfig  # noqa: E402
from ddtree.reference.export import INT4_GROUP, export_pair, int4_roundtrip, main  # noqa: E402
from ddtree.reference.pair import init_pair, save_pair  # noqa: E402

from .test_reference_mla import kimi_shaped  # noqa: E402


@pytest.fixture(scope="module")
def kimi_pair():
    cfg = kimi_shaped(vocab_size=260, bos_token_id=256, eos_token_id=257, moe_intermediate_size=64)
    draft = DraftConfig(hidden_size=cfg.hidden_size, block_size=4, target_layer_ids=[0, 1], mask_token_id=258)
    return init_pair(cfg, draft, seed=7, std=0.05)


@pytest.fixture(scope="module")
def int4_export(kimi_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("int4")
    export_pair(kimi_pair, out, int4=True)
    return out / "target"


def routed_projections(pair) -> dict[str, torch.Tensor]:
    out = {}
    for i, layer in enumerate(pair.target.layers):
        for e, expert in enumerate(getattr(layer.mlp, "experts", [])):
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"model.layers.{i}.mlp.experts.{e}.{name}."] = getattr(expert, name).weight.detach()
    return out


def test_int4_experts_unpack_to_the_trained_weights_within_half_a_step(kimi_pair, int4_export):
    """Each routed projection is stored packed (8 INT4 values per int32 along the input) with one scale per
    32 inputs; the library's own unpacking gives values in -8..7 whose dequantized weight is within half a
    quantization step of the trained one; nothing else is quantized."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    tensors = load_file(str(int4_export / "model.safetensors"))
    expected = routed_projections(kimi_pair)
    assert expected
    for stem, weight in expected.items():
        assert stem + "weight" not in tensors
        packed, scale = tensors[stem + "weight_packed"], tensors[stem + "weight_scale"].float()
        out_f, in_f = weight.shape
        assert tensors[stem + "weight_shape"].tolist() == [out_f, in_f]
        assert packed.dtype == torch.int32 and packed.shape == (out_f, in_f // 8)
        assert scale.shape == (out_f, in_f // INT4_GROUP)
        q = unpack_from_int32(packed, 4, torch.Size([out_f, in_f])).float()
        assert q.min() >= -8 and q.max() <= 7 and q.abs().max() >= 7      # the range is used
        dequant = q * scale.repeat_interleave(INT4_GROUP, dim=1)
        step = scale.repeat_interleave(INT4_GROUP, dim=1)
        assert ((dequant - weight.float()).abs() <= 0.5 * step + 1e-3).all(), stem
        assert torch.equal(int4_roundtrip(weight), q * scale.repeat_interleave(INT4_GROUP, dim=1))
    kept = [k for k in tensors if "shared_experts" in k or "self_attn" in k or k.startswith("lm_head")]
    assert kept and all(tensors[k].dtype == torch.bfloat16 for k in kept)


def test_int4_config_is_kimis_and_read_by_sglang(int4_export):
    """The quantization_config SGLang reads: compressed-tensors, pack-quantized, symmetric INT4 groups of 32;
    SGLang's parser keeps attention, shared experts, dense MLPs and the LM head out of it, and the routed
    experts in."""
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from sglang.srt.layers.quantization.compressed_tensors.utils import should_ignore_layer

    qc = json.loads((int4_export / "config.json").read_text())["quantization_config"]
    weights = qc["config_groups"]["group_0"]["weights"]
    assert (qc["format"], weights["num_bits"], weights["group_size"], weights["symmetric"]) == \
        ("pack-quantized", 4, 32, True)
    parsed = CompressedTensorsConfig.from_config(qc)
    assert parsed.quant_format == "pack-quantized"
    for skipped in ("model.layers.1.self_attn.kv_a_proj_with_mqa", "model.layers.1.mlp.shared_experts.down_proj",
                    "model.layers.0.mlp.gate_proj", "lm_head"):
        assert should_ignore_layer(skipped, ignore=parsed.ignore), skipped
    assert not should_ignore_layer("model.layers.1.mlp.experts.3.down_proj", ignore=parsed.ignore)


def test_int4_export_is_refused_for_a_dense_target(tmp_path, capsys):
    pair = init_pair(TargetConfig(num_hidden_layers=3), DraftConfig(block_size=4, target_layer_ids=[0, 1]), seed=0)
    save_pair(pair, tmp_path / "pair")
    assert main(["--pair", str(tmp_path / "pair"), "--out", str(tmp_path / "out"), "--int4-experts"]) == 2
    assert "--int4-experts needs a target with routed experts" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_wrapper_loads_its_text_processor_through_sglangs_own_code(kimi_pair, tmp_path):
    """--kimi-wrapper writes the processor stand-in as remote code: SGLang's get_processor (what its
    tokenizer manager calls at start-up) returns it with --trust-remote-code, SGLang's KimiK25 multimodal
    processor is built from it, text tokenizes as the byte tokenizer, and an image is refused by name."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.multimodal_processor import get_mm_processor, import_processors
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_tokenizer
    from sglang.srt.utils.hf_transformers.processor import get_processor

    export_pair(kimi_pair, tmp_path)
    assert not (tmp_path / "target" / "processor_config.json").exists()    # DeepseekV3ForCausalLM needs none
    export_pair(kimi_pair, tmp_path, wrapper=True)
    target = str(tmp_path / "target")
    processor = get_processor(target, trust_remote_code=True, model_name=target)
    assert processor.tokenizer("ab")["input_ids"] == [256, 97, 98]
    with pytest.raises(ValueError, match="send text only"):
        processor("ab", images=[object()])
    server_args = ServerArgs(model_path=target, trust_remote_code=True, skip_tokenizer_init=True, device="cpu")
    set_global_server_args_for_tokenizer(server_args)
    model_config = ModelConfig.from_server_args(server_args)
    assert model_config.is_multimodal
    import_processors("sglang.srt.multimodal.processors")
    mm = get_mm_processor(model_config.hf_config, server_args, processor, "default", model_config=model_config)
    assert type(mm).__module__ == "sglang.srt.multimodal.processors.kimi_k25"
    assert mm.mm_tokens.image_token_id == kimi_pair.target.config.vocab_size - 1

"""What the start-up timing of the verify graphs (ddtree.sglang.policy.graph_timing, issue 70) reads of SGLang 0.5.23, held to
the pinned package (CPU, real SGLang): its graph keys, where its full CUDA-graph backend keeps the graphs, how it
replays one, and the runner fields the timing reads. The replay itself runs on the GPU (test_width_policy.py)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace as NS

import pytest

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.model_executor.runner import decode_cuda_graph_runner as runner_module  # noqa: E402
from sglang.srt.model_executor.runner.shape_key import ShapeKey  # noqa: E402
from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend  # noqa: E402

from ddtree.settings import DDTreeConfigError  # noqa: E402
from ddtree.sglang.policy.graph_timing import captured_graphs  # noqa: E402


def test_the_full_backend_keeps_its_graphs_by_shape_key_and_replays_one_by_its_key():
    init = inspect.getsource(FullCudaGraphBackend.__init__)
    assert "self._graphs" in init
    replay = inspect.signature(FullCudaGraphBackend.replay)
    assert list(replay.parameters)[:3] == ["self", "shape_key", "static_forward_batch"]
    assert "self._graphs[shape_key].replay()" in inspect.getsource(FullCudaGraphBackend.replay)
    assert {"size", "stream_idx", "variant_label", "attention_variant"} <= set(ShapeKey.__dataclass_fields__)


def test_the_runner_fields_the_timing_reads_exist():
    source = inspect.getsource(runner_module.DecodeCudaGraphRunner)
    for field in ("self.captured_req_width =", "self.ragged_verify_mode =", "self.backend =", "self.buffers.input_ids"):
        assert field in source, field
    assert callable(getattr(runner_module.DecodeCudaGraphRunner, "model_context", None))


def runner(keys, per_request=9, ragged=False):
    return NS(backend=NS(_graphs={k: object() for k in keys}), captured_req_width=per_request,
              ragged_verify_mode=ragged)


def test_the_default_graphs_are_found_by_running_batch():
    keys = [ShapeKey(size=s) for s in (8, 1, 4)] + [ShapeKey(size=2, variant_label="lora"),
                                                      ShapeKey(size=2, stream_idx=1)]
    found = captured_graphs(runner(keys))
    assert [(g.batch, g.tokens) for g in found] == [(1, 9), (4, 36), (8, 72)]
    ragged = captured_graphs(runner([ShapeKey(size=18), ShapeKey(size=72)], ragged=True))
    assert [(g.batch, g.tokens) for g in ragged] == [(2, 18), (8, 72)]       # a ragged key counts tokens


def test_a_backend_without_a_graph_table_is_refused_naming_the_way_out():
    with pytest.raises(DDTreeConfigError, match="SGLANG_DDTREE_COST_TABLE"):
        captured_graphs(NS(backend=NS(), captured_req_width=9))


def test_what_the_timing_tokens_read_of_the_target_exists():
    """worker_setup.timing_tokens: the target's get_input_embeddings() (DeepSeek-V3's, Qwen3's and Kimi K2.5's
    wrapper's), its weight, and the vocabulary shard's first id and count (VocabParallelEmbedding.shard_indices)."""
    import dataclasses

    from sglang.srt.layers.vocab_parallel_embedding import (
        VocabParallelEmbedding,
        VocabParallelEmbeddingShardIndices,
    )
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration
    from sglang.srt.models.qwen3 import Qwen3ForCausalLM

    for model in (DeepseekV3ForCausalLM, Qwen3ForCausalLM, KimiK25ForConditionalGeneration):
        assert callable(getattr(model, "get_input_embeddings", None)), model.__name__
    assert "self.shard_indices = " in inspect.getsource(VocabParallelEmbedding.__init__)
    fields = {f.name for f in dataclasses.fields(VocabParallelEmbeddingShardIndices)}
    assert "org_vocab_start_index" in fields and isinstance(VocabParallelEmbeddingShardIndices.num_org_elements,
                                                            property)

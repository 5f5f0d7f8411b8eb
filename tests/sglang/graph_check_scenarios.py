"""Run in a fresh SGLang process (tests/sglang/test_graph_check.py): load the plugins as SGLang does,
then replay-load batches into a DecodeCudaGraphRunner and build its capture inputs; print what each
scenario gave or raised, as JSON.

The runner is SGLang 0.5.23's real class with its real load_batch (hooked by the plugin) and its real
CudaGraphBufferRegistry built on the CPU; its __init__ needs a GPU model runner, so the few
attributes load_batch's check and get_spec_info read are set by hand (captured width 4, hidden 16, max
batch 8, a TritonAttnBackend made without its __init__: only its class name is read).
"""

from __future__ import annotations

import json
import sys
import types

import torch
from sglang.srt.plugins import load_plugins

load_plugins()

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402

from sglang.srt.model_executor.cuda_graph_buffer_registry import build_decode_registry  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

WIDTH, HIDDEN = 4, 16


def runner(algorithm="DFLASH", draft=True, token_count_slot=True):
    r = object.__new__(DecodeCudaGraphRunner)
    r.captured_req_width, r.ragged_verify_mode = WIDTH, False
    r.model_runner = types.SimpleNamespace(is_draft_worker=draft,
                                           spec_algorithm=SpeculativeAlgorithm.from_string(algorithm),
                                           attn_backend=object.__new__(TritonAttnBackend))
    r.buffers = types.SimpleNamespace(input_embeds=torch.zeros(8 * WIDTH, HIDDEN),
                                      custom_mask=torch.ones(64, dtype=torch.bool))
    r.buffer_registry = build_decode_registry(device=torch.device("cpu"), max_bs=8, max_num_token=8 * WIDTH,
                                              seq_len_fill_value=1, cache_loc_dtype=torch.int64, share_pool=False,
                                              enable_num_token_non_padded=token_count_slot)
    return r


def batch(bs=2, **change):
    n = bs * WIDTH
    fields = dict(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=torch.zeros(n, dtype=torch.int64),
                  req_pool_indices=torch.arange(bs), seq_lens=torch.arange(5, 5 + bs), out_cache_loc=torch.arange(n),
                  seq_lens_sum=int(torch.arange(5, 5 + bs).sum()), positions=torch.arange(n),
                  input_embeds=torch.zeros(n, HIDDEN), num_token_non_padded=torch.tensor(n, dtype=torch.int32))
    fields.update(change)
    return ForwardBatch(**fields)


def outcome(fn) -> str:
    try:
        fn()
    except Exception as e:          # the scenario's result, whatever it is
        return f"{type(e).__name__}: {e}"
    return "ok"


def main() -> None:
    from ddtree.sglang.diagnostics import graph_check

    hooked = hasattr(DecodeCudaGraphRunner.load_batch, "__wrapped__")
    # SGLang's own load_batch body cannot run on the CPU: through the hooked method a clean batch gets
    # past the check and then fails inside SGLang (AttributeError), a bad one fails in the check.
    results = {
        "hooked": hooked,
        "clean_draft": outcome(lambda: graph_check.before_load_batch(runner(), batch())),
        "clean_draft_through_sglang": outcome(lambda: runner().load_batch(batch())),
        "draft_without_embeds": outcome(lambda: runner().load_batch(batch(input_embeds=None))),
        "short_positions": outcome(lambda: runner().load_batch(batch(positions=torch.arange(7)))),
        "float_seq_lens": outcome(lambda: runner().load_batch(batch(seq_lens=torch.tensor([5.0, 6.0])))),
        "wide_embeds": outcome(lambda: runner().load_batch(batch(input_embeds=torch.zeros(8, HIDDEN + 1)))),
        "no_token_count": outcome(lambda: runner().load_batch(batch(num_token_non_padded=None))),
        "no_token_count_slot": outcome(
            lambda: graph_check.before_load_batch(runner(token_count_slot=False), batch(num_token_non_padded=None))),
        "target_without_embeds": outcome(
            lambda: graph_check.before_load_batch(runner(draft=False), batch(input_embeds=None))),
        "ddtree_target_missing_ids": outcome(
            lambda: runner("DDTREE", draft=False).load_batch(batch(input_ids=None))),
        "eagle_is_not_checked": outcome(
            lambda: graph_check.before_load_batch(runner("EAGLE"), batch(input_embeds=None))),
    }
    # first use per key: a clean batch is checked once; a field turning None later is a new key
    r, calls = runner(), []
    real = graph_check.check_graph_inputs
    graph_check.check_graph_inputs = lambda *a: (calls.append(1), real(*a))[1]
    for _ in range(3):
        graph_check.before_load_batch(r, batch())
    results["checks_for_three_clean_replays"] = len(calls)
    results["later_none_on_same_runner"] = outcome(lambda: graph_check.before_load_batch(r, batch(input_embeds=None)))
    # graph capture inputs (SGLang's own get_spec_info, plus the plugin's AFTER hook)
    for name, algorithm, draft in (("ddtree_target", "DDTREE", False), ("ddtree_draft", "DDTREE", True),
                                   ("dflash_target", "DFLASH", False)):
        r = runner(algorithm, draft=draft)
        spec = r.get_spec_info(WIDTH * 2)
        results[f"capture_{name}"] = {"type": type(spec).__name__, "width": spec.draft_token_num,
                                      "mask_is_the_runner_buffer": spec.custom_mask is r.buffers.custom_mask,
                                      "mask_is_none": spec.custom_mask is None}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

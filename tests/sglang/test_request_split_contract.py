"""What bench/sglang_e2e.request_split reads of SGLang 0.5.23's /generate meta_info, held to the pinned package (CPU,
real SGLang): the first-token latency its request time stats report beside the finished request's e2e_latency, both
from the same clock, so that e2e_latency - first_token_latency is the time after the first token."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.managers import tokenizer_manager  # noqa: E402
from sglang.srt.observability.req_time_stats import APIServerReqTimeStats  # noqa: E402

from bench import sglang_e2e as e2e  # noqa: E402


def test_a_finished_requests_meta_info_splits_into_first_token_and_decode_time():
    stats = APIServerReqTimeStats()
    stats.set_created_time(10.0)
    stats.set_first_token_time(10.25)
    stats.set_finished_time(11.25)
    meta = {"e2e_latency": stats.get_e2e_latency(), "spec_verify_ct": 4,
            **stats.convert_to_output_meta_info(None, completion_tokens=9)}
    assert meta["first_token_latency"] == pytest.approx(0.25)
    split = e2e.request_split([{"output_ids": list(range(9)), "meta_info": meta}], spec=True)
    assert split.first_token_ms == 250.0 and split.decode_step_ms == 250.0       # 1 s after the first token / 4 steps
    assert e2e.request_split([{"output_ids": list(range(9)), "meta_info": meta}], spec=False).decode_step_ms == 125.0


def test_the_tokenizer_manager_sends_both_latencies_of_a_finished_request_with_metrics_on():
    source = inspect.getsource(tokenizer_manager.TokenizerManager)
    assert 'meta_info["e2e_latency"] = state.time_stats.get_e2e_latency()' in source
    assert "convert_to_output_meta_info" in source and "if self.enable_metrics:" in source

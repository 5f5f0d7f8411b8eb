"""The GPU tests' own requests against SGLang 0.5.23's request checks, on the CPU (issue 45: on the H200 on
2026-12-03 the penalty test's min_new_tokens request was refused by SGLang itself - "min_new_tokens=100 is
unavailable when skip_tokenizer_init=True" - so the feature was never exercised). Every sampling dict the
penalty test sends passes SGLang's tokenizer check for the servers it is sent to; the same request to a server that
skips its tokenizer is refused (the check has teeth). The forced tool call the grammar test sends becomes, through
SGLang's own OpenAI handler with the grammar servers' command line, a structural tag that forces the named call with
the tool's schema - and lets the call's index be any number of digits, which explains why on the byte-level pairs
NONE and DDTREE alike wrote no finished call in 480 tokens (H200 2026-12-04)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.sampling.sampling_params import raise_if_tokenizer_required  # noqa: E402

from tests.gpu_sglang import test_grammars as grammars_test  # noqa: E402
from tests.gpu_sglang import test_requests as requests_test  # noqa: E402
from tests.sglang.test_client_requests import pair, verdicts  # noqa: E402,F401  (pair: a fixture)

from testbed import servers as harness


def check(name: str, sampling: dict) -> None:
    """SGLang's own refusal for a request on the configuration `name` (a tokenizer object when it loads one)."""
    tokenizer = object() if harness.config(name).tokenizer else None
    stop = sampling.get("stop")
    raise_if_tokenizer_required(tokenizer, [stop] if isinstance(stop, str) else stop, sampling.get("stop_regex"),
                                sampling.get("min_new_tokens", 0) or 0)


@pytest.mark.parametrize("penalty", [*requests_test.PENALTIES, "order-dependent"])
@pytest.mark.parametrize("server", requests_test.DETERMINISTIC)
def test_every_penalty_request_is_accepted_by_the_servers_it_is_sent_to(server, penalty):
    sampling = requests_test.PENALTIES.get(penalty, requests_test.ORDER_DEPENDENT)
    check(server, {**harness.greedy(), **sampling})


def test_the_same_request_to_a_server_without_its_tokenizer_is_refused():
    with pytest.raises(ValueError, match=r"min_new_tokens=\d+ is unavailable when skip_tokenizer_init"):
        check("ddtree-b32-c8-graphs-det-clp", {**harness.greedy(), **requests_test.PENALTIES["min_new_tokens"]})


@pytest.mark.parametrize("server", [grammars_test.NONE, grammars_test.DDTREE])
def test_the_forced_tool_call_is_constrained_to_the_named_call(pair, server):
    args = harness.config(server).args(Path(pair), 30000) + ["--device", "cpu"]
    body = {"model": "test-pair", **grammars_test.FORCED_TOOL_CALL}
    [seen] = verdicts(args, [{"path": "/v1/chat/completions", "body": body}])
    assert seen["refusal"] is None, seen["refusal"]
    tag = json.loads(seen["sampling_params"]["structural_tag"])["format"]["elements"]
    call = next(e for e in tag if e["type"] == "tag")
    assert call["begin"].endswith("functions.get_weather:"), call["begin"]
    index, _, arguments = call["content"]["elements"]
    assert arguments["json_schema"] == grammars_test.WEATHER["function"]["parameters"]
    assert index == {"type": "regex", "pattern": "\\d+"}      # unbounded: the byte pairs' digits run to the limit

"""The GPU tests' own requests against SGLang 0.5.23's request checks, on the CPU (issue 45: on the H200 on
2026-12-03 the penalty test's min_new_tokens request was refused by SGLang itself - "min_new_tokens=100 is
unavailable when skip_tokenizer_init=True" - so the feature was never exercised). Every sampling dict the
penalty test sends passes SGLang's tokenizer check for the servers it is sent to; the same request to a server that
skips its tokenizer is refused (the check has teeth)."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.sampling.sampling_params import raise_if_tokenizer_required  # noqa: E402

from tests.gpu_sglang import test_requests as requests_test  # noqa: E402
from tests.helpers import import_bench  # noqa: E402

harness = import_bench("sglang_servers")


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

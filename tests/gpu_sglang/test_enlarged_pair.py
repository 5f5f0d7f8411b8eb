"""The enlarged pair (ddtree.reference.enlarge, issue 69 item 3) inside SGLang on the GPU test bed: its plain decoding
gives the small pair's tokens, a parting allowed only at the small pair's own bf16 near tie (the strict rule of
test_ddtree_server.py). DDTREE on the enlarged pair is held to the same greedy tests as any pair: run
test_ddtree_server.py with SGLANG_DDTREE_PAIR = the enlarged pair and SGLANG_DDTREE_REF = the small reference pair (the
enlarged pair computes the small one's function, so the small pair is its referee): testbed/enlarged_pair.sh does both.

Needs, beside the fixtures of conftest.py, SGLANG_DDTREE_SMALL_PAIR: the small pair in SGLang's formats as the enlarged
one was made from (its INT4 export when the enlarged one has INT4 experts)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.gpu_sglang.test_ddtree_server import compare_with_plain, outputs, ready

from testbed import servers as harness
pytestmark = pytest.mark.sglang_gpu


@pytest.fixture(scope="module")
def small_plain():
    """NONE on the small pair, beside the fleet (100 ports below it)."""
    small = os.environ.get("SGLANG_DDTREE_SMALL_PAIR")
    if not small:
        pytest.skip("needs SGLANG_DDTREE_SMALL_PAIR (the small pair in SGLang's formats; testbed/enlarged_pair.sh)")
    port = int(os.environ.get("SGLANG_DDTREE_BASE_PORT", "31000")) - 100
    out = Path(os.environ.get("SGLANG_DDTREE_OUT", "/tmp/sglang-gpu"))
    server = harness.Server(harness.NONE, port, out / "logs" / "sglang-none-small.log")
    server.start(Path(small))
    try:
        if not server.wait_ready(900):
            pytest.fail(f"NONE on the small pair did not become healthy: {server.exit_message()}")
        yield server
    finally:
        server.stop()


def test_the_enlarged_pairs_plain_decoding_gives_the_small_pairs_tokens(fleet, pair, small_plain, prompts,
                                                                       record_property):
    big = json.loads((pair / "target/config.json").read_text())
    small = json.loads((Path(os.environ["SGLANG_DDTREE_SMALL_PAIR"]) / "target/config.json").read_text())
    assert big["hidden_size"] > small["hidden_size"] and big["num_hidden_layers"] > small["num_hidden_layers"], \
        "SGLANG_DDTREE_PAIR must be the enlarged pair and SGLANG_DDTREE_SMALL_PAIR the pair it was made from"
    want = outputs(small_plain.complete_all(prompts, harness.greedy(), 1))
    have = outputs(ready(fleet, "none").complete_all(prompts, harness.greedy(), 1))
    same, ties, wrong = compare_with_plain(small_plain, prompts, want, have)
    record_property("identical to the small pair's NONE", f"{same}/{len(prompts)}")
    record_property("partings at the small pair's near ties (gap)", ties)
    record_property("real differences", wrong)
    assert not wrong

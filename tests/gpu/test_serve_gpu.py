"""ddtree-serve on a CUDA device: decoding under CUDA graphs over real HTTP on loopback."""

from __future__ import annotations

import pytest
import torch

from ddtree.reference.pair import load_pair

from ..serve.conftest import check_simultaneous_requests_match_the_engine, completion, start_server
from ..serve.conftest import pair_dir  # noqa: F401 (the serve tests' tiny-pair fixture, used here too)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory, pair_dir):  # noqa: F811
    srv = start_server(tmp_path_factory.mktemp("srv"), pair_dir, "--device", "cuda", "--cuda-graph-max-bs-decode", "16")
    yield srv
    assert srv.stop() == 0


def test_sixteen_requests_under_graphs_equal_the_eager_engine(gpu_server, pair_dir):  # noqa: F811
    check_simultaneous_requests_match_the_engine(gpu_server, load_pair(pair_dir, device="cuda", dtype=torch.float64),
                                                 12)


def test_the_server_replayed_graphs_and_says_so(gpu_server):
    with gpu_server.client() as c:
        for text in ("one", "two", "three"):
            completion(c, text)
        metrics = c.get("/metrics").text
    gauge = [line for line in metrics.splitlines() if line.startswith("sglang:is_cuda_graph{")]
    assert gauge and float(gauge[0].rsplit(" ", 1)[1]) == 1.0, metrics[:2000]   # the last step replayed a graph
    log = gpu_server.log.read_text()
    assert "eager decode" not in log, log[-3000:]          # no batch fell back to eager decoding

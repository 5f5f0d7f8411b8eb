"""ddtree-serve on a CUDA device: decoding under CUDA graphs over real HTTP on loopback."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ddtree.reference.engine import generate
from ddtree.reference.pair import load_pair

from ..serve.conftest import start_server

pytestmark = pytest.mark.gpu
PROMPTS = [f"request {i}: " + "ab" * i for i in range(16)]


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    subprocess.run([sys.executable, "-m", "ddtree.reference.init", "--out", str(out), "--seed", "0",
                    "--preset", "tiny"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory, pair_dir):
    srv = start_server(tmp_path_factory.mktemp("srv"), pair_dir, "--device", "cuda", "--cuda-graph-max-bs-decode", "16")
    yield srv
    assert srv.stop() == 0


def completions(server, prompts, max_tokens=12):
    def call(text):
        with server.client() as c:
            r = c.post("/v1/completions", json={"prompt": text, "max_tokens": max_tokens, "temperature": 0})
            r.raise_for_status()
            return r.json()

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(call, prompts))


def test_sixteen_requests_under_graphs_equal_the_eager_engine(gpu_server, pair_dir):
    pair = load_pair(pair_dir, device="cuda", dtype=torch.float64)
    answers = completions(gpu_server, PROMPTS)
    for text, ans in zip(PROMPTS, answers):
        alone = generate(pair, [pair.tokenizer.encode(text)], max_new_tokens=12, method="ddtree", budget=16,
                         topk_cap=4, stop_token_ids=[pair.tokenizer.eos_token_id])[0]
        assert ans["choices"][0]["text"] == pair.tokenizer.decode(alone.tokens)
        assert ans["usage"]["completion_tokens"] == len(alone.tokens)


def test_the_server_replayed_graphs_and_says_so(gpu_server):
    completions(gpu_server, PROMPTS[:3])
    with gpu_server.client() as c:
        metrics = c.get("/metrics").text
    gauge = [line for line in metrics.splitlines() if line.startswith("sglang:is_cuda_graph{")]
    assert gauge and float(gauge[0].rsplit(" ", 1)[1]) == 1.0, metrics[:2000]   # the last step replayed a graph
    log = gpu_server.log.read_text()
    assert "eager decode" not in log, log[-3000:]          # no batch fell back to eager decoding

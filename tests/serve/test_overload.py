"""ddtree-serve under overload and with a request that fails inside the engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from ddtree.reference import load_pair
from ddtree.reference.engine import Decoder, RequestParams
from ddtree.serve.middleware import key_matches
from ddtree.serve.worker import BatchWorker, Job

from .conftest import API_KEY, completion, start_server


def test_two_hundred_requests_against_a_queue_of_16_get_503s_and_no_crash(tmp_path, pair_dir):
    srv = start_server(tmp_path, pair_dir, "--max-queued-requests", "16", "--max-running-requests", "2")
    try:
        async def flood() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.url, headers={"Authorization": f"Bearer {API_KEY}"},
                                         timeout=300, limits=httpx.Limits(max_connections=200)) as c:
                body = {"prompt": "overload", "max_tokens": 24, "temperature": 0}
                return await asyncio.gather(*[c.post("/v1/completions", json=body) for _ in range(200)])

        answers = asyncio.run(flood())
        codes = [r.status_code for r in answers]
        assert set(codes) <= {200, 503}, sorted(set(codes))
        busy = [r for r in answers if r.status_code == 503]
        assert busy and codes.count(200) >= 16, (codes.count(200), len(busy))
        assert all(r.headers.get("retry-after", "").isdigit() for r in busy)
        assert busy[0].json()["error"]["type"] == "overloaded_error"
        assert "--max-queued-requests 16" in busy[0].json()["error"]["message"]
        texts = {r.json()["choices"][0]["text"] for r in answers if r.status_code == 200}
        assert len(texts) == 1                              # greedy: every admitted answer the same
        with srv.client() as c:
            assert c.get("/health").status_code == 200
            completion(c, "after the flood", max_tokens=4)
            rejected = next(x for x in c.get("/metrics").text.splitlines()
                            if x.startswith("ddtree:queue_full_rejections_total{"))
            assert float(rejected.rsplit(" ", 1)[1]) == len(busy)
    finally:
        assert srv.stop() == 0


class FailingDecoder(Decoder):
    """The real decoder, except that a prompt holding POISON raises at start (an engine fault)."""

    POISON = 7

    def start(self, prompts, params, seed=None):
        if any(self.POISON in p for p in prompts):
            raise RuntimeError("engine fault on a poisoned prompt")
        return super().start(prompts, params, seed=seed)


def test_a_failing_request_fails_alone_not_its_batch(pair_dir):
    pair = load_pair(pair_dir, dtype=torch.float64)
    worker = BatchWorker(FailingDecoder(pair, "ddtree", 16, 4), max_running=4)
    loop = asyncio.new_event_loop()
    prompts = [[1, 2, 3], [1, FailingDecoder.POISON, 3], [4, 5, 6], [8, 9]]
    jobs = [Job(prompt=p, params=RequestParams(max_new_tokens=5), seed=None, loop=loop, events=asyncio.Queue())
            for p in prompts]
    for job in jobs:                                  # queued before the worker starts: one batch of four
        worker.submit(job)
    worker.start()

    async def outcome(job: Job) -> str:
        while True:
            event = await asyncio.wait_for(job.events.get(), 120)
            if event.error:
                return "error: " + event.error
            if event.final is not None:
                return "ok"

    async def all_outcomes() -> list[str]:
        return await asyncio.gather(*[outcome(j) for j in jobs])

    try:
        results = loop.run_until_complete(all_outcomes())
    finally:
        worker.stop()
        loop.close()
    assert results[1] == "error: RuntimeError: engine fault on a poisoned prompt"
    assert [r for i, r in enumerate(results) if i != 1] == ["ok"] * 3
    assert worker.alive is False


@pytest.mark.parametrize("header,ok", [(f"Bearer {API_KEY}", True), (f"Bearer {API_KEY[:-1]}", False),
                                       (f"bearer {API_KEY}", False), ("", False), (API_KEY, False)])
def test_key_comparison(header, ok):
    assert key_matches(header, API_KEY) is ok

"""ddtree-serve over real HTTP on loopback: endpoints, errors, batching, streaming, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import torch

from ddtree.reference import generate, load_pair
from ddtree.serve.app import create_app

from .conftest import API_KEY, check_simultaneous_requests_match_the_engine, completion, start_server

ROOT = Path(__file__).resolve().parents[2]


def engine_alone(server, text: str, max_new_tokens: int):
    """(pair, prompt ids, Generation) of the same request decoded by the engine alone, in float64."""
    pair = load_pair(server.pair_dir, dtype=torch.float64)
    prompt = pair.tokenizer.encode(text)
    gen = generate(pair, [prompt], max_new_tokens=max_new_tokens, method="ddtree", budget=16, topk_cap=4,
                   stop_token_ids=[pair.tokenizer.eos_token_id])[0]
    return pair, prompt, gen


def sse_events(response: httpx.Response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[6:]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_operational_endpoints(server):
    with server.client() as c:
        assert c.get("/health").status_code == 200
        assert c.get("/health_generate").status_code == 200
        assert c.get("/ready").json() == {"status": "ready"}
        info = c.get("/model_info").json()
        assert info["model_path"].endswith("target") and info["is_generation"] is True
        sinfo = c.get("/server_info").json()
        assert sinfo["speculative_algorithm"] == "DDTREE" and sinfo["budget"] == 16 and sinfo["topk_cap"] == 4
        assert sinfo["api_key"] == "<set>"  # never echoed
        models = c.get("/v1/models").json()
        assert models["object"] == "list" and models["data"][0]["max_model_len"] == 1024


def test_metrics_count_verify_calls_and_tokens(server):
    with server.client() as c:
        before = c.get("/metrics").text
        completion(c, "metrics please", max_tokens=10)
        after = c.get("/metrics").text

    def value(text: str, name: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    assert value(after, "sglang:generation_tokens_total") - value(before, "sglang:generation_tokens_total") == 10
    assert value(after, "sglang:spec_verify_calls_total") > value(before, "sglang:spec_verify_calls_total")
    assert value(after, "sglang:spec_accept_length") >= 1.0
    assert "sglang:num_requests_total" in after and "sglang:prompt_tokens_total" in after
    assert value(after, "sglang:is_cuda_graph") == 0.0       # CPU: eager steps (1.0 under graphs: tests/gpu)


def test_latency_histograms_and_answers_by_status_use_sglangs_names(server):
    """Issue 49: the alerts read SGLang's TTFT and inter-token histograms and its answers by endpoint and status;
    ddtree-serve exports them under the same names: one first token per request, one gap per later token, a 401
    and a 400 counted on their routes, an unknown path as "other"."""
    def count(text: str, name: str, **labels) -> float:
        want = [f'{k}="{v}"' for k, v in labels.items()]
        found = [x for x in text.splitlines() if x.startswith(name + "{") and all(w in x for w in want)]
        return sum(float(x.rsplit(" ", 1)[1]) for x in found)

    with server.client() as c:
        before = c.get("/metrics").text
        tokens = completion(c, "latency please", max_tokens=7)["usage"]["completion_tokens"]
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": -1}).status_code == 400
        assert c.get("/no/such/path").status_code == 404
    with server.client(key="wrong") as c:
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 401
    with server.client() as c:
        after = c.get("/metrics").text

    def grew(name: str, **labels) -> float:
        return count(after, name, **labels) - count(before, name, **labels)

    assert grew("sglang:time_to_first_token_seconds_count") == 1
    assert tokens >= 2 and grew("sglang:inter_token_latency_seconds_count") == tokens - 1     # one gap per later token
    assert grew("sglang:time_to_first_token_seconds_bucket", le="+Inf") == 1
    assert grew("sglang:http_responses_total", endpoint="/v1/completions", status_code="200", method="POST") == 1
    assert grew("sglang:http_responses_total", endpoint="/v1/completions", status_code="400", method="POST") == 1
    assert grew("sglang:http_responses_total", endpoint="other", status_code="404", method="GET") == 1
    assert grew("sglang:http_responses_total", status_code="401", method="POST") == 1


def test_the_sweeps_load_measures_the_latency_percentiles_from_the_servers_histograms(server, tmp_path):
    """Issue 49: the sweep's client (k26_client.py load, as sweep.yml runs it) reads the TTFT and inter-token 95th
    percentiles from the server's histograms over its load: the alerts' bounds come from them."""
    config = tmp_path / "config.yaml"
    config.write_text(f'api-key: "{API_KEY}"\n')
    model = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()["data"][0]["id"]
    r = subprocess.run([sys.executable, str(ROOT / "roles/verify/files/k26_client.py"), "load", server.url, model, "8", "4",
                        "0"], capture_output=True, text=True, timeout=300, env={**os.environ, "K26_CONFIG_FILE": str(config)})
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["errors"] == 0 and 0 < row["ttft_p95_s"] <= 400 and 0 < row["itl_p95_s"] <= 8, row


def test_completion_matches_the_engine_and_reports_spec_details(server):
    pair, prompt, want = engine_alone(server, "import os\n", 12)
    with server.client() as c:
        out = completion(c, "import os\n", return_spec_tokens_details=True)
        by_ids = completion(c, prompt)
    assert out["choices"][0]["text"] == pair.tokenizer.decode(want.tokens)
    assert by_ids["choices"][0]["text"] == out["choices"][0]["text"]
    assert out["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(want.tokens),
                            "total_tokens": len(prompt) + len(want.tokens)}
    details = out["sglext"]["spec_tokens_details"]
    assert details["spec_verify_ct"] == want.num_verify_steps
    assert details["spec_accept_length"] == pytest.approx(len(want.tokens) / want.num_verify_steps)
    assert "sglext" not in by_ids


def test_chat_completion_and_streaming_agree(server):
    body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "max_tokens": 9, "temperature": 0}
    with server.client() as c:
        whole = c.post("/v1/chat/completions", json=body).json()
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r)
        with c.stream("POST", "/v1/completions", json={"prompt": "abc", "max_tokens": 7, "temperature": 0,
                                                      "stream": True}) as r:
            text_events = sse_events(r)
        plain = completion(c, "abc", max_tokens=7)
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant"}
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1])
    assert streamed == whole["choices"][0]["message"]["content"]
    assert events[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert events[-2]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert "".join(e["choices"][0]["text"] for e in text_events[:-1]) == plain["choices"][0]["text"]


BAD = [
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "min_p": 1.0}, "min_p"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": [1, 2, 999]}, "prompt"),
    ({"prompt": "y" * 1100}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "x", "top_k": 10**9}, "top_k"),
    ({"prompt": "x", "top_k": 0}, "top_k"),
    ({"prompt": "x", "max_tokens": 10**6}, "max_tokens"),
    ({"prompt": "x", "stop": ["s"] * 17}, "stop"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "stop": "z" * 300}, "stop"),
    ({"prompt": "x", "stop_token_ids": [10**6]}, "stop_token_ids"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_requests_get_400_with_an_openai_error(server, body, param):
    with server.client() as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == 400
        assert err["param"] == param and param in err["message"]
        assert c.get("/health").status_code == 200  # still alive


def test_garbage_bodies_do_not_hurt_the_server(server):
    with server.client() as c:
        assert c.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
                      ).status_code == 400
        assert c.post("/v1/chat/completions", json={"messages": []}).status_code == 400
        assert c.post("/v1/chat/completions", json={"messages": [{"role": 1}]}).status_code == 400
        completion(c, "still fine", max_tokens=3)


def test_api_key_is_required(server):
    with server.client(key=None) as c:
        r = c.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert c.get("/v1/models").status_code == 401
        assert c.get("/health_generate").status_code == 401   # it runs a decode step: keyed
        assert c.get("/health").status_code == 200            # liveness needs no key and does no work
    for wrong in ("wrong", API_KEY[:-1], API_KEY + "x", ""):
        with server.client(key=wrong or None) as c:
            assert c.post("/v1/completions", json={"prompt": "x"}).status_code == 401


def test_during_a_rotation_the_new_and_the_previous_key_are_accepted_and_no_other(pair_dir, tmp_path):
    """A key rotation behind a gateway: the server takes the new key and the one being retired (from
    --config, as the deployment writes it; never shown by /server_info); any other key, or none, gets 401."""
    config = tmp_path / "server.yaml"
    config.write_text(json.dumps({"previous-api-key": API_KEY}))
    server = start_server(tmp_path, pair_dir, "--config", str(config), "--api-key", "new-key-of-the-rotation",
                          "--speculative-algorithm", "NONE")
    try:
        for key, status in (("new-key-of-the-rotation", 200), (API_KEY, 200), ("other-key-of-some-length", 401),
                            (None, 401)):
            with server.client(key=key) as c:
                assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == status, key
        with server.client(key=API_KEY) as c:
            info = c.get("/server_info").json()
        assert (info["api_key"], info["previous_api_key"]) == ("<set>", "<set>")
        assert API_KEY not in json.dumps(info) and "new-key-of-the-rotation" not in json.dumps(info)
    finally:
        server.stop()


def test_health_is_liveness_without_a_decode_step(server):
    def verify_calls(c) -> float:
        line = next(x for x in c.get("/metrics").text.splitlines() if x.startswith("sglang:spec_verify_calls_total{"))
        return float(line.rsplit(" ", 1)[1])

    with server.client(key=None) as c:
        before = verify_calls(c)
        assert all(c.get("/health").status_code == 200 for _ in range(20))
        assert verify_calls(c) == before
    with server.client() as c:
        assert c.get("/health_generate").status_code == 200
        assert verify_calls(c) > before


def test_oversized_bodies_get_400_before_parsing(server):
    big = {"prompt": "x" * (2 << 20)}
    with server.client() as c:
        r = c.post("/v1/completions", json=big)
        assert r.status_code == 400 and r.json()["error"]["param"] == "body"
        assert "--max-request-bytes" in r.json()["error"]["message"]

        def chunks():                                      # no Content-Length: read up to the limit only
            yield b'{"prompt": "'
            for _ in range(40):
                yield b"y" * 65536
            yield b'"}'
        r = c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 400 and "limit is" in r.json()["error"]["message"]
        completion(c, "still fine", max_tokens=3)


def test_sixteen_simultaneous_requests_match_the_engine_alone(server):
    check_simultaneous_requests_match_the_engine(server, load_pair(server.pair_dir, dtype=torch.float64), 10)


def test_sigterm_drains_an_in_flight_request(tmp_path, pair_dir):
    srv = start_server(tmp_path, pair_dir, "--speculative-algorithm", "NONE")
    received: list = []
    first_chunk = threading.Event()

    def stream_long():
        with srv.client() as c, c.stream("POST", "/v1/completions",
                                         json={"prompt": "drain", "max_tokens": 400, "temperature": 0,
                                               "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    received.append(line[6:])
                    first_chunk.set()

    t = threading.Thread(target=stream_long)
    t.start()
    assert first_chunk.wait(30)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert srv.proc.wait(timeout=60) == 0
    assert received[-1] == "[DONE]"
    last = json.loads(received[-2])
    assert last["usage"]["completion_tokens"] == 400 or last["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(httpx.HTTPError):
        httpx.get(srv.url + "/ready", timeout=2)


def test_a_draining_server_closes_each_connection_after_its_answer(pair_dir):
    # a gateway polls /health on one kept-alive connection; one that connected just as the drain
    # began would hold the process open until the graceful timeout unless the answers say "close"
    from ddtree.serve import cli

    ap = cli.parser()
    args = cli.parse_args(ap, ["--model-path", str(pair_dir / "target"), "--speculative-algorithm", "NONE"])
    decoder, settings = cli.load(args, ap)
    app = create_app(settings, decoder, decoder.pair.tokenizer)
    app.state.ready = True

    async def ask() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            before = await c.get("/ready")
            app.state.draining = True
            return [before, await c.get("/health"), await c.get("/ready")]

    before, health, ready = asyncio.run(ask())
    assert before.status_code == 200 and before.headers.get("connection") != "close"
    assert (health.status_code, health.headers.get("connection")) == (503, "close")
    assert (ready.status_code, ready.headers.get("connection")) == (503, "close")


@pytest.mark.parametrize("args,message", [
    (["--speculative-algorithm", "DDTREE"], "needs --speculative-draft-model-path"),
    (["--speculative-algorithm", "NONE", "--speculative-ddtree-budget", "0"], "--speculative-ddtree-budget=0 is invalid"),
    (["--speculative-algorithm", "NONE", "--port", "70000"], "--port 70000"),
    (["--speculative-algorithm", "EAGLE"], "invalid choice: 'EAGLE'"),
    (["--speculative-algorithm", "NONE", "--cuda-graph-max-bs-decode", "0"], "--cuda-graph-max-bs-decode 0"),
    (["--speculative-algorithm", "NONE", "--previous-api-key", "old-key-of-some-length"],
     "--previous-api-key is set without --api-key"),
    (["--speculative-algorithm", "NONE", "--api-key", "same-key-of-some-length", "--previous-api-key",
      "same-key-of-some-length"], "--previous-api-key equals --api-key"),
])
def test_bad_flags_exit_2_with_the_fix(tmp_path, args, message):
    exe = Path(sys.executable).with_name("ddtree-serve")
    r = subprocess.run([str(exe), "--model-path", str(tmp_path), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr


def test_missing_model_and_block_size_mismatch_exit_2(pair_dir, tmp_path):
    exe = Path(sys.executable).with_name("ddtree-serve")
    r = subprocess.run([str(exe), "--model-path", str(tmp_path / "none"), "--speculative-algorithm", "NONE"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "config.json not found" in r.stderr
    r = subprocess.run([str(exe), "--model-path", str(pair_dir / "target"), "--speculative-draft-model-path",
                        str(pair_dir / "draft"), "--speculative-dflash-block-size", "8"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "does not match the draft's block_size 4" in r.stderr


def test_native_generate_returns_ids_and_logprobs(server):
    _, prompt, want = engine_alone(server, "logprobs", 9)
    with server.client() as c:
        r = c.post("/generate", json={"input_ids": prompt, "return_logprob": True, "top_logprobs_num": 2,
                                      "sampling_params": {"max_new_tokens": 9, "temperature": 0}})
        assert r.status_code == 200, r.text
        out = r.json()
        assert c.post("/generate", json={"text": "a", "input_ids": [1]}).status_code == 400
        assert c.post("/generate", json={"text": "a", "stream": True}).status_code == 400
        assert c.post("/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 0}}).status_code == 400
    assert out["output_ids"] == want.tokens
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 9 and meta["finish_reason"] == {"type": "length", "length": 9}
    assert [t for _, t, _ in meta["output_token_logprobs"]] == want.tokens
    for (lp, tok, _), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert len(top) == 2 and top[0][0] >= top[1][0]
        assert top[0][1] == tok and lp == pytest.approx(top[0][0])  # greedy emits the top-1 token


def test_a_ddtree_budget_the_draft_block_does_not_fit_exits_2(pair_dir):
    """The reference server refuses what `sglang serve` refuses: budget + 1 below the draft's block (4)."""
    exe = Path(sys.executable).with_name("ddtree-serve")
    r = subprocess.run([str(exe), "--model-path", str(pair_dir / "target"), "--speculative-draft-model-path",
                        str(pair_dir / "draft"), "--speculative-ddtree-budget", "2", "--speculative-ddtree-topk-cap", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--speculative-ddtree-budget=2 is invalid with block size 4" in r.stderr
    assert "use a budget >= 3" in r.stderr


@pytest.mark.parametrize("budget,cap,message", [
    ("1:32,8:", "4", "--speculative-ddtree-budget=1:32,8: is invalid: expected one integer 1..1023 or BATCH:VALUE pairs"),
    ("1:32,8:4", "1:4,8:8", "from batch size 8: --speculative-ddtree-topk-cap=8 is invalid"),
    ("1:32,16:2", "1", "from batch size 16: --speculative-ddtree-budget=2 is invalid with block size 4"),
])
def test_a_bad_budget_schedule_exits_2_naming_the_batch_size(pair_dir, budget, cap, message):
    exe = Path(sys.executable).with_name("ddtree-serve")
    r = subprocess.run([str(exe), "--model-path", str(pair_dir / "target"), "--speculative-draft-model-path",
                        str(pair_dir / "draft"), "--speculative-ddtree-budget", budget,
                        "--speculative-ddtree-topk-cap", cap], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_a_budget_schedule_is_served_and_shown_as_written(pair_dir):
    """The server decodes with the width for the requests it runs; /server_info shows the schedule."""
    from ddtree.serve import cli

    ap = cli.parser()
    args = cli.parse_args(ap, ["--model-path", str(pair_dir / "target"), "--speculative-draft-model-path",
                               str(pair_dir / "draft"), "--speculative-ddtree-budget", "1:16,2:8,4:3",
                               "--speculative-ddtree-topk-cap", "1:4,4:2"])
    cli.check_args(ap, args)
    decoder, settings = cli.load(args, ap)
    assert (settings.budget, settings.topk_cap) == ("1:16,2:8,4:3", "1:4,4:2")
    assert [decoder.width(n) for n in (1, 2, 3, 4, 48)] == [(16, 4), (8, 4), (8, 4), (3, 2), (3, 2)]
    one = cli.parse_args(ap, ["--model-path", str(pair_dir / "target"), "--speculative-draft-model-path",
                              str(pair_dir / "draft"), "--speculative-ddtree-budget", "12"])
    cli.check_args(ap, one)
    assert cli.load(one, ap)[1].budget == 12                        # one value stays a number

"""A real ddtree-serve process on a free loopback port, over a tiny float64 pair."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ddtree.reference import generate

API_KEY = "test-key-not-secret"


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports: every socket held until all are picked (two picks one after the other can
    get the same port back - CI on ee929d8 gave the gateway's listener and its metrics the same one)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    pair_dir: Path
    log: Path

    def client(self, key: str | None = API_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def start_server(tmp: Path, pair_dir: Path, *extra: str) -> Server:
    port = free_port()
    log = tmp / f"server-{port}.log"
    exe = Path(sys.executable).with_name("ddtree-serve")  # the installed console script
    # where the package is not installed (the GPU machine: PYTHONPATH=src), the module itself
    launcher = [str(exe)] if exe.exists() else [sys.executable, "-m", "ddtree.serve"]
    cmd = [*launcher, "--model-path", str(pair_dir / "target"),
           "--speculative-draft-model-path", str(pair_dir / "draft"), "--port", str(port),
           "--dtype", "float64", "--api-key", API_KEY, "--enable-metrics",
           "--speculative-ddtree-budget", "16", "--speculative-ddtree-topk-cap", "4", *extra]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ddtree-serve exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return Server(proc, url, pair_dir, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"ddtree-serve did not become ready: {log.read_text()[-2000:]}")


def completion(client: httpx.Client, prompt, **kw) -> dict:
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, **kw}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def check_simultaneous_requests_match_the_engine(server: Server, pair, max_tokens: int) -> None:
    """16 requests sent at once answer exactly what the engine decodes for each alone (ddtree 16/4)."""
    prompts = [f"request {i}: " + "ab" * i for i in range(16)]

    def call(text):
        with server.client() as c:
            return completion(c, text, max_tokens=max_tokens)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, prompts))
    for text, ans in zip(prompts, answers):
        alone = generate(pair, [pair.tokenizer.encode(text)], max_new_tokens=max_tokens, method="ddtree", budget=16,
                         topk_cap=4, stop_token_ids=[pair.tokenizer.eos_token_id])[0]
        assert ans["choices"][0]["text"] == pair.tokenizer.decode(alone.tokens)
        assert ans["usage"]["completion_tokens"] == len(alone.tokens)


@pytest.fixture(scope="session")
def pair_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pair")
    subprocess.run([sys.executable, "-m", "ddtree.reference.init", "--out", str(out), "--seed", "0",
                    "--preset", "tiny"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory, pair_dir):
    srv = start_server(tmp_path_factory.mktemp("srv"), pair_dir)
    yield srv
    srv.stop()

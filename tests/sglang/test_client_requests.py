"""Every request the playbooks' clients send is served by a DDTREE server (real SGLang 0.5.23, CPU).

The clients run unchanged, as the playbooks run them (tests/playbook_clients.py renders each
command from its task file), against a loopback server that records each request and answers in
SGLang's shapes. Each recorded request then goes through SGLang's own request objects and OpenAI
handlers, with the tokenizer and chat template of an exported test pair and the production
example's command line, and through the plugin's per-request check (tests/sglang/request_objects.py).
A client change that sends something a DDTREE server refuses (a seed above temperature 0, log-probs,
a penalty, a grammar) fails here before it reaches a host.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests import playbook_clients as pc
from tests.sglang.test_contract import rendered_production_args

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "contract-test-key-0123456789"
ADMIN_KEY = "contract-test-admin-key-0123"
MODEL = "kimi-k2.6"


class Capture(BaseHTTPRequestHandler):
    """Records each request and answers what SGLang would (shape, not content)."""
    seen: list[dict] = []

    def log_message(self, *args):
        pass

    def _send(self, code: int, body, kind: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.seen.append({"method": "GET", "path": self.path, "auth": self.headers.get("authorization")})
        if self.path == "/metrics":
            self._send(200, b'sglang:generation_tokens_total{model_name="m"} 8\n'
                            b'sglang:spec_verify_calls_total{model_name="m"} 4\n', "text/plain")
        else:
            self._send(200, {"model_path": "/models/target", "served_model_name": MODEL})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.seen.append({"method": "POST", "path": self.path, "body": body, "auth": self.headers.get("authorization")})
        details = {"spec_tokens_details": {"spec_accept_length": 2.0}}
        if self.path == "/v1/chat/completions":
            self._send(200, {"choices": [{"message": {"role": "assistant", "content": "same answer",
                                                      "reasoning_content": None}}],
                             "usage": {"completion_tokens": 2}, "sglext": details})
        elif self.path == "/generate":
            step = [[-0.1, 7, None], [-2.5, 9, None], [-3.0, 11, None]]
            self._send(200, {"text": "ab", "output_ids": [7, 7],
                             "meta_info": {"output_top_logprobs": [step, step] if body.get("return_logprob") else None,
                                           "spec_accept_length": 2.0, "spec_verify_ct": 1}})
        elif self.path == "/v1/completions" and body.get("stream"):
            self._send(200, b'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n', "text/event-stream")
        else:
            self._send(200, {"choices": [{"text": "a"}], "usage": {"completion_tokens": 1}})


@pytest.fixture(scope="module")
def capture():
    Capture.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """A tiny pair in SGLang's formats with the exported tokenizer (block 8, as the example renders)."""
    from ddtree.reference.config import DraftConfig, TargetConfig
    from ddtree.reference.export import export_pair
    from ddtree.reference.pair import init_pair

    out = tmp_path_factory.mktemp("pair")
    export_pair(init_pair(TargetConfig(num_hidden_layers=3), DraftConfig(block_size=8, target_layer_ids=[0, 1]),
                          seed=0), out)
    return out


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("etc") / "k26-ddtree.yaml"
    path.write_text(f"api-key: {json.dumps(API_KEY)}\n")
    return path


def production_args(pair: Path, config_file: Path, algorithm: str = "DDTREE") -> list[str]:
    """The production example's rendered command line on the exported pair (model paths and the
    config file substituted, --device cpu added for SGLang's resolution on this machine; everything
    else as rendered)."""
    swap = {"/srv/models/Kimi-K2.6": str(pair / "target"), "/srv/models/Kimi-K2.6-DFlash": str(pair / "draft"),
            "/etc/k26/k26-ddtree.yaml": str(config_file)}
    return [swap.get(a, a) for a in rendered_production_args(algorithm)] + ["--device", "cpu"]


def run_calls(capture, config_file: Path, tmp: Path) -> dict[str, list[tuple[pc.ClientCall, list[dict]]]]:
    """Every playbook client command against the capture server, by the algorithm of the server it
    is meant for (validate.yml and sweep.yml also run the NONE reference); each must exit 0.
    Returns, per algorithm, each call with the requests it sent."""
    port = capture.server_address[1]
    gateway = tmp / "gateway.yaml"
    gateway.write_text(json.dumps({"host": "127.0.0.1", "port": port, "workers": [f"http://127.0.0.1:{port}"],
                                   "api_key": API_KEY, "admin_key": ADMIN_KEY}))
    prompts = tmp / "prompts.json"
    prompts.write_text(json.dumps(json.loads((ROOT / "validation/prompts.json").read_text())[:3]))
    site = pc.Site(port=port, config_file=str(config_file), served_model_name=MODEL,
                   values={"k26_gateway_probe_model": MODEL, "k26_gateway_workers": [f"http://127.0.0.1:{port}"]},
                   paths={"/var/lib/k26-rollback/validate-prompts.json": str(prompts),
                          "/opt/k26-gateway/venv/bin/python": sys.executable,
                          "/opt/k26-gateway/bin/k26_gateway.py": str(pc.GATEWAY_TOOL),
                          "/etc/k26-gateway/gateway.yaml": str(gateway)})
    plan = {algorithm: pc.server_calls(site, algorithm) for algorithm in ("NONE", "DDTREE")}
    plan["DDTREE"].append(pc.gateway_calls(site, f"http://127.0.0.1:{port}")["gateway: probe"])
    sent: dict[str, list[tuple[pc.ClientCall, list[dict]]]] = {}
    for algorithm, calls in plan.items():
        for call in calls:
            start = len(Capture.seen)
            r = subprocess.run(call.argv, env={"PATH": "/usr/bin:/bin", **call.env}, capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == 0, f"{call.name}: {call.argv}\n{r.stdout[-1500:]}{r.stderr[-1500:]}"
            sent.setdefault(algorithm, []).append((call, Capture.seen[start:]))
    return sent


def verdicts(args: list[str], requests: list[dict]) -> list[dict]:
    r = subprocess.run([sys.executable, str(ROOT / "tests/sglang/request_objects.py"), json.dumps(args)],
                       input=json.dumps(requests), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def posts(sent: list[tuple[pc.ClientCall, list[dict]]]) -> list[dict]:
    return [r for _, requests in sent for r in requests if r["method"] == "POST"]


@pytest.fixture(scope="module")
def served(capture, pair, config_file, tmp_path_factory):
    """The playbooks' requests per server algorithm, and SGLang + the plugin's verdict on each (the
    NONE reference's requests through a NONE server's command line, the rest through DDTREE's)."""
    sent = run_calls(capture, config_file, tmp_path_factory.mktemp("calls"))
    return sent, {algorithm: verdicts(production_args(pair, config_file, algorithm),
                                      [{"path": r["path"], "body": r["body"]} for r in posts(calls)])
                  for algorithm, calls in sent.items()}


def test_the_playbooks_send_every_kind_of_generation_request(served):
    sent, _ = served
    assert {c.name.split(" (")[0] for c, _ in sent["DDTREE"]} == {"verify: read /model_info", "verify: smoke",
                                                                 "validate", "sweep", "gateway: probe"}
    ddtree = posts(sent["DDTREE"])
    assert {"/v1/chat/completions", "/generate", "/v1/completions"} <= {r["path"] for r in ddtree}
    assert all(r["auth"] == f"Bearer {API_KEY}" for r in ddtree + posts(sent["NONE"])), "a request without the key"
    # the smoke and the sweep ask above temperature 0 too: the case the seed broke
    assert any(r["body"].get("temperature", 0) > 0 for r in ddtree if r["path"] == "/v1/chat/completions")


def test_a_ddtree_server_serves_every_request_the_playbooks_send_it(served):
    sent, results = served
    requests = posts(sent["DDTREE"])
    refused = [(p["path"], p["body"], v["refusal"]) for p, v in zip(requests, results["DDTREE"]) if v["refusal"]]
    assert not refused, f"{len(refused)} of {len(requests)} refused, first: {refused[0]}"
    assert not any(v["return_logprob"] or v["top_logprobs_num"] for v in results["DDTREE"])


def test_sglang_takes_the_none_references_requests_and_its_logprob_asks(served):
    """validate.yml asks the NONE reference, and only it, for the top log-probs of each step."""
    sent, results = served
    assert all(v["refusal"] is None for v in results["NONE"])
    validate = {c.name: c.argv[-1] for algorithm in sent for c, _ in sent[algorithm] if c.name.startswith("validate")}
    assert validate == {"validate (NONE)": "5", "validate (DDTREE)": "0"}
    asked = [v for v in results["NONE"] if v["top_logprobs_num"] == 5 and v["return_logprob"]]
    assert len(asked) == 3        # one per prompt of the (cut) prompt set


OLD_REQUESTS = [   # (path, body, the field the refusal names)
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                              "temperature": 0.7, "seed": 0}, "sampling_seed"),
    ("/generate", {"text": "def f(x):", "sampling_params": {"max_new_tokens": 8, "temperature": 0.0},
                   "return_hidden_states": True}, "return_hidden_states"),
]


def test_the_check_has_teeth_the_old_clients_requests_are_refused(pair, config_file):
    """What the clients sent before (a seed at temperature 0.7 from the smoke) and a request for hidden states,
    through the same pipeline: refused, naming the field. (Top log-probs and penalties, which validate and a
    client sent before, are served on DDTREE since their GPU runs.)"""
    results = verdicts(production_args(pair, config_file), [{"path": p, "body": b} for p, b, _ in OLD_REQUESTS])
    for (path, _, field), result in zip(OLD_REQUESTS, results):
        assert result["refusal"] and field in result["refusal"], (path, result)

"""`--previous-api-key` with the real, pinned SGLang 0.5.23: the server's own config-file parsing and its
own API-key middleware (sglang.srt.utils.auth.add_api_key_middleware) on a FastAPI app, in a fresh
process after load_plugins(), as `sglang serve` runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

NEW, OLD, ADMIN = "new-key-of-the-rotation-0123", "old-key-being-retired-0123", "admin-key-not-for-clients-01"

SERVE = """
import json, sys
from sglang.srt.plugins import load_plugins; load_plugins()
from sglang.srt.server_args import prepare_server_args
from sglang.srt.entrypoints import engine
args = prepare_server_args(["--model-path", "/nonexistent/model", "--config", sys.argv[1]])
from fastapi import FastAPI
from starlette.testclient import TestClient
from sglang.srt.utils.auth import AuthLevel, add_api_key_middleware, auth_level
app = FastAPI()
@app.post("/v1/completions")
def completions():
    return {"ok": True}
@app.post("/admin_only")
@auth_level(AuthLevel.ADMIN_FORCE)
def admin_only():
    return {"ok": True}
add_api_key_middleware(app, api_key=args.api_key, admin_api_key=args.admin_api_key)
client = TestClient(app)
def status(path, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return client.post(path, headers=headers).status_code
print(json.dumps({"completions": {k: status("/v1/completions", k) for k in json.loads(sys.argv[2])},
                  "admin_only": {k: status("/admin_only", k) for k in json.loads(sys.argv[2])},
                  "logged": engine._server_args_for_logging(args),
                  "has_field": hasattr(args, "previous_api_key")}, default=str))
"""


def serve(config: dict, keys: list, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "k26-ddtree.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
    return subprocess.run([sys.executable, "-c", SERVE, str(path), json.dumps(keys)], capture_output=True, text=True,
                          timeout=300)


def test_the_new_and_the_previous_key_open_the_api_and_no_other(tmp_path):
    r = serve({"api-key": NEW, "previous-api-key": OLD, "admin-api-key": ADMIN}, [NEW, OLD, "some-other-key-0123", ""],
              tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["completions"] == {NEW: 200, OLD: 200, "some-other-key-0123": 401, "": 401}
    # an endpoint that needs the admin key still needs it: neither client key opens it
    assert out["admin_only"][NEW] == out["admin_only"][OLD] == 401
    # the previous key is not a ServerArgs field, so SGLang's start-up log line cannot carry it
    assert out["has_field"] is False and OLD not in json.dumps(out["logged"])


def test_without_a_previous_key_only_the_key_opens_the_api(tmp_path):
    r = serve({"api-key": NEW}, [NEW, OLD], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["completions"] == {NEW: 200, OLD: 401}


@pytest.mark.parametrize("config,message", [
    ({"previous-api-key": OLD}, "--previous-api-key is set without --api-key"),
    ({"api-key": NEW, "previous-api-key": NEW}, "--previous-api-key equals --api-key"),
])
def test_a_previous_key_that_cannot_work_is_refused_at_start(tmp_path, config, message):
    r = serve(config, [NEW], tmp_path)
    assert r.returncode != 0 and message in r.stderr
    assert OLD not in r.stderr and NEW not in r.stderr

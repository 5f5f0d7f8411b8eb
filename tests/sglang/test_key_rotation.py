"""`--previous-api-key` with the real, pinned SGLang 0.5.23: the server's own config-file parsing and its
own API-key middleware (sglang.srt.utils.auth.add_api_key_middleware) on a FastAPI app, in a fresh
process after load_plugins(), as `sglang serve` runs them (one process parses every configuration in turn)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

NEW, OLD, ADMIN = "new-key-of-the-rotation-0123", "old-key-being-retired-0123", "admin-key-not-for-clients-01"

SERVE = """
import contextlib, io, json, sys, traceback
from sglang.srt.plugins import load_plugins; load_plugins()
from sglang.srt.server_args import prepare_server_args
from sglang.srt.entrypoints import engine
from fastapi import FastAPI
from starlette.testclient import TestClient
from sglang.srt.utils.auth import AuthLevel, add_api_key_middleware, auth_level

def statuses(args, keys):
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
    return {"completions": {k: status("/v1/completions", k) for k in keys},
            "admin_only": {k: status("/admin_only", k) for k in keys},
            "logged": engine._server_args_for_logging(args), "has_field": hasattr(args, "previous_api_key")}

out = {}
for name, path, keys in json.loads(sys.argv[1]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(["--model-path", "/nonexistent/model", "--config", path])
        out[name] = dict(statuses(args, keys), refused=False, stderr=err.getvalue())
    except BaseException as e:              # a refusal: SGLang's argparse exits, a hook raises
        out[name] = {"refused": True, "stderr": err.getvalue() + "".join(traceback.format_exception_only(e))}
print(json.dumps(out, default=str))
"""

CONFIGS = {
    "both": ({"api-key": NEW, "previous-api-key": OLD, "admin-api-key": ADMIN}, [NEW, OLD, "some-other-key-0123", ""]),
    "new-only": ({"api-key": NEW}, [NEW, OLD]),
    "previous-alone": ({"previous-api-key": OLD}, [NEW]),
    "previous-equals-new": ({"api-key": NEW, "previous-api-key": NEW}, [NEW]),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    """Every configuration above through SGLang's parser and middleware in ONE fresh process (each SGLang import
    costs 30-40 s on the CI machine; the configurations are parsed one after another, as separate starts would)."""
    folder = tmp_path_factory.mktemp("key-rotation")
    jobs = []
    for name, (config, keys) in CONFIGS.items():
        path = folder / f"{name}.yaml"
        path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
        jobs.append([name, str(path), keys])
    r = subprocess.run([sys.executable, "-c", SERVE, json.dumps(jobs)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]), process_stderr=r.stderr)


def test_the_new_and_the_previous_key_open_the_api_and_no_other(served):
    out = served["both"]
    assert out["refused"] is False, out["stderr"][-3000:]
    assert out["completions"] == {NEW: 200, OLD: 200, "some-other-key-0123": 401, "": 401}
    # an endpoint that needs the admin key still needs it: neither client key opens it
    assert out["admin_only"][NEW] == out["admin_only"][OLD] == 401
    # the previous key is not a ServerArgs field, so SGLang's start-up log line cannot carry it
    assert out["has_field"] is False and OLD not in json.dumps(out["logged"])


def test_without_a_previous_key_only_the_key_opens_the_api(served):
    out = served["new-only"]
    assert out["refused"] is False, out["stderr"][-3000:]
    assert out["completions"] == {NEW: 200, OLD: 401}


@pytest.mark.parametrize("name,message", [
    ("previous-alone", "--previous-api-key is set without --api-key"),
    ("previous-equals-new", "--previous-api-key equals --api-key"),
])
def test_a_previous_key_that_cannot_work_is_refused_at_start(served, name, message):
    out = served[name]
    assert out["refused"] is True and message in out["stderr"], out["stderr"][-3000:]
    assert OLD not in out["stderr"] and NEW not in out["stderr"]
    # nor anywhere the process wrote (its logging handlers write past the redirect)
    assert OLD not in served["process_stderr"] and NEW not in served["process_stderr"]

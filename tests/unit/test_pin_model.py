"""tools/pin_model.py with huggingface_hub's own client (HfApi, its paginated tree listing, its URL builder, its
session and error mapping) against a stand-in hub on loopback (FastAPI under uvicorn) that answers the three routes
the client calls, in the shapes huggingface_hub 1.33.0's parsers read: /api/models/REPO/revision/REV (model_info),
/api/models/REPO/tree/REV (list_repo_tree, two pages by a Link header) and /REPO/resolve/REV/PATH. What the real hub
does beyond those shapes is not tested here (issue 47, item 2: the hub path by its client's offline-testable parts).
The digest list it writes is then the one the staging play checks (tests/infra/test_models.py uses the same format).
"""

from __future__ import annotations

import hashlib
import importlib.util
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("pin_model", ROOT / "tools/pin_model.py")
pin_model = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("pin_model", pin_model)       # its dataclasses resolve annotations through the module
_spec.loader.exec_module(pin_model)
REPO = "acme/tiny-k2"
COMMIT = "3f2c1e0b9a8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b"
LARGE = b"\x00" * 5000 + b"weights"
FILES = {".gitattributes": b"*.safetensors filter=lfs\n", "config.json": b'{"model_type": "kimi_k2"}\n',
         "tokenizer/tokenizer.json": b'{"version": "1.0"}\n', "figures/logo.png": b"PNG...",
         "model-00001-of-00001.safetensors": LARGE}
LFS = {"model-00001-of-00001.safetensors"}
TOKEN = "hf_stand_in_marker_91aa"


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub:
    """The stand-in's state: gated or not, and a small file it may serve with other bytes than its tree says."""

    def __init__(self):
        self.gated = False
        self.tampered: set[str] = set()
        self.tree_pages = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        def allowed(request: Request) -> bool:
            return not self.gated or request.headers.get("authorization") == f"Bearer {TOKEN}"

        def revision_ok(rev: str) -> bool:
            return rev in ("main", COMMIT)

        @app.get("/api/models/{owner}/{name}/revision/{rev}")
        def model_info(owner: str, name: str, rev: str, request: Request):
            if not allowed(request):
                return JSONResponse({"error": "gated"}, status_code=401, headers={"X-Error-Code": "GatedRepo"})
            if f"{owner}/{name}" != REPO or not revision_ok(rev):
                code = "RepoNotFound" if f"{owner}/{name}" != REPO else "RevisionNotFound"
                return JSONResponse({"error": code}, status_code=404, headers={"X-Error-Code": code})
            return {"id": REPO, "sha": COMMIT, "siblings": [{"rfilename": p} for p in FILES]}

        @app.get("/api/models/{owner}/{name}/tree/{rev}")
        def tree(owner: str, name: str, rev: str, request: Request, recursive: str = "false", cursor: str = ""):
            if not allowed(request) or rev != COMMIT or recursive.lower() != "true":
                return JSONResponse({"error": "bad tree request"}, status_code=400)
            self.tree_pages += 1
            entries = [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in ("figures", "tokenizer")]
            for path, data in FILES.items():
                e = {"type": "file", "oid": blob_id(data), "size": len(data), "path": path}
                if path in LFS:
                    e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                entries.append(e)
            half = len(entries) // 2
            if cursor:
                return entries[half:]
            nxt = f"{request.url.scheme}://{request.url.netloc}{request.url.path}?recursive=true&cursor=page2"
            return JSONResponse(entries[:half], headers={"Link": f'<{nxt}>; rel="next"'})

        @app.get("/{owner}/{name}/resolve/{rev}/{path:path}")
        def resolve(owner: str, name: str, rev: str, path: str, request: Request):
            if not allowed(request) or rev != COMMIT or path not in FILES:
                return Response(status_code=404)
            return Response(FILES[path] + (b"tampered" if path in self.tampered else b""))

        return app


@pytest.fixture(scope="module")
def hub():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = Hub()
    server = uvicorn.Server(uvicorn.Config(state.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    state.url = f"http://127.0.0.1:{port}"
    yield state
    server.should_exit = True
    thread.join(10)


@pytest.fixture(autouse=True)
def fresh(hub):
    hub.gated, hub.tampered, hub.tree_pages = False, set(), 0


def pin(hub, tmp_path, *extra: str, token: str = "", revision: str = "main") -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_DISABLE_TELEMETRY": "1"}
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, str(ROOT / "tools/pin_model.py"), "--repo", REPO, "--revision", revision,
                           "--endpoint", hub.url, "--out", str(tmp_path / "target.sha256"), *extra],
                          capture_output=True, text=True, env=env, timeout=120)


def test_a_branch_is_pinned_to_its_commit_with_every_files_sha256(hub, tmp_path):
    p = pin(hub, tmp_path, "--exclude", "figures/*")
    assert p.returncode == 0, p.stderr
    want = sorted(f"{hashlib.sha256(d).hexdigest()}  {path}" for path, d in FILES.items()
                  if path not in (".gitattributes", "figures/logo.png"))
    assert (tmp_path / "target.sha256").read_text().splitlines() == want
    assert f"source: {hub.url}/{REPO}/resolve/{COMMIT}" in p.stdout and f"commit {COMMIT}" in p.stdout
    assert "(1 from the hub's LFS records)" in p.stdout
    assert hub.tree_pages == 2, "the client did not follow the tree's second page"


def test_a_list_written_here_checks_with_sha256sum(hub, tmp_path):
    """The format is sha256sum's, the one the staging play reads: the files laid out as the hub has them pass."""
    assert pin(hub, tmp_path).returncode == 0
    for path, data in FILES.items():
        (tmp_path / "model" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "model" / path).write_bytes(data)
    check = subprocess.run(["sha256sum", "--check", "--strict", str(tmp_path / "target.sha256")],
                           cwd=tmp_path / "model", capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(": OK") == len(FILES) - 1, check.stdout + check.stderr


def test_a_small_file_whose_bytes_are_not_the_commits_is_refused(hub, tmp_path):
    hub.tampered = {"config.json"}
    p = pin(hub, tmp_path)
    assert p.returncode == 1 and f"{REPO}/config.json: the bytes downloaded have git blob id" in p.stderr
    assert not (tmp_path / "target.sha256").exists()


def test_an_unknown_revision_or_repository_is_named(hub, tmp_path):
    p = pin(hub, tmp_path, revision="v9-nonexistent")
    assert p.returncode == 1 and "revision 'v9-nonexistent': the hub answered 404 (RevisionNotFoundError)" in p.stderr
    commit = pin(hub, tmp_path, revision="0" * 40)
    assert commit.returncode == 1 and "404" in commit.stderr


def test_a_gated_model_needs_hf_token_which_no_output_shows(hub, tmp_path):
    hub.gated = True
    refused = pin(hub, tmp_path)
    assert refused.returncode == 1 and "401" in refused.stderr and "HF_TOKEN" in refused.stderr
    ok = pin(hub, tmp_path, token=TOKEN)
    assert ok.returncode == 0, ok.stderr
    assert TOKEN not in ok.stdout + ok.stderr + (tmp_path / "target.sha256").read_text()



def test_the_printed_entry_names_the_list_where_the_inventory_finds_it(tmp_path):
    """Issue 71: the entry printed the file name alone, so the README's `--out inventory/site/models/target.sha256`
    gave `{{ inventory_dir }}/target.sha256`, which the input check refused; now every folder between is kept."""
    inventory = tmp_path / "site"
    (inventory / "models").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("k26: {}\n")
    assert pin_model.digests_path(inventory / "models" / "target.sha256") == "{{ inventory_dir }}/models/target.sha256"
    assert pin_model.digests_path(inventory / "target.sha256") == "{{ inventory_dir }}/target.sha256"
    loose = tmp_path / "elsewhere" / "t.sha256"
    assert pin_model.digests_path(loose) == str(loose.resolve())            # no inventory above: the absolute path

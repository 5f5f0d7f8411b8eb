"""The shell blocks of the README and every doc: each one says where its commands run (a test, or the real host
only), and the reference engine's block (docs/reference-engine.md) runs here as written (a free port, a scratch
folder)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from .conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "docs/reference-engine.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKED = re.compile(r"<!-- commands (tested: (?P<tests>[^>]*?)|real host only[^>]*?) -->\n```bash\n", re.S)


def test_every_shell_block_says_where_its_commands_run():
    for name, text in ((p.relative_to(ROOT), p.read_text()) for p in DOCS if "```bash\n" in p.read_text()):
        blocks = text.count("```bash\n")
        marked = list(MARKED.finditer(text))
        assert blocks == len(marked) > 0, f"a ```bash block of {name} lacks its <!-- commands ... --> line"
        for m in marked:
            for path in re.findall(r"(?:tests|\.ci)/[\w./]+", m.group(0)):
                assert (ROOT / path).exists(), path


def reference_block() -> str:
    found = re.search(r"<!-- commands tested: tests/serve/test_readme_commands.py -->\n```bash\n(.*?)```", REFERENCE,
                      re.S)
    assert found, "docs/reference-engine.md has no reference engine block"
    return found.group(1)


def commands(block: str) -> list[str]:
    """Lines joined at trailing backslashes, comments after two spaces dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.split("  #", 1)[0].strip() for line in joined.splitlines() if line.strip()]


def test_the_reference_engine_block_runs_as_written(tmp_path):
    port = free_port()
    init, serve, curl = [c.replace("/tmp/pair", str(tmp_path / "pair")).replace("30000", str(port))
                         for c in commands(reference_block())]
    (tmp_path / "k26.yaml").write_text('api-key: "KEY"\n')           # what the block's comment says it holds
    bin_dir = Path(sys.executable).parent
    subprocess.run([sys.executable, *shlex.split(init)[1:]], check=True, capture_output=True, timeout=300, cwd=tmp_path)
    argv = shlex.split(serve)
    server = subprocess.Popen([str(bin_dir / argv[0]), *argv[1:]], cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            assert server.poll() is None, "ddtree-serve exited"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        out = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=120, check=True).stdout
        answer = json.loads(out)
        assert isinstance(answer["choices"][0]["text"], str)
        assert answer["sglext"]["spec_tokens_details"]["spec_verify_ct"] >= 1
    finally:
        server.terminate()
        server.wait(timeout=60)

"""The production example's unit, run as rendered on the GPU test bed, with the playbooks' clients.

The plan (testbed/production_plan.py, rendered on the controller from inventory/production
through the real templates, changed only as testbed/testbed.yml lists) names six servers:
the example's DDTREE, a second DDTREE (a second host, for the gateway), and the configurations
validate.yml and sweep.yml switch to (DFLASH, NONE, DDTREE without CUDA graphs, DDTREE budget 8 /
cap 4). Each is started with exactly its rendered ExecStart, in its WorkingDirectory, with the
environment of its EnvironmentFiles plus testbed.yml's additions; then every client the playbooks
run is run against it, unchanged (tests/playbook_clients.py renders them from their task files):
the deploy's health + smoke, validate's client and tools/validate_report.py, the sweep's client and
tools/sweep_report.py, the JIT warm-up, and smg (roles/gateway/files/k26_gateway.py from its pinned wheel) in
front of the two DDTREE servers: status, probe, take-out and put-back under load.
What systemd itself adds (User=, the sandboxing directives, DeviceAllow) does not run here.
Run by testbed/run.sh --production (which trains and exports the pair first).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import playbook_clients as pc
from testbed import production_plan as pp

from testbed import servers as harness

pytestmark = pytest.mark.sglang_gpu

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 1200                    # first start on a fresh machine: JIT builds, graph capture
VALIDATE_SERVERS = {"NONE": "NONE", "DFLASH": "DFLASH", "DDTREE-graphs": "DDTREE", "DDTREE-eager": "DDTREE-eager"}
SWEEP_SERVERS = ["DFLASH", "NONE", "DDTREE", "DDTREE-b8-c4"]


def _out() -> Path:
    return Path(os.environ.get("SGLANG_DDTREE_OUT", "/tmp/sglang-gpu"))


@pytest.fixture(scope="session")
def plan() -> dict:
    path = Path(os.environ.get("K26_TESTBED_PLAN", ROOT / ".testbed/plan.json"))
    if not path.exists():
        pytest.skip(f"no test-bed plan at {path}: render it on the controller (testbed/production_plan.py)")
    return json.loads(path.read_text())


def variable(plan: dict, name: str) -> str:
    return str(plan["testbed"]["variables"][name]["value"])


@dataclass
class Started:
    name: str
    port: int
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen
    log: Path
    ready_after: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def prepare_host(plan: dict) -> dict:
    """The files a deploy would have put on the host, at the test bed's places: the config file
    (rendered, holds the example vault's key), the state directory, the venv's executables (the
    staged SGLang's console script, python), the models (the exported test pair)."""
    config_dir, state, venv = (Path(variable(plan, k)) for k in ("k26_config_dir", "k26_state_dir", "k26_venv"))
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "k26-ddtree.yaml").write_text(plan["servers"]["DDTREE"]["config"])
    (config_dir / "k26-ddtree.yaml").chmod(0o640)
    state.mkdir(parents=True, exist_ok=True)
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    exe = shutil.which("python3")          # the image's venv python, by its own path (keeps that venv)
    # bin/sglang as pip writes a console script for SGLang's entry point (sglang.cli.main:main; pip
    # --target leaves none), under the __main__ guard that spawned scheduler processes rely on
    sglang = venv / "bin/sglang"
    sglang.write_text(f"#!{exe}\nimport re\nimport sys\nfrom sglang.cli.main import main\n"
                      "if __name__ == \"__main__\":\n"
                      "    sys.argv[0] = re.sub(r\"(-script\\.pyw|\\.exe)?$\", \"\", sys.argv[0])\n"
                      "    sys.exit(main())\n")
    sglang.chmod(0o755)
    # bin/python: the image's venv interpreter (a symlink would lose that venv's site-packages)
    python = venv / "bin/python"
    python.unlink(missing_ok=True)
    python.write_text(f"#!/bin/sh\nexec {exe} \"$@\"\n")
    python.chmod(0o755)
    # bin/ninja: SGLang's JIT builds run it by name (the production venv has pip's ninja there)
    ninja = venv / "bin/ninja"
    if not ninja.exists():
        ninja.symlink_to(shutil.which("ninja"))
    for name in ("k26_model_path", "k26_draft_model_path"):
        if not (Path(variable(plan, name)) / "config.json").exists():
            raise FileNotFoundError(f"{name}={variable(plan, name)} has no config.json: run.sh exports the pair there")
    return {"cuda_home_nvcc": (Path(variable(plan, "k26_gpu_cuda_home")) / "bin/nvcc").exists()}


def start(plan: dict, name: str) -> Started:
    server = plan["servers"][name]
    env = pp.process_env(server["environment"], plan["testbed"], os.environ.get("PYTHONPATH", ""))
    log = _out() / "logs" / f"production-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        proc = subprocess.Popen(server["argv"], cwd=variable(plan, "k26_state_dir"), env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Started(name, server["port"], server["argv"], env, proc, log)


def wait_healthy(server: Started, t0: float, timeout: float) -> None:
    while time.monotonic() - t0 < timeout and server.proc.poll() is None:
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
                if r.status == 200:
                    server.ready_after = round(time.monotonic() - t0, 1)
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)


@pytest.fixture(scope="session")
def host(plan) -> dict:
    return prepare_host(plan)


@pytest.fixture(scope="session")
def servers(plan, host):
    started = {name: start(plan, name) for name in plan["servers"]}
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(started)) as pool:
        list(pool.map(lambda s: wait_healthy(s, t0, START_TIMEOUT), started.values()))
    yield started
    for server in started.values():
        harness.stop_group(server.proc, 60)


def healthy(servers: dict, name: str) -> Started:
    server = servers[name]
    if server.ready_after is None:
        pytest.fail(f"{name} never answered /health 200 (exit {server.proc.poll()}): {server.log_tail(1500)}")
    return server


def site(plan: dict, server: Started, tmp: Path) -> pc.Site:
    prompts = tmp / "validate-prompts.json"
    if not prompts.exists():
        shutil.copy(ROOT / "validation/prompts.json", prompts)
    config = str(Path(variable(plan, "k26_config_dir")) / "k26-ddtree.yaml")
    return pc.Site(port=server.port, config_file=config, served_model_name="kimi-k2.6", python=shutil.which("python3"),
                   paths={"/var/lib/k26-rollback/validate-prompts.json": str(prompts)})


def run_call(call: pc.ClientCall, timeout: float = 1800, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], **call.env, **(extra_env or {})}
    return subprocess.run(call.argv, env=env, capture_output=True, text=True, timeout=timeout)


def calls_of(plan, server, tmp) -> dict[str, pc.ClientCall]:
    algorithm = {"DDTREE-eager": "DDTREE", "DDTREE-b8-c4": "DDTREE", "DDTREE-2": "DDTREE"}.get(server.name,
                                                                                                server.name)
    return {c.name: c for c in pc.server_calls(site(plan, server, tmp), algorithm)}


# --- the started process is the rendered unit ------------------------------------------------------

@pytest.mark.parametrize("name", list(pp.SERVERS))
def test_the_started_process_runs_the_rendered_command_line(plan, servers, name, record_property):
    server = servers[name]
    if server.proc.poll() is not None:
        pytest.fail(f"{name} exited with {server.proc.returncode}: {server.log_tail(2000)}")
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().split(b"\0")[:-1]
    words = [w.decode() for w in cmdline]
    rendered = pp.exec_start(plan["servers"][name]["unit"])      # read again from the unit's text
    interpreter = words[: len(words) - len(rendered)]
    record_property("pid", server.proc.pid)
    assert words[len(interpreter):] == rendered, f"started {words}, rendered {rendered}"
    # the executable is a Python console script: the kernel puts its interpreter in front, nothing else
    assert len(interpreter) == 1 and Path(interpreter[0]).name.startswith("python"), interpreter
    environ = dict(e.split("=", 1) for e in Path(f"/proc/{server.proc.pid}/environ").read_text().split("\0") if e)
    expected = pp.process_env(pp.Rendered(plan["servers"][name]["unit"], plan["servers"][name]["env"],
                                          plan["servers"][name]["gpu_env"], "").environment,
                              plan["testbed"], os.environ.get("PYTHONPATH", ""))
    assert environ == expected, {k: (environ.get(k), expected.get(k)) for k in set(environ) ^ set(expected)}
    healthy(servers, name)
    record_property("healthy_after_s", server.ready_after)


# --- the deploy's verify role: health + smoke -------------------------------------------------------

@pytest.mark.parametrize("name", list(pp.SERVERS))
def test_the_deploys_health_and_smoke_pass(plan, servers, name, tmp_path_factory, record_property):
    server = healthy(servers, name)
    with urllib.request.urlopen(server.url + "/health", timeout=60) as r:     # roles/verify/tasks/health.yml (uri)
        assert r.status == 200
    calls = calls_of(plan, server, tmp_path_factory.mktemp("verify"))
    info = run_call(calls["verify: read /model_info"], 120)
    assert info.returncode == 0, info.stdout[-500:] + info.stderr[-1500:]
    smoke = run_call(calls["verify: smoke"], 600)
    assert smoke.returncode == 0, smoke.stdout[-1500:] + smoke.stderr[-1500:]
    result = json.loads(smoke.stdout.splitlines()[-1])
    record_property("tokens_per_s", result["tokens_per_s"])
    record_property("accept_length", result["accept_length"])
    record_property("texts", [t[:40] for t in result["texts"]])


# --- validate.yml's client and report ---------------------------------------------------------------

def test_validate_passes_with_the_playbooks_client_and_report(plan, servers, tmp_path_factory, record_property):
    out = tmp_path_factory.mktemp("validate-results")
    tmp = tmp_path_factory.mktemp("validate")

    def one(item):
        config, name = item
        server = healthy(servers, name)
        algorithm = "NONE" if config == "NONE" else ("DFLASH" if config == "DFLASH" else "DDTREE")
        call = next(c for c in pc.server_calls(site(plan, server, tmp), algorithm) if c.name.startswith("validate"))
        r = run_call(call, 3000)
        assert r.returncode == 0, f"{config}: {r.stderr[-1500:]}"
        (out / f"{config}.json").write_text(r.stdout.splitlines()[-1] + "\n")   # the playbook keeps the last line

    with ThreadPoolExecutor(len(VALIDATE_SERVERS)) as pool:
        list(pool.map(one, VALIDATE_SERVERS.items()))
    margin = str(pc.play_vars("playbooks/validate.yml")["validate_near_tie_margin"])   # the playbook's own
    report = subprocess.run(["python3", str(ROOT / "tools/validate_report.py"), str(out), margin],
                            capture_output=True, text=True, timeout=300)
    shutil.copy(out / "report.md", _out() / "validate-report.md")
    record_property("verdict", report.stdout.strip().splitlines()[0] if report.stdout else report.stderr[-300:])
    summary = json.loads((out / "results.json").read_text())
    for s in summary["configurations"]:
        record_property(s["config"], {"accept": s["accept_length_mean"], "tok/s c1": s["tokens_per_s_c1"],
                                      "errors": s["errors"]})
    gaps = reference_gaps(summary, json.loads((out / "NONE.json").read_text()))
    record_property("float32 reference gap at each divergence (NONE's token minus the one taken)", gaps)
    (_out() / "validate-float32-gaps.json").write_text(json.dumps(gaps, indent=1) + "\n")
    assert report.returncode == 0, (out / "report.md").read_text()[-3000:]
    # a bf16 flip between two tokens the target itself nearly ties; a wrong position or parent in the
    # tree costs whole nats (the export test's bound on |d log p| is the same 0.5)
    assert all(abs(g["float32_gap"]) < FLOAT32_TIE for g in gaps), gaps


FLOAT32_TIE = 0.5


def reference_gaps(summary: dict, none_run: dict) -> list[dict]:
    """For each first divergence from NONE in validate's report: the float32 reference target's
    log-prob of NONE's token minus that of the token the configuration took, on the same tokens
    (the prompt as SGLang tokenizes it: <bos> + bytes, then the common prefix). The reference
    pair is the trained one (SGLANG_DDTREE_REF), its weights rounded to bf16 as the export stores
    them: what SGLang computes, without bf16 activations."""
    import torch

    from ddtree.reference.pair import load_pair

    texts = {p["id"]: p["text"] for p in json.loads((ROOT / "validation/prompts.json").read_text())}
    outputs = {p["id"]: p["output_ids"] for p in none_run["prompts"]}
    pair = load_pair(Path(os.environ["SGLANG_DDTREE_REF"]), device="cuda", dtype=torch.float32)
    gaps = []
    with torch.no_grad():
        for prm in pair.target.parameters():
            prm.copy_(prm.to(torch.bfloat16).float())
        for config in summary["configurations"]:
            for pid, c in (config.get("prompts") or {}).items():
                if c["status"] not in ("near-tie", "mismatch") or c.get("got") is None:
                    continue
                ids = pair.tokenizer.encode(texts[pid]) + outputs[pid][:c["index"]]     # [T]
                logits = pair.target.forward_sequence(torch.tensor([ids], device="cuda")).logits[0, -1]  # [V]
                logp = torch.log_softmax(logits.float(), -1)
                gaps.append({"config": config["config"], "prompt": pid, "index": c["index"],
                             "bf16_margin": c["margin"],
                             "float32_gap": round(float(logp[c["expected"]] - logp[c["got"]]), 5),
                             "float32_best": int(logp.argmax())})
    return gaps


# --- sweep.yml's client and report ------------------------------------------------------------------

def sweep_config(plan: dict, name: str) -> dict:
    """The row labels sweep.yml combines with each load result (its _sweep_configs entries)."""
    overrides = plan["servers"][name]["overrides"]
    algorithm = overrides.get("k26_speculative_algorithm", "DDTREE")
    row = {"algorithm": algorithm, "cuda_graph": bool(overrides.get("k26_cuda_graph", True))}
    if algorithm == "DDTREE":
        row.update(budget=int(overrides.get("k26_ddtree_budget", 32)), topk_cap=int(overrides.get("k26_ddtree_topk_cap", 8)))
    return row


def test_the_sweep_measures_with_the_playbooks_client_and_report(plan, servers, tmp_path_factory, record_property):
    out = tmp_path_factory.mktemp("sweep-results")
    tmp = tmp_path_factory.mktemp("sweep")
    rows = []
    for name in SWEEP_SERVERS:           # one at a time, as the playbook switches configurations
        server = healthy(servers, name)
        config = sweep_config(plan, name)
        for call in (c for c in calls_of(plan, server, tmp).values() if c.name.startswith("sweep")):
            r = run_call(call, 1200)
            assert r.returncode == 0, f"{name} {call.name}: {r.stderr[-1500:]}"
            row = {**json.loads(r.stdout.splitlines()[-1]), **config, "status": "ok"}
            assert row["errors"] == 0, row
            rows.append(row)
    (out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    report = subprocess.run(["python3", str(ROOT / "tools/sweep_report.py"), str(out)], capture_output=True, text=True,
                            timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    shutil.copy(out / "results.md", _out() / "sweep-results.md")
    best = json.loads(report.stdout)
    record_property("best", {k: best["best"].get(k) for k in ("algorithm", "budget", "topk_cap", "temperature")})
    record_property("vs_dflash", best.get("vs_dflash"))
    record_property("vs_none", best.get("vs_none"))
    # the server's own counters answered (/metrics open without the key) for every speculative row
    assert all(r["server_accept_length"] for r in rows if r["algorithm"] != "NONE"), rows


# --- the gpu_host role's JIT warm-up ----------------------------------------------------------------

def test_the_jit_warmup_builds_the_tree_kernels(plan, host, tmp_path_factory, record_property):
    values = {"k26_venv": variable(plan, "k26_venv"), "k26_state_dir": variable(plan, "k26_state_dir"),
              "k26_gpu_cuda_home": variable(plan, "k26_gpu_cuda_home")}
    config = str(Path(variable(plan, "k26_config_dir")) / "k26-ddtree.yaml")
    call = pc.warmup_call(pc.Site(port=0, config_file=config, served_model_name="kimi-k2.6", values=values))
    additions = {k: str(v["value"]).replace("@PYTHONPATH@", os.environ.get("PYTHONPATH", ""))
                 for k, v in plan["testbed"]["env"].items()}
    r = run_call(call, 600, additions)
    record_property("cuda_home_has_nvcc", host["cuda_home_nvcc"])
    record_property("stdout", r.stdout.strip()[-200:])
    assert r.returncode == 0 and "built" in r.stdout, r.stdout[-1000:] + r.stderr[-2000:]


# --- smg in front of two DDTREE servers --------------------------------------------------------------

class Load:
    """Clients sending chat completions through the gateway until stopped; every answer counted."""

    def __init__(self, url: str, key: str, clients: int = 4):
        self.url, self.key, self.stop, self.ok, self.failed = url, key, threading.Event(), 0, []
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def loop(self) -> None:
        body = json.dumps({"model": "kimi-k2.6", "messages": [{"role": "user", "content": "def add(a, b):"}],
                           "max_tokens": 24, "temperature": 0}).encode()
        while not self.stop.is_set():
            req = urllib.request.Request(self.url + "/v1/chat/completions", data=body, method="POST",
                                         headers={"Authorization": f"Bearer {self.key}",
                                                  "content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    json.loads(r.read())["choices"][0]["message"]
                self.ok += 1
            except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
                self.failed.append(f"{type(err).__name__}: {getattr(err, 'code', '')} {str(err)[:200]}")

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=180)


def gateway_python(tmp: Path) -> str:
    """The gateway venv's python: the image's python3 with the pinned smg wheel's site first; smg's
    own requirements come from the staged test bed (setproctitle, grpcio-health-checking: the pins
    of requirements/gateway.txt) and the image (grpcio, PyYAML: the image's versions)."""
    wrapper = tmp / "python"
    path = f"{os.environ['K26_GATEWAY_SITE']}:{os.environ.get('PYTHONPATH', '')}"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={path} exec {shutil.which('python3')} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_smg_routes_drains_and_takes_back_a_server_under_load(plan, servers, tmp_path_factory, record_property):
    if not os.environ.get("K26_GATEWAY_SITE"):
        pytest.skip("K26_GATEWAY_SITE (smg from requirements/gateway.txt, installed with --target) is not set")
    first, second = healthy(servers, "DDTREE"), healthy(servers, "DDTREE-2")
    tmp = tmp_path_factory.mktemp("gateway")
    config = tmp / "gateway.yaml"
    config.write_text(plan["servers"]["DDTREE"]["gateway"])
    config.chmod(0o640)
    python = gateway_python(tmp)
    log = _out() / "logs" / "production-gateway.log"
    # the gateway unit's ExecStart: <prefix>/venv/bin/python <prefix>/bin/k26_gateway.py serve --config <file>
    gateway = subprocess.Popen([python, str(pc.GATEWAY_TOOL), "serve", "--config", str(config)],
                               stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        s = pc.Site(port=first.port, config_file=str(Path(variable(plan, "k26_config_dir")) / "k26-ddtree.yaml"),
                    served_model_name="kimi-k2.6",
                    values={"k26_gateway_probe_model": "kimi-k2.6", "k26_gateway_workers": [first.url, second.url]},
                    paths={"/opt/k26-gateway/venv/bin/python": python,
                           "/opt/k26-gateway/bin/k26_gateway.py": str(pc.GATEWAY_TOOL),
                           "/etc/k26-gateway/gateway.yaml": str(config)})
        calls = pc.gateway_calls(s, second.url)

        def status() -> list[dict]:
            r = run_call(calls["gateway: pool status"], 60)
            return json.loads(r.stdout) if r.returncode == 0 else []

        def ready_urls() -> list[str]:
            return sorted(w["url"] for w in status() if w["healthy"] and w["status"] == "ready")

        deadline = time.monotonic() + 180
        while ready_urls() != sorted([first.url, second.url]):
            assert time.monotonic() < deadline and gateway.poll() is None, f"pool never ready: {status()} " \
                                                                             f"{log.read_text()[-1500:]}"
            time.sleep(2)
        probe = run_call(calls["gateway: probe"], 300)
        assert probe.returncode == 0, probe.stdout + probe.stderr[-1500:]
        record_property("probe", probe.stdout.strip())
        api_key = next(line.split(":", 1)[1].strip().strip('"') for line in config.read_text().splitlines()
                       if line.startswith("api_key:"))
        load = Load(f"http://127.0.0.1:{plan['gateway']['port']}", api_key)
        time.sleep(5)
        out = run_call(calls["gateway: take-out"], 700)
        assert out.returncode == 0, out.stderr[-1500:]
        after_out = status()
        time.sleep(5)
        back = run_call(calls["gateway: put-back"], 400)
        assert back.returncode == 0, back.stderr[-1500:]
        time.sleep(5)
        load.finish()
        record_property("requests_ok", load.ok)
        record_property("requests_failed", len(load.failed))
        assert second.url not in [w["url"] for w in after_out], after_out
        assert ready_urls() == sorted([first.url, second.url])
        assert load.ok > 0 and not load.failed, load.failed[:3]
    finally:
        gateway.send_signal(signal.SIGTERM)
        try:
            gateway.wait(timeout=30)
        except subprocess.TimeoutExpired:
            gateway.kill()

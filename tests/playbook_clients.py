"""The client commands the playbooks run against a k26-ddtree server, read from their task files.

Each command is taken from the task that runs it (`ansible.builtin.script` cmd or
`ansible.builtin.command` argv, and its `environment`) and rendered with jinja2 from the same
defaults the play sees (role defaults, the playbook's own vars) plus the values of the place it
runs (port, served model name, the server's config file). The host paths in the result (the
client scripts' folders, the gateway's prefix, validate's prompt copy) are then mapped to local
files, each mapping listed in `Site.paths`. So the commands are the playbooks' own; nothing here
restates their arguments:
  - tests/sglang/test_client_requests.py sends them to a loopback capture server and runs every
    request they make through the plugin's per-request check with SGLang's own request objects;
  - tests/gpu_sglang/test_production_path.py runs them against `sglang serve` on the GPU test bed.
Standard library + jinja2 + PyYAML (present in every venv that runs these tests).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "roles/verify/files/k26_client.py"
GATEWAY_TOOL = ROOT / "roles/gateway/files/k26_gateway.py"
BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}

# (call name, task file, task name): every place a playbook runs a client against a server
VERIFY_MODEL_INFO = ("verify: read /model_info", "roles/verify/tasks/health.yml",
                     "Read /model_info (the client reads the API key from the server's config file)")
VERIFY_SMOKE = ("verify: smoke", "roles/verify/tasks/smoke.yml",
                "Send smoke chat completions (temperature 0 twice, then 0.7)")
VALIDATE = ("validate", "playbooks/tasks/validate_one.yml", "Run the prompt set at temperature 0")
SWEEP = ("sweep", "playbooks/tasks/sweep_one.yml", "Run the prompt set")
GATEWAY_STATUS = ("gateway: pool status", "roles/gateway/tasks/verify.yml",
                  "Wait until every k26 host is healthy, ready and takes the gateway's key in its pool")
GATEWAY_HEALTH = ("gateway: health", "roles/gateway/tasks/configure.yml", "Wait until the gateway answers /health")
# reads two files on the gateway host and calls no server (listed so the scan below stays exact)
GATEWAY_CHECK_TLS = ("gateway: check-tls", "roles/gateway/tasks/configure.yml",
                     "Check that the TLS certificate and key belong together")
GATEWAY_PROBE = ("gateway: probe", "roles/gateway/tasks/verify.yml",
                 "Send completions through the gateway (the clients' key is read from its file on the host)")
GATEWAY_TAKE_OUT = ("gateway: take-out", "roles/gateway/tasks/take_out.yml",
                    "Take this host out of the gateway's pool and wait for its requests to drain")
GATEWAY_PUT_BACK = ("gateway: put-back", "roles/gateway/tasks/put_back.yml",
                    "Put this host back into the gateway's pool and wait until it is routed to")
GATEWAY_POOL_AS_LEFT = ("gateway: pool as an earlier run left it", "playbooks/deploy.yml",
                        "Read the pool as an earlier run left it")
JIT_WARMUP = ("gpu_host: JIT warm-up", "roles/gpu_host/tasks/warmup.yml",
              "Build the plugin's JIT kernels as the service user (cached under the state directory)")
ALL_TASKS = (VERIFY_MODEL_INFO, VERIFY_SMOKE, VALIDATE, SWEEP, GATEWAY_STATUS, GATEWAY_HEALTH, GATEWAY_CHECK_TLS,
             GATEWAY_PROBE, GATEWAY_TAKE_OUT, GATEWAY_PUT_BACK, GATEWAY_POOL_AS_LEFT, JIT_WARMUP)


@dataclass(frozen=True)
class Site:
    """Where the commands run: the server under test and the local stand-ins for host paths."""
    port: int
    config_file: str                      # the server's config file (api-key line), K26_CONFIG_FILE
    served_model_name: str
    python: str = sys.executable          # runs the client scripts (ansible.builtin.script runs them with python3)
    values: dict = field(default_factory=dict)   # more play variables (k26_venv, k26_state_dir, gateway settings)
    paths: dict = field(default_factory=dict)    # host path -> local path, applied to every rendered word


@dataclass(frozen=True)
class ClientCall:
    name: str                 # e.g. "sweep (temperature 0.7)"
    source: str               # the task file it was read from
    argv: list[str]
    env: dict[str, str]


def _yaml(rel: str):
    return yaml.safe_load((ROOT / rel).read_text())


def find_task(rel: str, name: str) -> dict:
    """The task called `name` in a task file or a playbook's plays, looking inside block/rescue/always."""
    stack = list(_yaml(rel))
    while stack:
        task = stack.pop(0)
        if task.get("name") == name and "block" not in task and "tasks" not in task:
            return task
        for key in ("tasks", "block", "rescue", "always"):
            stack.extend(task.get(key) or [])
    raise LookupError(f"{rel} has no task named {name!r}: the playbook changed; update tests/playbook_clients.py")


def _lookup(kind: str, term: str, default: str | None = None) -> str:
    """Ansible's env and pipe lookups, as the controller answers them."""
    if kind == "ansible.builtin.env":
        return os.environ.get(term, default if default is not None else "")
    if kind == "ansible.builtin.pipe":
        return subprocess.run(term, shell=True, capture_output=True, text=True, check=True).stdout.rstrip("\n")
    raise LookupError(f"tests/playbook_clients.py does not render lookup({kind!r}): add it")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.globals["lookup"] = _lookup
    env.filters["quote"] = lambda v: shlex.quote(str(v))
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else BOOLS[str(v).lower()]
    return env


def play_vars(playbook: str) -> dict:
    """The `vars` of a playbook's first play of its own (not an import_playbook line; values with
    templates are left as written)."""
    return dict(next(p for p in _yaml(playbook) if "hosts" in p).get("vars") or {})


def role_defaults(role: str) -> dict:
    return dict(_yaml(f"roles/{role}/defaults/main.yml") or {})


def _render(value, variables: dict) -> str:
    text = str(value)
    return _environment().from_string(text).render(**variables) if "{{" in text else text


def _mapped(word: str, site: Site) -> str:
    return site.paths.get(word, word)


def render_call(spec: tuple[str, str, str], site: Site, variables: dict, label: str = "") -> ClientCall:
    """One task's command, rendered with `variables`, host paths mapped to the site's."""
    name, rel, task_name = spec
    task = find_task(rel, task_name)
    env = {k: _mapped(_render(v, variables), site) for k, v in (task.get("environment") or {}).items()}
    if "ansible.builtin.script" in task:
        words = shlex.split(_render(task["ansible.builtin.script"]["cmd"], variables))
        script = Path(words[0]) if words[0].startswith("/") else ROOT / Path(rel).parents[1] / words[0]
        argv = [site.python, str(script.resolve()), *(_mapped(w, site) for w in words[1:])]
    else:
        argv = [_mapped(_render(w, variables), site) for w in task["ansible.builtin.command"]["argv"]]
    return ClientCall(f"{name}{' (' + label + ')' if label else ''}", rel, argv, env)


def base_variables(site: Site) -> dict:
    values = {**role_defaults("k26_defaults"), **role_defaults("verify"), **role_defaults("gateway")}
    values.update(k26_port=site.port, k26_verify_host="127.0.0.1", k26_served_model_name=site.served_model_name,
                  k26_api_key_file=site.config_file, k26_config_dir=str(Path(site.config_file).parent),
                  playbook_dir=str(ROOT / "playbooks"), role_path=str(ROOT / "roles/gateway"),
                  ansible_play_name="Deploy k26-ddtree")
    values.update(site.values)
    return values


def server_calls(site: Site, algorithm: str) -> list[ClientCall]:
    """Every command the playbooks run against one server: the deploy's verify role (its /health GET
    is an `uri` task), validate.yml's client for this configuration, sweep.yml's for each of its
    temperatures (at its default load)."""
    values = base_variables(site)
    calls = [render_call(VERIFY_MODEL_INFO, site, values), render_call(VERIFY_SMOKE, site, values)]
    validate = {**play_vars("playbooks/validate.yml"), **values}
    calls.append(render_call(VALIDATE, site, {**validate, "validate_config": {"name": algorithm,
                                                                              "algorithm": algorithm}}, algorithm))
    sweep = {**play_vars("playbooks/sweep.yml"), **values}
    # the task loops over temperature x load (sweep_concurrency_levels, else sweep_concurrency)
    for temperature in sweep["sweep_temperatures"]:
        item = [temperature, sweep["sweep_concurrency"]]
        calls.append(render_call(SWEEP, site, {**sweep, "item": item}, f"temperature {temperature}"))
    return calls


def gateway_calls(site: Site, worker_url: str) -> dict[str, ClientCall]:
    """The gateway role's commands (status, health, probe) and the pool's (take-out, put-back of worker_url)."""
    values = {**base_variables(site), "k26_gateway_worker_url": worker_url}
    return {spec[0]: render_call(spec, site, values) for spec in (GATEWAY_STATUS, GATEWAY_HEALTH, GATEWAY_PROBE,
                                                                   GATEWAY_TAKE_OUT, GATEWAY_PUT_BACK,
                                                                   GATEWAY_POOL_AS_LEFT)}


def warmup_call(site: Site) -> ClientCall:
    return render_call(JIT_WARMUP, site, base_variables(site))

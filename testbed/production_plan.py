"""The production example's k26-ddtree unit rendered for the GPU test bed, and how to read it.

On the controller (the test venv, with Ansible):
    python -m testbed.production_plan OUT_DIR
renders inventory/production through the real templates and group variables
(testbed/render.yml) once per test-bed server, with the substitutions of
testbed/testbed.yml, and writes OUT_DIR/plan.json: each server's rendered unit, env files
and config file, its command line and environment as systemd would start it, and the gateway file.
It refuses to write a plan whose command lines differ from the example's in anything testbed.yml
does not list (explain_difference). On the GPU machine (no Ansible) tests/gpu_sglang/
test_production_path.py starts each server from the plan and checks the started process against it.
Standard library + PyYAML at import (both sides).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed.ansible_run import BIN, DEMO_VAULT_PASSWORD, run

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "testbed/testbed.yml"
HOST = "k26-gpu-01"                       # the example inventory's host
# systemd's default PATH for services (the unit sets none)
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SAFE_WORD = re.compile(r"[A-Za-z0-9._:/,=@+-]+")   # what the templates leave unquoted (k26_exec_word)
# test-bed servers -> the variables the playbooks themselves override for them (validate.yml's
# configurations, sweep.yml's budgets); DDTREE is the example as it is, DDTREE-2 a second host's
SERVERS = {
    "DDTREE": {},
    "DDTREE-2": {},
    "DFLASH": {"k26_speculative_algorithm": "DFLASH"},
    "NONE": {"k26_speculative_algorithm": "NONE"},
    "DDTREE-eager": {"k26_cuda_graph": False},
    "DDTREE-b8-c4": {"k26_ddtree_budget": 8, "k26_ddtree_topk_cap": 4},
}
BASE_PORT = 31100                         # server i listens on BASE_PORT + 10 i
GATEWAY_PORT, GATEWAY_METRICS_PORT = 31200, 31201
GATEWAY_ADMIN_KEY = "testbed-gateway-admin-key-0123"   # the example vault has none (a later issue)
# The gpu_host role's facts, which the example's own render needs: what the role finds on the
# production host (nvcc of the venv's NVIDIA wheels; NCCL P2P left on when its PCIe report finds no
# ACS redirection or translating IOMMU). testbed.yml sets the lent machine's.
EXAMPLE_FACTS = {"k26_gpu_cuda_home": "/opt/k26/current/venv/lib/python3.11/site-packages/nvidia/cu13",
                 "k26_gpu_p2p_disable": False}


def testbed() -> dict:
    return yaml.safe_load(TESTBED.read_text())


def port_of(name: str) -> int:
    return BASE_PORT + 10 * list(SERVERS).index(name)


# --- reading rendered files (as systemd reads them) -------------------------------------------

def exec_start(unit: str) -> list[str]:
    """The ExecStart command line of a rendered unit, one word per element. The templates quote
    only words outside SAFE_WORD (k26_exec_word), where shell and systemd splitting agree; a quoted
    word would need systemd's own rules, so it is refused rather than guessed."""
    lines = unit.split("\nExecStart=", 1)[1].splitlines()
    joined = []
    for line in lines:
        joined.append(line.rstrip().rstrip("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    words = shlex.split(" ".join(joined))
    odd = [w for w in words if not SAFE_WORD.fullmatch(w)]
    if odd:
        raise ValueError(f"ExecStart has quoted words {odd}: parse them by systemd's rules before comparing")
    return words


def env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines of a rendered EnvironmentFile (comments and blank lines skipped)."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, value = line.split("=", 1)
        words = shlex.split(value) if value.strip() else [""]
        if len(words) != 1:
            raise ValueError(f"env line {line!r} is not one value")
        out[key.strip()] = words[0]
    return out


def flag_pairs(argv: list[str]) -> list[tuple[str, str | None]]:
    """['--a', 'x', '--b'] -> [('--a', 'x'), ('--b', None)] (after the executable and `serve`)."""
    pairs: list[tuple[str, str | None]] = []
    for word in argv:
        if word.startswith("--"):
            pairs.append((word, None))
        elif pairs:
            flag, value = pairs[-1]
            pairs[-1] = (flag, word if value is None else f"{value} {word}")
    return pairs


@dataclass(frozen=True)
class Rendered:
    unit: str
    env: str
    gpu_env: str
    config: str

    @property
    def argv(self) -> list[str]:
        return exec_start(self.unit)

    @property
    def environment(self) -> dict[str, str]:
        """The unit's environment: gpu-host.env, then k26-ddtree.env (read after it, so it wins)."""
        return {**env_file(self.gpu_env), **env_file(self.env)}


def explain_difference(production: Rendered, test: Rendered, bed: dict) -> list[str]:
    """Every difference between the example's and the test bed's render that testbed.yml does not
    list (empty: the test bed changes only what it says)."""
    problems = []
    variables = bed["variables"]
    want_exe = f"{variables['k26_venv']['value']}/bin/sglang"
    if test.argv[:2] != [want_exe, "serve"] or production.argv[1] != "serve":
        problems.append(f"executable {test.argv[:2]} is not {[want_exe, 'serve']} (k26_venv)")
    extra = [tuple((e["arg"].split(" ", 1) + [None])[:2]) for e in bed["extra_args"]]
    p_pairs, t_pairs = flag_pairs(production.argv[2:]), flag_pairs(test.argv[2:])
    if t_pairs[len(t_pairs) - len(extra):] != extra:
        problems.append(f"the command line does not end with testbed.yml's extra_args {extra}")
    t_pairs = t_pairs[:len(t_pairs) - len(extra)]
    if [f for f, _ in p_pairs] != [f for f, _ in t_pairs]:
        problems.append(f"flags differ: example {[f for f, _ in p_pairs]}, test bed {[f for f, _ in t_pairs]}")
    listed = {flag: str(v["value"]) for v in variables.values() for flag in v["flags"]}
    listed.update({flag: None for flag in bed["server_ports"]["flags"]})
    changed = {fp for (fp, vp), (_, vt) in zip(p_pairs, t_pairs) if vp != vt}
    for (flag, vp), (_, vt) in zip(p_pairs, t_pairs):
        if vp == vt:
            continue
        if flag not in listed:
            problems.append(f"{flag} {vt!r} differs from the example's {vp!r} and testbed.yml does not list it")
        elif listed[flag] is not None and vt != listed[flag] and not str(vt).startswith(listed[flag] + "/"):
            problems.append(f"{flag} {vt!r} is not testbed.yml's value {listed[flag]!r}")
    stale = {f for f, _ in p_pairs if f in listed} - changed
    if stale:
        problems.append(f"testbed.yml lists {sorted(stale)} but the render does not change them")
    pe, te = production.environment, test.environment
    if set(pe) != set(te):
        problems.append(f"env variables differ: only in the example {sorted(set(pe) - set(te))}, "
                        f"only in the test bed {sorted(set(te) - set(pe))}")
    allowed = [str(v["value"]) for v in variables.values()]
    # a value built from listed flags' values (K26_URL from --host and --port) follows their substitution
    flag_subs = [(vp, vt) for (flag, vp), (_, vt) in zip(p_pairs, t_pairs) if vp != vt and vp and vt and flag in listed]

    def substituted(text: str) -> str:
        for old, new in flag_subs:
            text = text.replace(old, new)
        return text

    for key in sorted(set(pe) & set(te)):
        if pe[key] != te[key] and substituted(pe[key]) != te[key] \
                and not any(te[key] == a or te[key].startswith(a + "/") for a in allowed):
            problems.append(f"env {key}={te[key]!r} differs from the example's {pe[key]!r} by no listed substitution")
    return problems


def process_env(rendered_env: dict[str, str], bed: dict, pythonpath: str) -> dict[str, str]:
    """What the runner starts a server with: systemd's PATH, the unit's env files, the test bed's
    additions (never over one of the unit's own variables)."""
    additions = {k: str(v["value"]).replace("@PYTHONPATH@", pythonpath) for k, v in bed["env"].items()}
    clash = sorted(set(additions) & set(rendered_env))
    if clash:
        raise ValueError(f"testbed.yml's env would override the unit's own {clash}")
    return {"PATH": SYSTEMD_PATH, **rendered_env, **additions}


# --- rendering (controller only) -------------------------------------------------------------

def production_extra_args() -> list[str]:
    engine = yaml.safe_load((ROOT / "inventory/production/group_vars/k26/engine.yml").read_text())
    return list(engine.get("k26_extra_args") or [])


def testbed_variables(name: str, bed: dict) -> dict:
    values = {k: v["value"] for k, v in bed["variables"].items()}
    values.update(k26_port=port_of(name), k26_extra_args=production_extra_args() + [e["arg"] for e in bed["extra_args"]])
    return values


def render(overrides: dict, tmp: Path, gateway: dict | None = None) -> tuple[Rendered, str | None]:
    """inventory/production through render.yml with `overrides` as extra variables."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    password = out / "vault-pass"
    password.write_text(DEMO_VAULT_PASSWORD + "\n")
    extra = {**overrides, "k26_render_dir": str(out / "files")}
    if gateway:
        extra.update(gateway, k26_render_gateway=True)
    (out / "files").mkdir()
    r = run([str(BIN / "ansible-playbook"), "-i", "inventory/production", "testbed/render.yml",
             "--vault-password-file", str(password), "-e", json.dumps(extra)], out)
    if r.returncode != 0:
        raise RuntimeError(f"render failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    files = out / "files"
    read = lambda suffix: (files / f"{HOST}{suffix}").read_text()   # noqa: E731
    rendered = Rendered(unit=read(".service"), env=read(".env"), gpu_env=read(".gpu-host.env"), config=read(".yaml"))
    gateway_text = (files / "gateway.yaml").read_text() if gateway else None
    return rendered, gateway_text


def build_plan(tmp: Path) -> dict:
    bed = testbed()
    example, _ = render(EXAMPLE_FACTS, tmp)
    servers = {}
    for name, overrides in SERVERS.items():
        gateway = None
        if name == "DDTREE":      # the gateway file in front of DDTREE and DDTREE-2
            gateway = {"k26_gateway_listen": "127.0.0.1", "k26_gateway_port": GATEWAY_PORT,
                       "k26_gateway_metrics_port": GATEWAY_METRICS_PORT, "k26_gateway_admin_key": GATEWAY_ADMIN_KEY,
                       "k26_gateway_workers": [f"http://127.0.0.1:{port_of(n)}" for n in ("DDTREE", "DDTREE-2")]}
        plain, _ = render({**EXAMPLE_FACTS, **overrides}, tmp)
        test, gateway_text = render({**overrides, **testbed_variables(name, bed)}, tmp, gateway)
        problems = explain_difference(plain, test, bed)
        if problems:
            raise SystemExit(f"{name}: the test bed's render differs from the example's beyond testbed.yml:\n- "
                             + "\n- ".join(problems))
        servers[name] = {"port": port_of(name), "overrides": overrides, "unit": test.unit, "env": test.env,
                         "gpu_env": test.gpu_env, "config": test.config, "argv": test.argv,
                         "environment": test.environment, "example_argv": plain.argv}
        if gateway_text:
            servers[name]["gateway"] = gateway_text
    return {"testbed": bed, "example_argv": example.argv, "servers": servers,
            "gateway": {"port": GATEWAY_PORT, "metrics_port": GATEWAY_METRICS_PORT}}


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else ROOT / ".testbed")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        plan = build_plan(Path(tmp))
    (out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    for name, server in plan["servers"].items():
        print(f"{name:14s} port {server['port']}: {' '.join(server['argv'][2:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

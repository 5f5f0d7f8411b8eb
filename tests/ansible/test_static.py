"""Ansible without a host: syntax, lint, templates, argument_specs, rendered units, preflight."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from .conftest import BIN, ROOT, load_filters, run

ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
PLAYBOOKS = ["deploy.yml"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "playbooks").glob("*.yml"))


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax(playbook, tmp_path):
    r = run([str(BIN / "ansible-playbook"), "--syntax-check", playbook], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ansible_lint_production_profile_is_clean(tmp_path):
    r = run([str(BIN / "ansible-lint"), "--offline", "--nocolor"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_every_template_parses():
    env = jinja2.Environment()
    templates = list((ROOT / "templates").rglob("*.j2"))
    assert templates
    for t in templates:
        env.parse(t.read_text())


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_cover_the_defaults_and_name_no_variable_without_one(role):
    """Every default of the role is an option of its specs; every option has a default, the role's own or
    a shared one (roles/k26_defaults), and a description."""
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    shared = yaml.safe_load((ROOT / "roles/k26_defaults/defaults/main.yml").read_text())
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    listed: set[str] = set()
    for entry, spec in specs.items():
        options = set(spec.get("options", {}))
        listed |= options
        assert options <= set(defaults) | set(shared), f"{role}:{entry} lists {sorted(options - set(defaults) - set(shared))}"
        for name, opt in spec["options"].items():
            assert opt.get("description"), f"{role}:{name} has no description"
    assert set(defaults) <= listed, f"{role}: defaults missing from its specs: {sorted(set(defaults) - listed)}"


@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads_as_a_table_of_contents(role):
    """Each entry point's task file is a list of named steps (k26_defaults has defaults only)."""
    entries = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    files = [ROOT / "roles" / role / "tasks" / f"{entry}.yml" for entry in entries]
    if role == "k26_defaults":
        assert not (ROOT / "roles" / role / "tasks").exists()
        return
    for path in files:
        tasks = yaml.safe_load(path.read_text())
        assert tasks and all(t["name"][0].isupper() for t in tasks), path
    handlers = ROOT / "roles" / role / "handlers" / "main.yml"
    assert not handlers.exists() or yaml.safe_load(handlers.read_text()), f"{handlers} is empty: remove it"


def render(inventory: str, tmp: Path, vault_pass: Path, *extra: str) -> dict[str, str]:
    out = tmp / "render"
    out.mkdir(exist_ok=True)
    r = run([str(BIN / "ansible-playbook"), "-i", f"inventory/{inventory}", "tests/ansible/render.yml",
             "--vault-password-file", str(vault_pass), "-e", f"k26_render_dir={out}", *extra], tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {p.name: p.read_text() for p in out.iterdir()}


def exec_flags(unit: str) -> list[str]:
    """The ExecStart arguments, one entry per rendered line ('--flag value')."""
    block = unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0]
    return [line.strip().rstrip("\\").strip() for line in block.splitlines()[1:]]


PRODUCTION_FLAGS = [
    "--model-path /srv/models/Kimi-K2.6", "--served-model-name kimi-k2.6", "--speculative-algorithm DDTREE",
    "--speculative-draft-model-path /srv/models/Kimi-K2.6-DFlash", "--speculative-dflash-block-size 8",
    "--speculative-ddtree-budget 8", "--speculative-ddtree-topk-cap 8", "--cuda-graph-max-bs-decode 48",
    "--tp 8", "--attention-backend triton", "--trust-remote-code", "--disable-overlap-schedule",
    "--max-running-requests 48", "--host 192.0.2.10", "--port 30000", "--enable-metrics",
    "--config /etc/k26/k26-ddtree.yaml",
    "--tool-call-parser kimi_k2", "--reasoning-parser kimi_k2", "--watchdog-timeout 1800",
]


def test_production_unit_has_exactly_the_expected_flags(tmp_path, vault_pass):
    files = render("production", tmp_path, vault_pass)
    unit, env, config = files["k26-gpu-01.service"], files["k26-gpu-01.env"], files["k26-gpu-01.yaml"]
    assert unit.split("ExecStart=", 1)[1].startswith("/opt/k26/current/venv/bin/sglang serve \\")
    assert exec_flags(unit) == PRODUCTION_FLAGS
    # the key is only in the config file (0640 root:k26 on the host), as the JSON string sglang's YAML reads
    assert "demo-api-key-replace-me" not in unit + env and 'api-key: "demo-api-key-replace-me"' in config
    for line in ("User=k26", "EnvironmentFile=/etc/k26/k26-ddtree.env", "Restart=on-failure", "TimeoutStartSec=3600",
                 "TimeoutStopSec=660", "KillMode=mixed", "LimitMEMLOCK=infinity", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "ReadWritePaths=/var/lib/k26",
                 "ProtectProc=invisible", "CapabilityBoundingSet=", "ProtectKernelModules=yes", "RestrictNamespaces=yes",
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK", "StartLimitBurst=4",
                 "DevicePolicy=closed", "DeviceAllow=char-nvidia-frontend rw", "DeviceAllow=char-nvidia-uvm rw",
                 "DeviceAllow=char-nvidia-caps rw", "LimitCORE=0", "After=nvidia-persistenced.service",
                 "Wants=nvidia-persistenced.service"):
        assert line in unit.splitlines(), line
    assert not any(line.startswith("PrivateDevices") for line in unit.splitlines())  # GPUs reachable (DeviceAllow)
    assert "NCCL_NVLS_ENABLE=0" in env and "EnvironmentFile=-/etc/k26/gpu-host.env" in unit.splitlines()
    nccl = yaml.safe_load((ROOT / "inventory/production/group_vars/k26/nccl.yml").read_text())
    assert nccl["k26_pcie_ipc_allreduce"] is True and nccl["k26_nccl_p2p"] == "auto"


def test_the_operations_doc_shows_the_production_command_line_as_rendered(tmp_path, vault_pass):
    unit = render("production", tmp_path, vault_pass)["k26-gpu-01.service"]
    rendered = "ExecStart=" + unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0]
    assert f"```\n{rendered}\n```" in (ROOT / "docs/operations.md").read_text()


def test_production_dflash_fallback_drops_exactly_the_two_ddtree_flags_and_the_overlap_switch(tmp_path, vault_pass):
    """...and runs SGLang's overlap scheduler (its default; k26_overlap_schedule auto keeps it off for DDTREE only)."""
    files = render("production", tmp_path, vault_pass, "-e", json.dumps({"k26_speculative_algorithm": "DFLASH"}))
    flags = [f.replace("DDTREE", "DFLASH") for f in PRODUCTION_FLAGS
             if "--speculative-ddtree" not in f and f != "--disable-overlap-schedule"]
    assert exec_flags(files["k26-gpu-01.service"]) == flags


def test_production_none_fallback_renders_no_speculative_flag(tmp_path, vault_pass):
    """sglang 0.5.23 takes `--speculative-algorithm NONE` for speculation on and its tokenizer manager
    dies on the first finished request (GPU test bed, 2026-12-01): NONE is SGLang's default, no flag."""
    files = render("production", tmp_path, vault_pass, "-e", json.dumps({"k26_speculative_algorithm": "NONE"}))
    flags = exec_flags(files["k26-gpu-01.service"])
    assert flags == [f for f in PRODUCTION_FLAGS if not f.startswith("--speculative") and f != "--disable-overlap-schedule"]
    # ddtree-serve defaults to DDTREE, so the sandbox's NONE keeps the flag
    (tmp_path / "s").mkdir()
    sandbox = render("sandbox", tmp_path / "s", vault_pass, "-e", json.dumps({"k26_speculative_algorithm": "NONE"}))
    assert "--speculative-algorithm NONE" in exec_flags(sandbox["sandbox.service"])


def test_the_code_running_and_random_weight_options_render_only_from_their_variables(tmp_path, vault_pass):
    """Issue 72: --enable-custom-logit-processor and --load-format dummy come from k26_custom_logit_processors and
    k26_load_format (off by default: the production line is unchanged), before the extra args, and the snapshot
    reader takes them back into those variables."""
    files = render("production", tmp_path, vault_pass, "-e",
                   json.dumps({"k26_custom_logit_processors": True, "k26_load_format": "dummy"}))
    unit = files["k26-gpu-01.service"]
    flags = exec_flags(unit)
    at = flags.index("--disable-overlap-schedule")
    assert flags[at + 1:at + 3] == ["--enable-custom-logit-processor", "--load-format dummy"], flags
    assert [f for f in flags if f not in flags[at + 1:at + 3]] == PRODUCTION_FLAGS
    read = load_filters("k26_snapshot").k26_snapshot_inputs(unit, files["k26-gpu-01.env"])
    assert read["k26_custom_logit_processors"] is True and read["k26_load_format"] == "dummy"
    assert read["k26_extra_args"] == ["--tool-call-parser kimi_k2", "--reasoning-parser kimi_k2", "--watchdog-timeout 1800"]
    # the one flag map (issue 73): every variable the template renders through it comes back as the render's value
    flag_map = yaml.safe_load((ROOT / "templates/etc/systemd/system/k26-ddtree.flags.yml").read_text())
    rendered = {f.split(" ", 1)[0]: f.split(" ", 1)[1] for f in flags if " " in f}
    for name, flag in flag_map["valued"].items():
        if flag in rendered:
            assert read[name] == rendered[flag], (name, flag)
    assert {"k26_model_path", "k26_ddtree_budget", "k26_tp_size", "k26_port", "k26_load_format"} <= set(read)


def test_the_units_path_has_the_venvs_bin_first(tmp_path, vault_pass):
    """SGLang's JIT builds run `ninja` by name; the venv holds it and systemd's default PATH does not
    (the first CUDA graph capture failed without it on the GPU test bed, 2026-12-01)."""
    env = render("production", tmp_path, vault_pass)["k26-gpu-01.env"]
    assert "PATH=/opt/k26/current/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in env.splitlines()


@pytest.mark.parametrize("graphs,budget,cap", [(True, 8, 4), (False, 32, 8), (False, 128, 16), (True, 512, 8)])
def test_rendered_flags_follow_graphs_and_budget(tmp_path, vault_pass, graphs, budget, cap):
    files = render("production", tmp_path, vault_pass, "-e",
                   json.dumps({"k26_cuda_graph": graphs, "k26_ddtree_budget": budget, "k26_ddtree_topk_cap": cap,
                               "k26_speculative_algorithm": "DDTREE"}))
    flags = exec_flags(files["k26-gpu-01.service"])
    assert f"--speculative-ddtree-budget {budget}" in flags and f"--speculative-ddtree-topk-cap {cap}" in flags
    assert ("--cuda-graph-max-bs-decode 48" in flags) == graphs
    assert ("--cuda-graph-backend-decode disabled" in flags) == (not graphs)
    assert len([f for f in flags if f.startswith("--speculative-ddtree-budget")]) == 1


@pytest.mark.parametrize("algorithm,overlap,disabled", [     # auto: the production example and the two tests above
    ("DFLASH", False, True), ("NONE", "false", True), ("DDTREE", "true", False), ("DDTREE", True, False)])
def test_the_overlap_scheduler_is_sglangs_default_but_for_ddtree_unless_set(tmp_path, vault_pass, algorithm, overlap,
                                                                             disabled):
    """auto: SGLang's default (overlap on) for NONE and DFLASH, off for DDTREE until issue 35 is proven; the
    operator's true or false (YAML bools or strings) for every algorithm."""
    files = render("production", tmp_path, vault_pass, "-e",
                   json.dumps({"k26_speculative_algorithm": algorithm, "k26_overlap_schedule": overlap}))
    flags = exec_flags(files["k26-gpu-01.service"])
    assert ("--disable-overlap-schedule" in flags) == disabled
    assert f"--speculative-algorithm {algorithm}" in flags or algorithm == "NONE"


def test_sandbox_unit_runs_ddtree_serve(tmp_path, vault_pass):
    files = render("sandbox", tmp_path, vault_pass)
    unit = files["sandbox.service"]
    assert unit.split("ExecStart=", 1)[1].startswith("/opt/k26/current/venv/bin/ddtree-serve \\")
    flags = exec_flags(unit)
    assert flags == [
        "--model-path /srv/models/tiny-seed0/target", "--served-model-name k26-sandbox-tiny",
        "--speculative-algorithm DDTREE", "--speculative-draft-model-path /srv/models/tiny-seed0/draft",
        "--speculative-dflash-block-size 4", "--speculative-ddtree-budget 16", "--speculative-ddtree-topk-cap 4",
        "--cuda-graph-backend-decode disabled", "--device cpu", "--dtype float32", "--graceful-timeout 600",
        "--max-running-requests 32", "--host 127.0.0.1", "--port 30000", "--enable-metrics", "--config /etc/k26/k26-ddtree.yaml"]
    # the rendered flags and config file are accepted by the real ddtree-serve parser, which takes the key
    # from the file
    from ddtree.serve.cli import parse_args, parser

    (tmp_path / "k26.yaml").write_text(files["sandbox.yaml"])
    argv = " ".join(flags).replace("/etc/k26/k26-ddtree.yaml", str(tmp_path / "k26.yaml")).split()
    args = parse_args(parser(), argv)
    assert str(args.speculative_ddtree_budget) == "16" and args.cuda_graph_backend_decode == "disabled"
    assert args.api_key == "sandbox-demo-key"
    # a host without GPUs: no ordering on the driver's daemon (it does not exist there); never a core file
    assert "nvidia-persistenced" not in unit and "LimitCORE=0" in unit.splitlines()


def test_a_budget_schedule_renders_as_written_and_ddtree_serve_takes_it(tmp_path, vault_pass):
    from ddtree.serve.cli import check_args, parse_args, parser

    files = render("sandbox", tmp_path, vault_pass, "-e",
                   json.dumps({"k26_ddtree_budget": "1:16,4:8,16:3", "k26_ddtree_topk_cap": "1:4,16:2"}))
    flags = exec_flags(files["sandbox.service"])
    assert "--speculative-ddtree-budget 1:16,4:8,16:3" in flags and "--speculative-ddtree-topk-cap 1:4,16:2" in flags
    ap = parser()
    args = parse_args(ap, " ".join(f for f in flags if not f.startswith("--config")).split())
    check_args(ap, args)
    assert [args.speculative_ddtree_budget.at(n) for n in (1, 4, 48)] == [16, 8, 3]


def test_the_width_policy_renders_as_written_and_the_plugin_reads_it(tmp_path, vault_pass):
    from ddtree.sglang.setup.server_env import block_to_env, schedule_from_env, schedule_to_env

    files = render("production", tmp_path, vault_pass, "-e", json.dumps({"k26_ddtree_budget": "auto:8,16"}))
    flags = exec_flags(files["k26-gpu-01.service"])
    assert "--speculative-ddtree-budget auto:8,16" in flags
    env: dict = {}
    schedule_to_env("auto:8,16", "8", env)
    block_to_env(8, env)
    assert schedule_from_env(env).choices() == ((0, 1), (7, 1), (8, 8), (16, 8))


@pytest.fixture(scope="module")
def pair_dir(visible_dir) -> Path:
    import sys

    out = visible_dir("pair")
    subprocess.run([sys.executable, "-m", "ddtree.reference.init", "--out", str(out)], check=True, capture_output=True)
    return out


BAD_PREFLIGHT = [
    ({"k26_ddtree_budget": 0}, "k26_ddtree_budget=0 is invalid: expected an integer 1..1023"),
    ({"k26_ddtree_budget": 1024}, "k26_ddtree_budget=1024 is invalid"),
    ({"k26_ddtree_budget": "lots"}, "k26_ddtree_budget=lots is invalid"),
    ({"k26_ddtree_topk_cap": 0}, "k26_ddtree_topk_cap=0 is invalid"),
    ({"k26_ddtree_topk_cap": 33}, "k26_ddtree_topk_cap=33 is invalid: expected an integer 1..k26_ddtree_budget (32)"),
    ({"k26_dflash_block_size": 1}, "k26_dflash_block_size=1 is invalid"),
    ({"k26_dflash_block_size": 8}, "k26_dflash_block_size=8 differs from the draft's block_size 4"),
    ({"k26_port": 0}, "k26_port=0 is invalid"),
    ({"k26_model_path": "/nonexistent"}, "k26_model_path=/nonexistent has no config.json"),
    ({"k26_speculative_algorithm": "EAGLE"}, "k26_speculative_algorithm"),
    ({"k26_min_free_disk_gb": 10**9}, "k26_min_free_disk_gb=1000000000"),
    ({"k26_min_driver_version": "R580"}, "k26_min_driver_version=R580 is invalid: expected a version"),
    ({"k26_nccl_p2p": "maybe"}, "k26_nccl_p2p=maybe is invalid: expected auto"),
    ({"k26_overlap_schedule": "sometimes"}, "k26_overlap_schedule=sometimes is invalid: expected auto, true or false"),
    ({"k26_overlap_schedule": True}, "k26_overlap_schedule=true is invalid with k26_server_kind=reference"),
    ({"k26_speculative_algorithm": "DDTREE", "k26_ddtree_budget": 2, "k26_ddtree_topk_cap": 1},
     "k26_ddtree_budget=2 is invalid with k26_dflash_block_size=4: the draft's block must fit in the verify window"),
    # a schedule by running batch size (ddtree-serve's): its form, and the rules at every batch size
    ({"k26_ddtree_budget": "8:32,16:8"}, "k26_ddtree_budget=8:32,16:8 is invalid: expected an integer 1..1023 or BATCH:VALUE"),
    ({"k26_ddtree_budget": "1:32,16:2000"}, "k26_ddtree_budget=1:32,16:2000 is invalid"),
    ({"k26_ddtree_budget": "1:32,16:8", "k26_ddtree_topk_cap": "1:8,16:16"},
     "from batch size 16: k26_ddtree_topk_cap=16 is invalid: expected an integer 1..k26_ddtree_budget (8)"),
    ({"k26_speculative_algorithm": "DDTREE", "k26_ddtree_budget": "1:32,8:2", "k26_ddtree_topk_cap": 1},
     "from batch size 8: k26_ddtree_budget=2 is invalid with k26_dflash_block_size=4"),
    ({"k26_server_kind": "sglang", "k26_speculative_algorithm": "DDTREE", "k26_attention_backend": "fa3"},
     "k26_attention_backend=fa3 cannot verify a DDTree with sglang"),
    ({"k26_api_key": ""}, "k26_api_key is empty: the server would run without authentication"),
    ({"k26_api_key": "short-key"}, "k26_api_key is 9 characters long (the value is not printed): expected at least 16"),
    ({"k26_api_key": "demo-api-key-replace-me"}, "k26_api_key is the demo key of the example vault"),
    # capacity: what the deploy will need, worked out from the inventory (this machine has far less)
    ({"k26_release_size_gb": 10**5}, "a new release needs 100000 (k26_release_size_gb)"),
    ({"k26_jit_cache_gb": 10**5}, "100000 for the JIT caches (k26_jit_cache_gb)"),
    ({"k26_release_size_gb": 20, "k26_releases_keep": 50}, "less than the 51 releases of 20 GiB the deploy keeps"),
    ({"k26_min_host_memory_gb": 10**5}, "the load needs 100000 (k26_min_host_memory_gb)"),
]


# the state folder is one the project would own: preflight refuses one under /tmp, where pytest's
# tmp_path lives, so the tests' state folders are under the cache instead
STATE_ROOT = Path.home() / ".cache/k26-ddtree/test-state"


def preflight(tmp: Path, pair_dir: Path, overrides: dict) -> subprocess.CompletedProcess:
    state = STATE_ROOT / tmp.name / "state"
    state.mkdir(parents=True, exist_ok=True)
    base = {"k26_gpu_required": False, "k26_min_free_disk_gb": 0, "k26_release_size_gb": 0, "k26_jit_cache_gb": 0,
            "k26_min_host_memory_gb": 0, "k26_state_dir": str(state),
            "k26_model_path": str(pair_dir / "target"), "k26_draft_model_path": str(pair_dir / "draft"),
            "k26_dflash_block_size": 4, "k26_port": 39999, "k26_server_kind": "reference",
            "k26_api_key": "a-test-key-of-24-chars00",
            # the lock of the reference server (Python 3.11, as this machine's python3)
            "k26_requirements_file": str(ROOT / "requirements/sandbox.lock")}
    base.update(overrides)
    return run([str(BIN / "ansible-playbook"), "-i", "localhost,", "tests/ansible/preflight.yml",
                "-e", json.dumps(base)], tmp)


def test_preflight_refuses_a_host_python_that_is_not_the_locks(tmp_path, pair_dir):
    """A lock is resolved for one Python (its first line says which); a host with another one would
    install a stack nobody resolved."""
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\necho 3.9\n")
    fake.chmod(0o755)
    r = preflight(tmp_path, pair_dir, {"k26_requirements_file": str(ROOT / "requirements/sglang.lock"),
                                       "k26_python": str(fake)})
    out = re.sub(r"\s+", " ", r.stdout)
    assert r.returncode != 0
    assert f"sglang.lock was locked for Python 3.11, but the host's {fake} is 3.9" in out
    assert "make lock LOCK_PYTHON=3.9" in out


def test_preflight_passes_good_settings(tmp_path, pair_dir):
    r = preflight(tmp_path, pair_dir, {})
    assert r.returncode == 0, r.stdout[-3000:]


def test_preflight_passes_a_schedule_for_ddtree_serve(tmp_path, pair_dir):
    r = preflight(tmp_path, pair_dir, {"k26_speculative_algorithm": "DDTREE", "k26_ddtree_budget": "1:32,4:8,16:3",
                                       "k26_ddtree_topk_cap": "1:8,16:2"})
    assert r.returncode == 0, r.stdout[-3000:]


@pytest.fixture(scope="module")
def sglang_pair_dir(pair_dir, visible_dir) -> Path:
    """The tiny pair with its draft on target layer 0 only: SGLang captures layer k's output as the
    input of layer k + 1, so a draft of an SGLang server reads layers below the last one."""
    out = visible_dir("sglang-pair")
    shutil.copytree(pair_dir, out, dirs_exist_ok=True)
    draft = json.loads((out / "draft/config.json").read_text())
    draft["dflash_config"]["target_layer_ids"] = [0]
    (out / "draft/config.json").write_text(json.dumps(draft))
    return out


def test_preflight_passes_sglang_with_the_chain(tmp_path, sglang_pair_dir):
    r = preflight(tmp_path, sglang_pair_dir, {"k26_server_kind": "sglang", "k26_speculative_algorithm": "DFLASH"})
    assert r.returncode == 0, r.stdout[-3000:]


@pytest.mark.parametrize("switched", [
    {}, {"k26_ddtree_budget": "1:8,4:3", "k26_ddtree_topk_cap": "1:4,4:1"},
    {"k26_overlap_schedule": True, "k26_ddtree_budget": "1:8,4:3", "k26_ddtree_topk_cap": "1:4,4:1"},
    {"k26_overlap_schedule": "true"}])
def test_preflight_passes_sglang_with_ddtree(tmp_path, sglang_pair_dir, switched):
    """...with a width schedule and under the overlap scheduler: neither needs a switch since their GPU tests passed
    (issue 45). A leftover value of the removed overlap switch in the service's environment is refused since issue 72
    (on no library's list: tests/ansible/test_inputs.py)."""
    r = preflight(tmp_path, sglang_pair_dir, {"k26_server_kind": "sglang", "k26_speculative_algorithm": "DDTREE",
                                              "k26_ddtree_budget": 3, "k26_ddtree_topk_cap": 1, **switched})
    assert r.returncode == 0, r.stdout[-3000:]


def test_preflight_passes_the_width_policy_on_sglang(tmp_path, sglang_pair_dir):
    r = preflight(tmp_path, sglang_pair_dir, {"k26_server_kind": "sglang", "k26_speculative_algorithm": "DDTREE",
                                              "k26_ddtree_budget": "auto:3,8", "k26_ddtree_topk_cap": 4})
    assert r.returncode == 0, r.stdout[-3000:]


@pytest.mark.parametrize("overrides, message", [
    ({"k26_speculative_algorithm": "DDTREE", "k26_ddtree_budget": "auto"},
     "k26_ddtree_budget=auto (the width policy) is invalid with k26_server_kind=reference"),
    ({"k26_server_kind": "sglang", "k26_speculative_algorithm": "DDTREE", "k26_ddtree_budget": "auto:8,16",
      "k26_ddtree_topk_cap": "1:8,8:4"}, "keeps one cap for its trees"),
    ({"k26_server_kind": "sglang", "k26_speculative_algorithm": "DDTREE", "k26_ddtree_budget": "auto:2,8"},
     "auto budget 2: k26_ddtree_budget=2 is invalid with k26_dflash_block_size=4"),
    ({"k26_ddtree_budget": "auto:16,8"}, "k26_ddtree_budget=auto:16,8 is invalid: expected auto"),
])
def test_preflight_refuses_a_width_policy_it_cannot_serve(tmp_path, sglang_pair_dir, overrides, message):
    r = preflight(tmp_path, sglang_pair_dir, overrides)
    out = re.sub(r"\s+", " ", r.stdout)
    assert r.returncode != 0
    assert message in out, out[-3000:]


def test_a_sweep_of_the_width_policy_on_ddtree_serve_is_refused_before_the_lock(tmp_path, pair_dir):
    """sweep_width_policy on a host that serves ddtree-serve: the sweep's own check before the lock refuses it with
    preflight's message (the controller as the host, connected locally; nothing is locked, stopped or written)."""
    state = STATE_ROOT / tmp_path.name / "state"
    state.mkdir(parents=True, exist_ok=True)
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"k26": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_become": False, "k26_gateway_worker_url": "http://127.0.0.1:39999",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}}}}}))
    settings = {"k26_gpu_required": False, "k26_state_dir": str(state), "k26_model_path": str(pair_dir / "target"),
                "k26_draft_model_path": str(pair_dir / "draft"), "k26_dflash_block_size": 4, "k26_port": 39999,
                "k26_server_kind": "reference", "k26_api_key": "a-test-key-of-24-chars00",
                "k26_requirements_file": str(ROOT / "requirements/sandbox.lock"), "sweep_width_policy": True,
                "sweep_budgets": [4], "sweep_topk_caps": [4], "sweep_results_root": str(tmp_path / "results")}
    r = run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/sweep.yml", "-e", json.dumps(settings)], tmp_path)
    out = re.sub(r"\s+", " ", r.stdout)
    assert r.returncode != 0
    assert "k26_ddtree_budget=auto (the width policy) is invalid with k26_server_kind=reference" in out, out[-3000:]
    assert "can serve the width policy" in out and "Take the host lock" not in out
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("removed", ["SGLANG_DDTREE_SCHEDULE", "SGLANG_DDTREE_OVERLAP"])
def test_nothing_asks_for_a_removed_plugin_switch(removed):
    """The schedule's and the overlap scheduler's switches are gone from the plugin (issue 45): nothing of the
    deploy, the sweep or the defaults may still ask for them."""
    from ddtree import switches

    assert removed not in {s.name for s in switches.SWITCHES}
    for path in ("roles/preflight/tasks/relations.yml", "roles/preflight/vars/main.yml", "playbooks/sweep.yml",
                 "inventory/production/group_vars/k26/ddtree.yml", "roles/k26_defaults/defaults/main.yml",
                 "templates/etc/systemd/system/k26-ddtree.service.j2"):
        assert removed not in (ROOT / path).read_text(), path


def test_preflight_refuses_an_sglang_draft_on_the_targets_last_layer(tmp_path, pair_dir):
    r = preflight(tmp_path, pair_dir, {"k26_server_kind": "sglang", "k26_speculative_algorithm": "DFLASH"})
    out = re.sub(r"\s+", " ", r.stdout)
    assert r.returncode != 0 and "target_layer_ids [1] are not below the target's last layer (2 layers)" in out


def test_preflight_knows_what_the_plugin_can_decode():
    """The preflight gate and the plugin's own flag change together (a release with the decode path flips both)."""
    from ddtree.sglang.worker import DECODE_READY

    gate = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["__preflight_sglang_ddtree_ready"]
    assert gate is DECODE_READY


def test_preflight_limits_and_the_role_defaults_agree_with_ddtree_settings():
    """The deployment's budget / top-k cap rules are ddtree.settings' rules: same maximum, same defaults."""
    from ddtree.settings import DEFAULT_BUDGET, DEFAULT_TOPK_CAP, MAX_BUDGET

    inputs = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_inputs"]
    assert (inputs["k26_ddtree_budget"]["min"], inputs["k26_ddtree_budget"]["max"]) == (1, MAX_BUDGET)
    assert (inputs["k26_ddtree_topk_cap"]["min"], inputs["k26_ddtree_topk_cap"]["max"]) == (1, MAX_BUDGET)
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        defaults = yaml.safe_load(path.read_text()) or {}
        assert defaults.get("k26_ddtree_budget", DEFAULT_BUDGET) == DEFAULT_BUDGET, path
        assert defaults.get("k26_ddtree_topk_cap", DEFAULT_TOPK_CAP) == DEFAULT_TOPK_CAP, path


@pytest.mark.parametrize("overrides,message", BAD_PREFLIGHT)
def test_preflight_rejects_bad_settings_with_the_fix(tmp_path, pair_dir, overrides, message):
    r = preflight(tmp_path, pair_dir, overrides)
    out = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0
    assert message in out, out[-3000:]


def _argument_specs() -> dict[str, dict]:
    return {p.parts[-3]: yaml.safe_load(p.read_text())["argument_specs"]
            for p in sorted(ROOT.glob("roles/*/meta/argument_specs.yml"))}


def test_every_entry_point_a_play_or_role_names_has_an_argument_spec():
    """include_role / import_role with tasks_from X: X is an entry point of the role's argument specs."""
    specs = _argument_specs()
    used: set[tuple[str, str]] = set()
    for path in [*ROOT.glob("roles/**/*.yml"), *ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("tests/infra/plays/*.yml")]:
        text = path.read_text()
        for m in re.finditer(r"name: (\w+)\n(\s+)tasks_from: (\w+)", text):
            used.add((m.group(1), m.group(3)))
    assert used, "the scan found no tasks_from at all"
    missing = sorted(f"{role}.{entry}" for role, entry in used if entry not in specs.get(role, {}))
    assert missing == [], f"entry points without an argument spec: {missing}"


def test_a_variable_has_one_type_in_every_argument_spec():
    types: dict[str, set[str]] = {}
    for role, entries in _argument_specs().items():
        for entry in entries.values():
            for name, option in (entry.get("options") or {}).items():
                types.setdefault(name, set()).add(option.get("type", "str"))
    assert {k: v for k, v in types.items() if len(v) > 1} == {}


def test_shared_defaults_are_defined_once_in_k26_defaults_and_every_role_depends_on_it():
    shared = yaml.safe_load((ROOT / "roles/k26_defaults/defaults/main.yml").read_text())
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        role = path.parts[-3]
        if role == "k26_defaults":
            continue
        again = sorted(set(yaml.safe_load(path.read_text()) or {}) & set(shared))
        assert again == [], f"{role} defines shared defaults again: {again}"
        meta = yaml.safe_load((path.parents[1] / "meta/main.yml").read_text())
        assert {"role": "k26_defaults"} in meta["dependencies"], f"{role} does not depend on k26_defaults"
    # and a variable read by two roles' defaults files is shared
    seen: dict[str, str] = {}
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for name in yaml.safe_load(path.read_text()) or {}:
            assert name not in seen, f"{name} is defaulted in {seen.get(name)} and {path.parts[-3]}: move it to k26_defaults"
            seen[name] = path.parts[-3]


def test_the_layout_doc_lists_every_role_and_entry_point():
    layout = (ROOT / "docs/layout.md").read_text()
    table = layout.split("## Roles", 1)[1].split("\n# ", 1)[0]
    for role, entries in _argument_specs().items():
        assert f"`{role}`" in table, f"docs/layout.md's role table lacks {role}"
        for entry in entries:
            assert f"`{entry}`" in table, f"docs/layout.md's role table lacks {role}.{entry}"


def test_operator_inputs_are_raw_where_they_are_validated_before_preflight():
    """The specs that run before preflight's own checks (k26_defaults', as its dependency, and
    preflight's) take operator inputs raw: a typed one would stop at the first bad value before
    preflight names them all at once. (The one-type rule then carries raw to the other roles.)"""
    inputs = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_inputs"]
    first = {k: v for k, v in _argument_specs().items() if k in ("k26_defaults", "preflight")}
    typed = sorted(f"{role}.{name}: {option.get('type', 'str')}"
                   for role, entries in first.items() for entry in entries.values()
                   for name, option in (entry.get("options") or {}).items()
                   if name in inputs and option.get("type", "str") not in ("raw", "str", "path", "list", "dict"))
    assert typed == []


def test_every_documented_site_command_asks_for_the_vault():
    """The site's inventory holds an encrypted vault (the README's first block makes it): a documented playbook
    command against it without a vault option stops with Ansible's decryption error (issue 47: the rollback's did).
    tests/infra/test_snapshot_rollback.py runs a deploy and a rollback that way against a vault inventory."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commands = [(path.name, line) for path in docs for line in path.read_text().splitlines()
                if "ansible-playbook" in line and "inventory/site" in line]
    assert len(commands) >= 8
    missing = [c for c in commands if "--ask-vault-pass" not in c[1] and "--vault-password-file" not in c[1]]
    assert not missing, missing
    # a playbook named in prose with its options is written as the whole command
    partial = [(path.name, m) for path in docs for m in re.findall(r"`(playbooks/\w+\.yml -e [^`]*)`", path.read_text())]
    assert not partial, partial


@pytest.mark.parametrize("playbook, play_name", [("playbooks/deploy.yml", "Deploy k26-ddtree"),
                                                 ("playbooks/rollback.yml", "Roll k26-ddtree back to a snapshot")])
def test_a_roll_changes_one_host_at_a_time_and_stops_at_the_first_that_fails(playbook, play_name):
    """What tests/infra/test_fleet.py's extended test shows on two live hosts (a first host that fails leaves the
    second untouched), held here by the plays' own keys: one host a batch unless k26_serial says otherwise, and no
    failed host allowed in a batch."""
    [play] = [p for p in yaml.safe_load((ROOT / playbook).read_text()) if p.get("name") == play_name]
    serial = jinja2.Environment().from_string(str(play["serial"])).render()           # k26_serial unset
    assert serial == "1", f"{playbook}: serial {play['serial']!r} renders {serial!r} without k26_serial"
    assert play.get("max_fail_percentage") == 0, f"{playbook}: a failed host must stop the roll"


def include_of(task: dict) -> tuple[str, str] | None:
    """(role, tasks_from) of an include_role task, else None."""
    inc = task.get("ansible.builtin.include_role")
    return (inc["name"], inc.get("tasks_from", "main")) if inc else None


def test_a_sweep_takes_its_host_out_of_the_pool_under_the_fleet_lock_and_puts_it_back_after_the_restore():
    """What tests/infra/test_fleet.py's extended test shows live (a sweep behind the gateway fails no request), held
    here by sweep.yml's own tasks: the gateway role's take_out - the tasks the live rolling deploy drains with, no
    request failing - right after the fleet lock and before the first configuration runs; its put_back in the
    restore's block (the `always` of the sweep), after the original is restored; both only with k26_gateway_pool."""
    [play] = [p for p in yaml.safe_load((ROOT / "playbooks/sweep.yml").read_text())
              if p.get("name") == "Sweep k26-ddtree configurations"]
    [sweep] = [t for t in play["tasks"] if t.get("name", "").startswith("Sweep under the lock")]
    names = [t.get("name", "") for t in sweep["block"]]
    includes = [include_of(t) for t in sweep["block"]]
    lock = next(i for i, t in enumerate(sweep["block"])
                if t.get("ansible.builtin.include_tasks", {}).get("file") == "tasks/fleet_lock_take.yml")
    out = includes.index(("gateway", "take_out"))
    first_run = next(i for i, n in enumerate(names) if n.startswith("Run each configuration"))
    assert lock < out < first_run, names
    assert sweep["block"][out]["when"] == "k26_gateway_pool | bool"
    [restore] = [t for t in sweep["always"] if "block" in t]
    after = [include_of(t) for t in restore["block"]]
    assert after.index(("rollback", "restore")) < after.index(("gateway", "put_back")), after
    assert restore["block"][after.index(("gateway", "put_back"))]["when"] == "k26_gateway_pool | bool"
    assert re.search(r"name: gateway\s+tasks_from: take_out", (ROOT / "playbooks/deploy.yml").read_text())


def test_a_rollback_takes_its_host_out_of_the_pool_under_the_fleet_lock_and_puts_it_back_either_way():
    """What tests/infra/test_fleet.py's extended rollback test shows live, held by rollback.yml's own tasks: the
    gateway's take_out right after the fleet lock and before the snapshot is restored; put_back after the restored
    service is proven healthy, and in the rescue after what ran before is put back (the host never left out)."""
    [play] = [p for p in yaml.safe_load((ROOT / "playbooks/rollback.yml").read_text())
              if p.get("name") == "Roll k26-ddtree back to a snapshot"]
    [roll] = [t for t in play["tasks"] if t.get("name", "").startswith("Restore under the lock")]
    block = [include_of(t) for t in roll["block"]]
    lock = next(i for i, t in enumerate(roll["block"])
                if t.get("ansible.builtin.include_tasks", {}).get("file") == "tasks/fleet_lock_take.yml")
    assert lock < block.index(("gateway", "take_out")) < block.index(("rollback", "restore_snapshot")), block
    assert block.index(("rollback", "restore_snapshot")) < block.index(("verify", "main")) \
        < block.index(("gateway", "put_back")), block
    rescue = [include_of(t) for t in roll["rescue"]]
    assert rescue.index(("rollback", "restore")) < rescue.index(("gateway", "put_back")), rescue

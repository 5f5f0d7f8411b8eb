"""Preflight's input rules (roles/k26_defaults/filter_plugins/k26_inputs.py with the spec in
roles/preflight/vars/main.yml) and the second wall: the unit and env templates quote what they render."""

from __future__ import annotations

import re

import pytest
import yaml

from .conftest import ROOT, load_filters, load_k26_inputs

SPEC = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_inputs"]
k26_inputs = load_k26_inputs()
quoting, folders = load_filters("k26_quoting"), load_filters("k26_folders")
snapshot, sglang_args = load_filters("k26_snapshot"), load_filters("k26_sglang_args")

# (variable, malformed value, what the message must say): strings, numbers, lists and maps
MALFORMED = [
    ("k26_host", "0.0.0.0 --api-key ''", "expected an IPv4 or IPv6 address or a DNS name"),
    ("k26_host", "127.0.0.1\nExecStartPre=/bin/sh", "expected an IPv4 or IPv6 address"),
    ("k26_host", "-bad-.example", "expected an IPv4 or IPv6 address"),
    ("k26_port", "30000 --api-key x", "expected an integer 1..65535"),
    ("k26_port", 70000, "expected an integer 1..65535"),
    ("k26_port", True, "expected an integer"),
    ("k26_model_path", "relative/path", "expected an absolute path"),
    ("k26_model_path", "/srv/models/K2 --trust-remote-code", "expected an absolute path"),
    ("k26_model_path", "/srv/$HOME/m", "expected an absolute path"),
    ("k26_draft_model_path", "/srv/../etc/shadow", "no .."),
    ("k26_served_model_name", "kimi --enable-lora", "expected 1-128 characters"),
    ("k26_served_model_name", "%n", "expected 1-128 characters"),
    ("k26_speculative_algorithm", "EAGLE3", "expected DDTREE, DFLASH or NONE"),
    ("k26_server_kind", "docker", "expected sglang or reference"),
    ("k26_ddtree_budget", "32 --x", "expected an integer 1..1023"),
    ("k26_ddtree_topk_cap", -1, "expected an integer 1..1023"),
    ("k26_cuda_graph", "sometimes", "expected true or false"),
    ("k26_tp_size", "8;", "expected an integer 1..64"),
    ("k26_max_running_requests", 0, "expected an integer 1..65536"),
    ("k26_timeout_stop_sec", "infinity", "expected an integer 30..86400"),
    ("k26_user", "root --x", "expected a user or group name"),
    ("k26_state_dir", "/var/lib/k26\nReadWritePaths=/", "expected an absolute path"),
    ("k26_extra_args", "--tool-call-parser kimi_k2", "expected a list"),
    ("k26_extra_args", ["--reasoning-parser kimi_k2 --api-key x"], "must be one word"),
    ("k26_extra_args", ["tool-call-parser"], "does not start with a --flag"),
    ("k26_extra_args", ["--x $(id)"], "must be one word"),
    ("k26_extra_args", [{"--x": 1}], "is not a string"),
    ("k26_service_env", ["A=1"], "expected a map"),
    ("k26_service_env", {"lower": "1"}, "is not an environment variable name"),
    ("k26_service_env", {"NCCL_DEBUG": "1\nB=2"}, "no quotes, $, newlines"),
    ("k26_service_env", {"NCCL_DEBUG": "$(id)"}, "no quotes, $, newlines"),
    ("k26_service_env", {"NCCL_DEBUG": {"nested": 1}}, "expected a string, got dict"),
    ("k26_service_env", {"NCCL_MIN_NCHANNELS": 8}, "expected a string, got int (YAML reads 010 as 8"),
    ("k26_service_env", {"NCCL_BUFFSIZE": 1e3}, "expected a string, got float"),
    ("k26_service_env", {"LD_PRELOAD": "/tmp/x.so"}, "LD_PRELOAD is not an allowed name"),
    ("k26_service_env", {"PYTHONPATH": "/tmp"}, "PYTHONPATH is not an allowed name"),
    ("k26_service_env", {"CUDA_INJECTION64_PATH": "/tmp/x.so"}, "names a file or plugin the server would load"),
    ("k26_service_env", {"NCCL_NET_PLUGIN": "evil"}, "names a file or plugin the server would load"),
    ("k26_service_env", {"SGLANG_PLUGINS": "ddtree,other"}, "its value must be ddtree"),
    ("k26_service_env", {"SGLANG_DDTREE_FAULT": "sibling"}, "GPU test bed diagnostic"),
    ("k26_service_env", {"SGLANG_DDTREE_DUMP": "/tmp/d"}, "remove it from k26_service_env"),
    ("k26_api_key", "key with spaces 1234", "expected up to 256 characters"),
    ("k26_nccl_p2p", "maybe", "expected auto, true or false"),
    ("k26_min_driver_version", "R580", "expected a version"),
    ("k26_verify_host", "127.0.0.1; curl x", "expected an IPv4 or IPv6 address"),
    ("k26_smoke_prompt", "line one\nline two", "printable characters on one line"),
    ("k26_smoke_prompt", "", "printable characters on one line"),
    ("k26_lock_ttl", "2h", "expected an integer 1..604800"),
    ("k26_max_exposure", "low", "expected a number 0..5"),
    ("k26_max_exposure", "1e1", "expected a number 0..5"),
    ("k26_user", "root", "is an account or group of the system"),
    ("k26_group", "shadow", "is an account or group of the system"),
    ("k26_group", "systemd-journal", "is an account or group of the system"),
    ("k26_serial", 0, "expected an integer 1..64"),
    ("k26_models", [{"name": "t", "source": "ftp://h/x", "dest": "/srv/m", "digests": "/etc/hostname"}],
     "expected https://HOST[:PORT][/PATH]"),
    ("k26_models", [{"name": "t", "source": "http://127.0.0.1:8000", "dest": "/srv/m", "digests": "/nonexistent/d"}],
     "digests /nonexistent/d: does not exist on the controller"),
    # folders the project owns: no system folder, no parent of one, nothing under /tmp (issue 29)
    ("k26_state_dir", "/var/lib", "is a system folder or a parent of one"),
    ("k26_state_dir", "/", "is a system folder or a parent of one"),
    ("k26_state_dir", "/var", "is a system folder or a parent of one"),
    ("k26_config_dir", "/etc", "is a system folder or a parent of one"),
    ("k26_config_dir", "/etc/systemd", "is a system folder or a parent of one"),
    ("k26_prefix", "/tmp", "is a system folder or a parent of one"),
    ("k26_prefix", "/usr/local", "is a system folder or a parent of one"),
    ("k26_prefix", "/tmp/k26", "is under a world-writable or pseudo file system"),
    ("k26_venv", "/dev/shm/venv", "is under a world-writable or pseudo file system"),
    ("k26_rollback_root", "/var/tmp/k26", "is under a world-writable or pseudo file system"),
    ("k26_state_dir", "/var/lib/k26/", "expected a normalised path"),
    ("k26_state_dir", "/var/lib//k26", "expected a normalised path"),
    ("k26_state_dir", "/home/alice", "is a user's home folder"),
    ("k26_gpu_report_path", "/tmp/report.json", "is under a world-writable"),
    ("k26_gateway_config_dir", "/etc", "is a system folder"),
    ("k26_lock_dir", "/run", "is a system folder"),
    # the flags the roles own are refused in k26_extra_args, in both spellings
    ("k26_extra_args", ["--config /dev/null"], "--config is set by the roles from k26_config_dir"),
    ("k26_extra_args", ["--api-key K"], "--api-key is set by the roles from k26_api_key"),
    ("k26_extra_args", ["--port=31000"], "--port is set by the roles from k26_port"),
    ("k26_extra_args", ["--host 0.0.0.0"], "--host is set by the roles from k26_host"),
    ("k26_extra_args", ["--model-path /srv/other"], "--model-path is set by the roles from k26_model_path"),
    ("k26_extra_args", ["--speculative-ddtree-budget 64"], "--speculative-ddtree-budget is set by the roles"),
    ("k26_extra_args", ["--speculative-draft-model-path=/x"], "is set by the roles from k26_speculative_algorithm"),
    # variables without a rule before issue 29
    ("k26_device_allow", ["char-nvidia-frontend rw\nDeviceAllow=block-sda rw"], "a DeviceAllow entry"),
    ("k26_device_allow", "char-nvidia-frontend rw", "expected a non-empty list"),
    ("k26_device_allow", ["/dev/sda rw"], "a DeviceAllow entry of the NVIDIA set"),
    ("k26_device_allow", ["block-sd rw"], "a DeviceAllow entry of the NVIDIA set"),
    ("k26_device_allow", ["/dev/nvidia0/../sda rw"], "a DeviceAllow entry of the NVIDIA set"),
    ("k26_cuda_major", "13)\nimport os", "expected an integer 11..99"),
    ("k26_gateway_worker_url", "http://10.0.0.1:30000/x --y", "expected http://HOST:PORT"),
    ("k26_gateway_worker_url", "http://host:99999", "a port 1..65535"),
    ("k26_gateway_port", 99999, "expected an integer 1..65535"),
    ("k26_gateway_listen", "0.0.0.0 --x", "expected an IPv4 or IPv6 address"),
    ("k26_gateway_admin_key", "key with spaces 123456", "expected up to 256 characters"),
    ("k26_gateway_user", "Root", "expected a user or group name"),
    # TLS in front of the gateway (issue 47): PEM text of the right kind, or empty
    ("k26_gateway_tls_cert", "/etc/ssl/gateway.crt", "expected PEM text of CERTIFICATE blocks"),
    ("k26_gateway_tls_cert", "-----BEGIN PRIVATE KEY-----\nQUJD\n-----END PRIVATE KEY-----\n",
     "expected PEM text of CERTIFICATE blocks"),
    ("k26_gateway_tls_key", "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n",
     "expected PEM text of PRIVATE KEY blocks"),
    # the key rotation (issue 29): neither key is shown
    ("k26_api_key_previous", "old key with spaces 1234", "expected up to 256 characters"),
    ("k26_extra_args", ["--previous-api-key K"], "--previous-api-key is set by the roles from k26_api_key_previous"),
    ("k26_gateway_api_keys", "sandbox-demo-key-0123", "expected a list of 1 to 4 keys"),
    ("k26_gateway_api_keys", [], "expected a list of 1 to 4 keys"),
    ("k26_gateway_api_keys", ["a-good-key-0123456789", "short-key"], "item 1: expected a key of 16 to 256"),
    ("k26_gateway_api_keys", ["a-good-key-0123456789", "a good key 0123456789"], "item 1: expected a key of 16 to 256"),
    ("k26_gateway_api_keys", ["a-good-key-0123456789"] * 2, "a key is listed twice"),
    ("k26_gateway_api_keys", [f"a-good-key-012345678{i}" for i in range(5)], "expected a list of 1 to 4 keys"),
    ("sweep_temperatures", ["0.7; rm -rf /"], "expected a number 0..2"),
    ("sweep_budgets", [8, "16 --x"], "expected an integer 1..1023"),
    ("sweep_budgets", [], "expected a non-empty list"),
    ("sweep_references", "NONE", "expected a list"),
    ("sweep_overlap_schedules", ["auto", "sometimes"], "expected auto, true or false"),
    ("k26_overlap_schedule", "on", "expected auto, true or false"),
    ("sweep_concurrency_levels", [1, 8, "48; reboot"], "expected an integer 1..1024"),
    ("sweep_concurrency_levels", list(range(1, 14)), "at most 12"),
    ("validate_near_tie_margin", "wide", "expected a number 0..1"),
    ("snapshot_tag", "tag with spaces", "a tag name"),
    ("snapshot_force", "perhaps", "expected true or false"),
    ("k26_prometheus_scrape_interval", "15 s", "expected a duration"),
    ("k26_prometheus_retention", "30days", "expected a duration"),
    ("k26_alertmanager_group_wait", "1m30s", "expected a duration"),
    ("k26_alert_webhooks", "http://hook:8080/a", "expected a list"),
    ("k26_alert_webhooks", ["http://hook:8080/a b"], "item 0"),
    ("k26_alert_webhooks", ["ftp://hook/a"], "an http(s) URL"),
    ("k26_alert_heartbeat_webhooks", ["ftp://hook/a"], "an http(s) URL"),
    ("k26_alert_extra_disks", ["relative/path"], "absolute"),
    ("k26_alert_error_ratio_budget", 0, "0.0001..0.069"),
    ("k26_alert_error_ratio_budget", 0.07, "above 0.069 is more than every request"),   # 14.4 x 0.07 > 1
    ("k26_alert_abort_ratio_max", 1, "at 1 the alert never fires"),
    ("k26_alert_disk_used_ratio_max", 1, "at 1 the alert never fires"),
    ("k26_alert_hang_minutes", 0, "expected a number 1..120"),
    ("k26_alert_kv_usage_max", 1, "at 1 the alert never fires"),
    ("k26_node_exporter_port", 0, "expected an integer 1..65535"),
    ("k26_monitor_address", "10.0.0.1 --x", "expected an IPv4 or IPv6 address"),
    ("k26_textfile_dir", "/var/lib", "is a system folder"),
    ("k26_monitoring_packages", ["prometheus"], "name=version"),
    ("k26_alert_accept_length_floor", "high", "expected a number 0..1024"),
    ("k26_service_env", {"NCCL_SHM_DISABLE": True}, "a boolean (True) is written as True in the env file"),
    # issue 72: names by an explicit list per library; names that load code named as such; names a role sets
    ("k26_service_env", {"TRITON_CACHE_MANAGER": "evil.Manager"}, "names a file or plugin the server would load"),
    ("k26_service_env", {"HF_MODULES_CACHE": "/srv/x"}, "names a file or plugin the server would load"),
    ("k26_service_env", {"TORCH_EXTENSIONS_DIR": "/srv/x"}, "names a file or plugin the server would load"),
    ("k26_service_env", {"TRITON_OVERRIDE_DIR": "/srv/x"}, "names a file or plugin the server would load"),
    ("k26_service_env", {"SGLANG_NO_SUCH_SETTING": "1"}, "is not an allowed name; k26_service_env takes the library"),
    ("k26_service_env", {"SGLANG_DDTREE_OVERLAP": "0"}, "SGLANG_DDTREE_OVERLAP is not an allowed name"),   # removed
    ("k26_service_env", {"NCCL_P2P_DISABLE": "1"}, "set by the roles from k26_nccl_p2p"),
    ("k26_service_env", {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}, "set by the roles from k26_pcie_ipc_allreduce"),
    ("k26_service_env", {"SGLANG_DDTREE_BUDGET": "64"}, "set by the roles from k26_ddtree_budget"),
    ("k26_service_env", {"HF_HOME": "/srv/hf"}, "set by the roles from the env template"),
    ("k26_load_format", "safetensors", "expected auto or dummy"),
    ("k26_custom_logit_processors", "maybe", "expected"),
    ("k26_alert_accept_length_drop_share", 1, "at 1 or above every dip would fire"),
    ("k26_alert_accept_length_drop_share", 0, "expected a number 0.05..0.99"),
    ("k26_metrics_interval", 1, "expected an integer 5..3600"),
]


@pytest.mark.parametrize("name,value,why", MALFORMED, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(MALFORMED)])
def test_a_malformed_value_is_named_with_its_value_and_fix(name, value, why):
    errors = k26_inputs.k26_input_errors({name: value}, SPEC)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{name}=") and " is invalid: " in errors[0] and why in errors[0], errors[0]
    if name in ("k26_api_key", "k26_api_key_previous", "k26_gateway_api_keys", "k26_alert_webhooks", "k26_alert_heartbeat_webhooks",
                "k26_gateway_tls_key"):
        shown_items = value if isinstance(value, list) else [value]
        assert not any(str(v) in errors[0] for v in shown_items if v) and "<not shown>" in errors[0]
    assert errors[0].rstrip().split("; ")[-1], "no fix given"


def test_the_production_and_sandbox_settings_pass():
    values = {}
    for inventory in ("production", "sandbox"):
        for path in sorted((ROOT / "inventory" / inventory / "group_vars" / "k26").glob("*.yml")):
            text = path.read_text()
            if text.startswith("$ANSIBLE_VAULT"):
                continue
            data = yaml.safe_load(text) or {}
            values.update({k: v for k, v in data.items() if k in SPEC and "{{" not in str(v)})
        assert k26_inputs.k26_input_errors(values, SPEC) == [], inventory
    assert {"k26_extra_args", "k26_service_env", "k26_port", "k26_model_path"} <= set(values)


def test_every_variable_the_unit_renders_has_a_rule():
    unit = (ROOT / "templates/etc/systemd/system/k26-ddtree.service.j2").read_text()
    env = (ROOT / "templates/etc/k26/k26-ddtree.env.j2").read_text()
    # variables, not the filters (`| k26_exec_word`, `| k26_host_port`) nor the role named in the comments
    filters = set(re.findall(r"\|\s*(k26_[a-z0-9_]+)", unit + env))
    rendered = set(re.findall(r"\bk26_[a-z0-9_]+", unit + env)) - filters - {"k26_defaults"}
    derived = {"k26_venv"}  # <k26_prefix>/releases/<hash>/venv, set by the release role
    not_operator_values = {"k26_templates_dir"}
    assert rendered - set(SPEC) - derived - not_operator_values == set()


def test_an_unknown_kind_in_the_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="k26_x has an unknown kind 'float'"):
        k26_inputs.k26_input_errors({"k26_x": 1}, {"k26_x": {"kind": "float"}})


def test_the_roles_own_defaults_pass_their_rules():
    """Every default of every role that the spec names (a default the rules refused would stop
    every deploy): the project's folders /opt/k26, /var/lib/k26, /etc/k26, /run/k26-deploy ... pass."""
    values = {}
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        data = yaml.safe_load(path.read_text()) or {}
        values.update({k: v for k, v in data.items() if k in SPEC and "{{" not in str(v)})
    # the inventory must set the model (preflight says so); the defaults leave it empty on purpose
    values["k26_model_path"] = "/srv/models/m"
    fleet = yaml.safe_load((ROOT / "playbooks/vars/fleet.yml").read_text())
    values.update({k: v for k, v in fleet.items() if k in SPEC and "{{" not in str(v)})
    for playbook in ("sweep", "validate"):
        plays = [p for p in yaml.safe_load((ROOT / f"playbooks/{playbook}.yml").read_text()) if "hosts" in p]
        values.update({k: v for k, v in plays[0]["vars"].items() if k in SPEC and "{{" not in str(v)})
    # a derived variable's default is its derivation (the rule refuses it from outside only)
    values = {k: v for k, v in values.items() if SPEC[k]["kind"] != "derived"}
    assert k26_inputs.k26_input_errors(values, SPEC) == []
    assert {"k26_state_dir", "k26_prefix", "k26_lock_dir", "k26_fleet_lock_dir", "k26_gpu_report_path",
            "k26_gateway_config_dir", "k26_device_allow", "sweep_temperatures", "validate_near_tie_margin",
            "k26_textfile_dir", "k26_prometheus_retention", "k26_alert_queue_depth_max"} <= set(values)


@pytest.mark.parametrize("name", ["k26_wheelhouse", "k26_gateway_wheelhouse"])
def test_a_wheelhouse_the_first_deploy_fills_need_not_exist_yet(tmp_path, name):
    # a fresh controller (a clean CI machine, 2026-12-04) has no wheelhouse until the first deploy downloads it:
    # the rule that wanted it there refused every first deploy
    assert k26_inputs.k26_input_errors({name: str(tmp_path / "not-yet" / "wheelhouse-0123")}, SPEC) == []
    assert k26_inputs.k26_input_errors({name: "wheels"}, SPEC) != []           # still an absolute path


@pytest.mark.parametrize("path", ["/opt/k26", "/var/lib/k26", "/etc/k26", "/run/k26-deploy", "/srv/k26/state",
                                  "/home/alice/k26", "/opt/k26/current/venv", "/var/lib/k26/gpu-host-report.json"])
def test_a_folder_of_the_projects_own_passes(path):
    assert k26_inputs.k26_input_errors({"k26_state_dir": path}, SPEC) == []


def test_the_playbook_templates_quote_or_cast_what_they_paste_into_command_lines():
    """The verify role's and the sweep's script lines, and the nvcc probe's Python, take the host,
    port, temperature and CUDA major only through `| quote`, `| int` or `| float`."""
    health = (ROOT / "roles/verify/tasks/health.yml").read_text()
    smoke = (ROOT / "roles/verify/tasks/smoke.yml").read_text()
    sweep = (ROOT / "playbooks/tasks/sweep_one.yml").read_text()
    nvcc = (ROOT / "roles/gpu_host/tasks/nvcc.yml").read_text()
    for text in (health, smoke, sweep):
        lines = [line for line in text.splitlines() if "k26_client.py" in line]
        assert lines and not any(re.search(r"\{\{ *k26_(port|verify_host) *\}\}", line) for line in lines), lines
    assert "{{ item.0 | float }}" in sweep and "{{ item.1 | int }}" in sweep and "{{ item }}" not in sweep
    assert "k26_cuda_major | int" in nvcc and not re.search(r"\{\{ *k26_cuda_major *\}\}\"", nvcc)
    unit = (ROOT / "templates/etc/systemd/system/k26-ddtree.service.j2").read_text()
    assert "DeviceAllow={{ device | k26_unit_value }}" in unit
    assert quoting.k26_unit_value("char-x rw\nExecStartPre=/bin/sh") == "char-x rw ExecStartPre=/bin/sh"


def test_a_sweep_without_references_and_a_short_health_wait_pass():
    """-e sweep_references=[] (DDTREE only) and k26_health_timeout=5 (the sandbox tests) are valid."""
    assert k26_inputs.k26_input_errors({"sweep_references": [], "k26_health_timeout": 5}, SPEC) == []


def test_a_pem_certificate_and_key_pass_and_empty_means_no_tls(tmp_path):
    from tests.helpers import self_signed

    cert, key = self_signed(tmp_path)
    good = {"k26_gateway_tls_cert": cert.read_text(), "k26_gateway_tls_key": key.read_text()}
    assert k26_inputs.k26_input_errors(good, SPEC) == []
    assert k26_inputs.k26_input_errors({"k26_gateway_tls_cert": "", "k26_gateway_tls_key": ""}, SPEC) == []


def folder_results(folders: dict[str, tuple[dict, list[str]]]) -> tuple[list, list]:
    """A looped stat's and a looped find's results (roles/preflight/tasks/folders.yml) for {name: (stat, entries)}."""
    stats = [{"item": {"key": name, "value": st.get("path")}, "stat": st} for name, (st, _) in folders.items()]
    listings = [{"item": r, "files": [{"path": f"{r['stat']['path']}/{e}"} for e in folders[r["item"]["key"]][1]]}
                for r in stats if r["stat"].get("exists") and r["stat"].get("isdir")]
    return stats, listings


def test_a_folder_of_another_program_is_refused_and_the_projects_own_pass():
    """Issue 48: a folder the project owns must be new or already the project's - judged on the host by its owner
    and what it holds (what the roles write there), not only by its name."""
    own = folder_results({
        "k26_prefix": ({"exists": True, "isdir": True, "path": "/opt/k26", "pw_name": "root"}, ["releases", "current"]),
        "k26_state_dir": ({"exists": True, "isdir": True, "path": "/srv/k26", "pw_name": "k26"}, [".ansible"]),
        "k26_config_dir": ({"exists": True, "isdir": True, "path": "/etc/k26", "pw_name": "root"}, []),
        "k26_rollback_dir": ({"exists": False, "path": "/var/lib/k26-rollback"}, []),
    })
    assert folders.k26_foreign_folders(*own, "k26") == []
    foreign = folder_results({
        "k26_prefix": ({"exists": True, "isdir": True, "path": "/opt/nvidia", "pw_name": "root"}, ["bin", "lib"]),
        "k26_state_dir": ({"exists": True, "isdir": True, "path": "/var/lib/postgresql", "pw_name": "postgres"},
                          ["15", "cache"]),
        "k26_config_dir": ({"exists": True, "isdir": False, "path": "/srv/k26.conf", "pw_name": "root"}, []),
        "k26_rollback_dir": ({"exists": True, "isdir": True, "path": "/srv/backup", "pw_name": "root"},
                             [f"f{i}" for i in range(9)]),
    })
    said = folders.k26_foreign_folders(*foreign, "k26")
    assert len(said) == 4, said
    assert said[0].startswith("k26_prefix=/opt/nvidia is a folder of this host that is not the project's (owner root, "
                              "2 entries: bin, lib)") and "the default /opt/k26" in said[0]
    assert "k26_state_dir=/var/lib/postgresql" in said[1] and "owner postgres" in said[1]    # a sign, a stranger's
    assert said[2] == "k26_config_dir=/srv/k26.conf exists and is not a folder"
    assert "9 entries: f0, f1, f2, f3, f4, ..." in said[3]
    # the state folder of an earlier deploy (owned by the service user) passes whatever it holds; root's does not
    stranger = folder_results({"k26_state_dir": ({"exists": True, "isdir": True, "path": "/srv/k26",
                                                  "pw_name": "root"}, ["data"])})
    assert folders.k26_foreign_folders(*stranger, "k26") != []


def test_a_gateway_hosts_folders_are_judged_the_same_way():
    """Issue 48: the gateway role's folders (checked on its host before the install, with its own service user): an
    earlier gateway's pass, another program's folder is refused naming the gateway's default."""
    own = folder_results({
        "k26_gateway_prefix": ({"exists": True, "isdir": True, "path": "/opt/k26-gateway", "pw_name": "root"},
                               ["venv", "venv-3f2a", "bin", "state"]),
        "k26_gateway_config_dir": ({"exists": True, "isdir": True, "path": "/etc/k26-gateway", "pw_name": "root"},
                                   ["gateway.yaml", "worker.key"]),
    })
    assert folders.k26_foreign_folders(*own, "k26gw") == []
    foreign = folder_results({
        "k26_gateway_prefix": ({"exists": True, "isdir": True, "path": "/opt/nginx", "pw_name": "root"}, ["sbin", "conf"]),
        "k26_gateway_config_dir": ({"exists": True, "isdir": True, "path": "/etc/ssl", "pw_name": "root"},
                                   ["certs", "private"]),
    })
    said = folders.k26_foreign_folders(*foreign, "k26gw")
    assert len(said) == 2 and "k26_gateway_prefix=/opt/nginx" in said[0] and "the default /opt/k26-gateway" in said[0]
    assert "k26_gateway_config_dir=/etc/ssl" in said[1] and "the default /etc/k26-gateway" in said[1]


SNAPSHOT_UNIT = """[Service]
User=k26
Group=k26
WorkingDirectory=/var/lib/k26
ExecStart=/opt/k26/releases/0123abcd/venv/bin/sglang serve \\
    --model-path /srv/models/k26 \\
    --served-model-name kimi-k2.6 \\
    --speculative-algorithm DDTREE \\
    --speculative-ddtree-budget 1:64,8:32 \\
    --tp 8 \\
    --trust-remote-code \\
    --disable-overlap-schedule \\
    --cuda-graph-backend-decode disabled \\
    --port 30000 \\
    --enable-metrics \\
    --config /etc/k26/k26-ddtree.yaml \\
    --mem-fraction-static 0.85 \\
    --disable-radix-cache
Restart=on-failure
DeviceAllow=char-nvidia-uvm rw
DeviceAllow=/dev/nvidiactl rw
"""


def test_a_snapshots_unit_and_env_read_back_into_the_inputs_a_deploy_gives():
    """Issue 48: a snapshot is checked by the deploy's rules through the variables its unit and env file stand for."""
    env = 'HOME=/var/lib/k26\nPATH=/opt/k26/venv/bin:/usr/bin\n# a comment\nNCCL_DEBUG=WARN\nNCCL_DEBUG_SUBSYS="INIT ENV"\n'
    got = snapshot.k26_snapshot_inputs(SNAPSHOT_UNIT, env)
    assert got == {"k26_user": "k26", "k26_group": "k26", "k26_state_dir": "/var/lib/k26",
                   "k26_device_allow": ["char-nvidia-uvm rw", "/dev/nvidiactl rw"],
                   "k26_model_path": "/srv/models/k26", "k26_served_model_name": "kimi-k2.6",
                   "k26_speculative_algorithm": "DDTREE", "k26_ddtree_budget": "1:64,8:32", "k26_tp_size": "8",
                   "k26_port": "30000", "k26_config_dir": "/etc/k26",
                   "k26_extra_args": ["--mem-fraction-static 0.85", "--disable-radix-cache"], "k26_server_kind": "sglang",
                   "k26_service_env": {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "INIT ENV"}}
    assert k26_inputs.k26_input_errors(got, SPEC) == []
    rule = SPEC["k26_extra_args"]
    assert sglang_args.k26_sglang_arg_errors(got["k26_extra_args"], rule) == []
    # a second --tp, another config file, a loader variable and a device outside the NVIDIA set are each refused
    edited = (SNAPSHOT_UNIT.replace("--disable-radix-cache", "--disable-radix-cache --tp 1 --config /dev/null")
              .replace("DeviceAllow=char-nvidia-uvm rw", "DeviceAllow=/dev/sda rw"))
    got = snapshot.k26_snapshot_inputs(edited, env + "LD_PRELOAD=/srv/x.so\n")
    assert got["k26_extra_args"][-2:] == ["--tp 1", "--config /dev/null"] and got["k26_config_dir"] == "/etc/k26"
    errors = " | ".join(k26_inputs.k26_input_errors(got, SPEC))
    for said in ("k26_device_allow=", "LD_PRELOAD is not an allowed name", "k26_extra_args="):
        assert said in errors, errors
    assert "/srv/x.so" not in errors
    said = " | ".join(sglang_args.k26_sglang_arg_errors(got["k26_extra_args"], rule))
    assert "SGLang reads it as --tp-size" in said or "SGLang reads it as --tensor-parallel-size" in said, said


def test_a_snapshots_code_running_and_random_weight_options_read_back_into_their_variables():
    """Issue 72: the two options only their own variables render come back as those variables, so a restored unit
    is judged (and warned about) as a deploy of them would be; the same options among the extra args are refused."""
    unit = SNAPSHOT_UNIT.replace("    --tp 8 \\\n", "    --tp 8 \\\n    --enable-custom-logit-processor \\\n"
                                 "    --load-format dummy \\\n")
    got = snapshot.k26_snapshot_inputs(unit, "")
    assert got["k26_custom_logit_processors"] is True and got["k26_load_format"] == "dummy"
    assert got["k26_extra_args"] == ["--mem-fraction-static 0.85", "--disable-radix-cache"]
    assert k26_inputs.k26_input_errors(got, SPEC) == []
    late = SNAPSHOT_UNIT.replace("--disable-radix-cache", "--disable-radix-cache --load-format dummy")
    said = " | ".join(sglang_args.k26_sglang_arg_errors(snapshot.k26_snapshot_inputs(late, "")["k26_extra_args"],
                                                       SPEC["k26_extra_args"]))
    assert "roles set from k26_load_format" in said, said


def test_the_split_modules_hold_their_shared_facts_equal():
    """Issue 73: k26_inputs split by concern; what two of them must agree on is held here. The quoting's plain word is
    the validators' (a value preflight takes renders unquoted); the snapshot reader skips exactly the names the env
    template writes (and an old env file's key), each refused in k26_service_env as owned."""
    assert quoting.SAFE_WORD.pattern == k26_inputs.SAFE_WORD.pattern
    template = (ROOT / "templates/etc/k26/k26-ddtree.env.j2").read_text()
    written = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", template, flags=re.M))
    assert written <= snapshot.ENV_TEMPLATE_NAMES == written | {"K26_API_KEY"}
    assert snapshot.ENV_TEMPLATE_NAMES <= set(SPEC["k26_service_env"]["owned"])

"""Preflight's input rules (roles/k26_defaults/filter_plugins/k26_inputs.py with the spec in
roles/preflight/vars/main.yml) and the second wall: the unit and env templates quote what they render."""

from __future__ import annotations

import importlib.util
import re

import pytest
import yaml

from .conftest import ROOT

SPEC = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_inputs"]
_module = importlib.util.spec_from_file_location("k26_inputs", ROOT / "roles/k26_defaults/filter_plugins/k26_inputs.py")
k26_inputs = importlib.util.module_from_spec(_module)
_module.loader.exec_module(k26_inputs)

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
    ("k26_service_env", {"A": "1\nB=2"}, "no quotes, $, newlines"),
    ("k26_service_env", {"A": "$(id)"}, "no quotes, $, newlines"),
    ("k26_service_env", {"A": {"nested": 1}}, "expected a string or a number"),
    ("k26_api_key", "key with spaces 1234", "expected up to 256 characters"),
    ("k26_nccl_p2p", "maybe", "expected auto, true or false"),
    ("k26_min_driver_version", "R580", "expected a version"),
    ("k26_verify_host", "127.0.0.1; curl x", "expected an IPv4 or IPv6 address"),
    ("k26_smoke_prompt", "line one\nline two", "printable characters on one line"),
    ("k26_smoke_prompt", "", "printable characters on one line"),
    ("k26_lock_ttl", "2h", "expected an integer 1..604800"),
    ("k26_max_exposure", "low", "expected a number 0..10"),
]


@pytest.mark.parametrize("name,value,why", MALFORMED, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(MALFORMED)])
def test_a_malformed_value_is_named_with_its_value_and_fix(name, value, why):
    errors = k26_inputs.k26_input_errors({name: value}, SPEC)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{name}=") and " is invalid: " in errors[0] and why in errors[0], errors[0]
    if name == "k26_api_key":
        assert value not in errors[0] and "<not shown>" in errors[0]
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
    # variables, not the quoting filters (`| k26_exec_word`) nor the role named in the comments
    rendered = set(re.findall(r"\bk26_[a-z0-9_]+", unit + env)) - {"k26_exec_word", "k26_env_value", "k26_defaults"}
    derived = {"k26_venv"}  # <k26_prefix>/releases/<hash>/venv, set by the release role
    not_operator_values = {"k26_device_allow", "k26_templates_dir"}
    assert rendered - set(SPEC) - derived - not_operator_values == set()


def test_an_unknown_kind_in_the_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="k26_x has an unknown kind 'float'"):
        k26_inputs.k26_input_errors({"k26_x": 1}, {"k26_x": {"kind": "float"}})

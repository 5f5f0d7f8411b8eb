"""Rules between a server host's settings that each pass alone (issue 72, item 4): the filter's rules one by one
(each message naming both variables), the example inventories passing them, and preflight refusing before any host is
contacted."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import BIN, load_filters, run
from .test_check_first import unreachable_fleet

k26_relations = load_filters("k26_relations")

GOOD = {"k26_host": "10.0.0.11", "k26_verify_host": "10.0.0.11", "k26_port": 30000,
        "k26_gateway_worker_url": "http://10.0.0.11:30000", "k26_gateway_pool": True, "k26_sandbox": False,
        "k26_gateway_host": "gw", "inventory_hostname": "gpu-1", "ansible_host": "10.0.0.11", "k26_server_kind": "sglang",
        "k26_gpu_required": True, "k26_tp_size": 8, "k26_gpu_count": 8, "k26_firewall": True,
        "k26_firewall_allow": ["10.20.0.0/16"], "k26_model_path": "/srv/models/Kimi-K2.6",
        "k26_draft_model_path": "/srv/models/Kimi-K2.6-DFlash", "k26_api_key": "5f0c8e2a9b7d4136a2c4e6f8b0d1e3f5"}

CASES = [
    ({"k26_verify_host": "127.0.0.1"}, ["k26_verify_host=127.0.0.1", "k26_host=10.0.0.11", "k26_health_timeout"]),
    ({"k26_host": "127.0.0.1", "k26_verify_host": "127.0.0.1"}, ["k26_host=127.0.0.1", "gw (k26_gateway_host)"]),
    ({"k26_gateway_worker_url": "http://10.0.0.11:30001"}, ["k26_gateway_worker_url=http://10.0.0.11:30001",
                                                             "k26_port=30000"]),
    ({"k26_tp_size": 16}, ["k26_tp_size=16", "k26_gpu_count=8"]),
    ({"k26_firewall_allow": ["10.20.0.0/16", "0.0.0.0/0"]}, ["k26_firewall_allow holds 0.0.0.0/0", "k26_firewall is true"]),
    ({"k26_firewall_allow": ["::/0"]}, ["k26_firewall_allow holds ::/0"]),
    ({"k26_model_path": "/home/ops/Kimi-K2.6"}, ["k26_model_path=/home/ops/Kimi-K2.6", "ProtectHome=yes"]),
    ({"k26_draft_model_path": "/tmp/draft"}, ["k26_draft_model_path=/tmp/draft", "PrivateTmp=yes"]),
    ({"k26_api_key": "a" * 16}, ["k26_api_key (not shown) has 1 distinct characters", "openssl rand -hex 24"]),
    ({"k26_api_key": "abcd" * 6}, ["in a repeated pattern"]),
]


def test_good_settings_pass_every_rule():
    assert k26_relations.k26_relation_errors(GOOD) == []


@pytest.mark.parametrize(("change", "said"), CASES)
def test_each_rule_names_both_variables(change, said):
    errors = k26_relations.k26_relation_errors({**GOOD, **change})
    print(errors)                                           # the messages, in the test's output
    assert len(errors) == 1 and all(s in errors[0] for s in said), errors
    assert "a" * 16 not in errors[0] and "abcd" * 6 not in errors[0]        # a key is never shown


def test_the_rules_boundaries():
    ok = k26_relations.k26_relation_errors
    assert ok({**GOOD, "k26_host": "0.0.0.0", "k26_verify_host": "127.0.0.1"}) == []      # every address: loopback too
    assert ok({**GOOD, "k26_host": "127.0.0.1", "k26_verify_host": "127.0.0.1", "k26_sandbox": True}) == []
    assert ok({**GOOD, "k26_host": "127.0.0.1", "k26_verify_host": "127.0.0.1", "k26_gateway_host": "gpu-1"}) == []
    assert ok({**GOOD, "k26_tp_size": 8, "k26_gpu_count": 8}) == [] and ok({**GOOD, "k26_tp_size": 16,
                                                                            "k26_server_kind": "reference"}) == []
    assert ok({**GOOD, "k26_firewall": False, "k26_firewall_allow": ["0.0.0.0/0"]}) == []
    assert ok({**GOOD, "k26_firewall_allow": ["0.0.0.0/1"]}) == []                          # wide, not everything
    assert ok({**GOOD, "k26_model_path": "/homework/m"}) == []                              # not /home/
    assert ok({**GOOD, "k26_api_key": "abcdefgh"}) == []                                    # 8 distinct: the bound
    assert len(ok({**GOOD, "k26_api_key": "abcdefga"})) == 1                                 # 7 distinct


def test_preflight_refuses_a_mismatch_before_any_connection(tmp_path):
    inv = unreachable_fleet(tmp_path)
    r = run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/check_inputs.yml", "--limit", "gpu-a",
             "-e", json.dumps({"k26_host": "10.9.9.9", "k26_verify_host": "127.0.0.1", "k26_state_dir": "/var/lib/k26"})],
            tmp_path)
    out = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0 and "UNREACHABLE" not in out, out[-3000:]
    assert "k26_verify_host=127.0.0.1 cannot reach a server bound to k26_host=10.9.9.9" in out, out[-3000:]

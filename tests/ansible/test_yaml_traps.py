"""Values an inventory writes one way and Ansible (YAML 1.1) reads another (issue 72, item 1): the filter that finds
them (roles/k26_defaults/filter_plugins/k26_yaml.py) and preflight refusing them before any host is contacted."""

from __future__ import annotations

import re

import yaml

from .conftest import BIN, ROOT, load_filters, run
from .test_check_first import unreachable_fleet

k26_yaml = load_filters("k26_yaml")

TRAPS = """\
k26_port: 030000
k26_ddtree_budget: 1:32
k26_service_env: {NCCL_P2P_DISABLE: yes}
k26_nccl_p2p: off
k26_firewall_allow: [10.0.0.0/8, on]
"""
SAFE = """\
k26_port: 30000
k26_ddtree_budget: "1:32"
k26_ddtree_topk_cap: 30_000
k26_service_env: {NCCL_P2P_DISABLE: "1"}
k26_nccl_p2p: false
k26_alert_error_ratio_budget: 0.005
k26_models: []
k26_extra_args: ["--tool-call-parser kimi_k2"]
k26_empty:
"""


def traps_of(tmp, text: str) -> list[str]:
    (tmp / "group_vars/k26").mkdir(parents=True, exist_ok=True)
    (tmp / "group_vars/k26/x.yml").write_text(text)
    return k26_yaml.k26_yaml_traps([str(tmp)])


def test_each_trap_is_named_with_its_line_its_reading_and_the_fix(tmp_path):
    found = traps_of(tmp_path, TRAPS)
    print("\n".join(found))                                  # the list, in the test's output
    assert len(found) == 5, found
    port, budget, env, p2p, allow = found
    assert port.endswith("x.yml:1: k26_port = 030000 is read by Ansible (YAML 1.1) as 12288 (a number), not as "
                         'written: write 30000 without the leading zero, or quote it ("030000")')
    assert "x.yml:2: k26_ddtree_budget = 1:32 is read by Ansible (YAML 1.1) as 92 (a number)" in budget
    assert 'quote it ("1:32")' in budget
    assert "k26_service_env.NCCL_P2P_DISABLE = yes is read by Ansible (YAML 1.1) as True (a boolean)" in env
    assert "k26_nccl_p2p = off is read by Ansible (YAML 1.1) as False" in p2p and "write true or false" in p2p
    assert "k26_firewall_allow[1] = on" in allow


def test_values_read_as_written_pass_and_so_do_the_examples(tmp_path):
    assert traps_of(tmp_path, SAFE) == []
    assert k26_yaml.k26_yaml_traps([str(ROOT / "inventory/production"), str(ROOT / "inventory/sandbox")]) == []
    # the vault is encrypted: left out, not misread
    vault = (ROOT / "inventory/production/group_vars/all/vault.yml").read_text()
    assert vault.startswith("$ANSIBLE_VAULT;")


def test_preflight_refuses_them_before_any_connection(tmp_path):
    inv = unreachable_fleet(tmp_path)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["k26"]["hosts"]["gpu-b"]["k26_state_dir"] = "/var/lib/k26"
    hosts["all"]["children"]["k26_gateway"]["hosts"]["gw"]["k26_gateway_port"] = 30080
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (inv / "group_vars/k26/traps.yml").write_text("k26_port: 030000\nk26_nccl_p2p: off\n")
    r = run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/check_inputs.yml"], tmp_path)
    out = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0 and "UNREACHABLE" not in out, out[-3000:]
    assert "traps.yml:1: k26_port = 030000 is read by Ansible (YAML 1.1) as 12288" in out, out[-3000:]
    assert "traps.yml:2: k26_nccl_p2p = off is read by Ansible (YAML 1.1) as False" in out, out[-3000:]

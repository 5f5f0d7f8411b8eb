"""Issue 29: every playbook checks every host's inputs first, before any lock or change, without
connecting to the hosts; the lock's TTL covers a failed deploy's waits; snapshots redact by value too."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import BIN, ROOT, run

PLAYBOOKS = ["playbooks/deploy.yml", "playbooks/snapshot.yml", "playbooks/rollback.yml", "playbooks/sweep.yml",
             "playbooks/maintenance.yml", "playbooks/stage_models.yml",
             "playbooks/validate.yml"]


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_every_playbook_starts_with_the_input_check_play(playbook):
    plays = yaml.safe_load((ROOT / playbook).read_text())
    assert plays[0].get("ansible.builtin.import_playbook") == "check_inputs.yml", plays[0]
    assert all("import_playbook" not in p and "ansible.builtin.import_playbook" not in p for p in plays[1:]), playbook


def test_the_input_check_play_covers_every_host_and_stops_the_whole_run():
    play = yaml.safe_load((ROOT / "playbooks/check_inputs.yml").read_text())[0]
    assert set(play["hosts"].split(":")) == {"k26", "k26_gateway", "k26_monitor", "k26_grafana"}
    assert play["any_errors_fatal"] is True and play["gather_facts"] is False


def unreachable_fleet(tmp: Path) -> Path:
    """Two server hosts and a gateway that nothing answers for (port 9 of loopback, discard): any
    connection attempt would show as UNREACHABLE."""
    inv = tmp / "inventory"
    (inv / "group_vars/k26").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_connection": "ssh"},
        "children": {"k26": {"hosts": {"gpu-a": {"k26_gateway_worker_url": "http://127.0.0.1:30000"},
                                       "gpu-b": {"k26_gateway_worker_url": "http://127.0.0.1:30001", "k26_port": 30001,
                                                 "k26_state_dir": "/var/lib"}}},
                     "k26_gateway": {"hosts": {"gw": {"k26_gateway_admin_key": "an-admin-key-of-24-chars",
                                                      "k26_gateway_port": 99999}}}}}}))
    (inv / "group_vars/k26/main.yml").write_text(yaml.safe_dump({
        "k26_model_path": "/srv/models/m", "k26_api_key": "a-test-key-of-24-chars00", "k26_gpu_required": False}))
    return inv


def test_bad_inputs_of_every_host_are_named_at_once_before_any_connection(tmp_path):
    inv = unreachable_fleet(tmp_path)
    r = run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/check_inputs.yml",
             "-e", json.dumps({"k26_extra_args": ["--api-key K"]})], tmp_path)
    out = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0
    assert "UNREACHABLE" not in out and "unreachable=0" in out          # no host was contacted
    assert "k26_state_dir=/var/lib is invalid: is a system folder" in out            # gpu-b
    assert "k26_gateway_port=99999 is invalid" in out                                # gw
    assert out.count("--api-key is set by the roles from k26_api_key") >= 2           # gpu-a and gpu-b
    assert all(f"{h} " in out for h in ("gpu-a", "gpu-b", "gw")) and "failed=1" in out


def check_good_fleet(tmp: Path, edit=lambda groups: None, playbook: str = "playbooks/check_inputs.yml",
                     extra: list[str] | None = None) -> tuple[subprocess.CompletedProcess, str]:
    """unreachable_fleet with its two bad values made good, then `edit(groups)` applied to its host groups, through
    PLAYBOOK (the input check by default): the run and its output with white space folded."""
    inv = unreachable_fleet(tmp)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    groups = hosts["all"]["children"]
    groups["k26"]["hosts"]["gpu-b"]["k26_state_dir"] = "/var/lib/k26"
    groups["k26_gateway"]["hosts"]["gw"]["k26_gateway_port"] = 30080
    edit(groups)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    r = run([str(BIN / "ansible-playbook"), "-i", str(inv), playbook, *(extra or [])], tmp)
    return r, re.sub(r"\s+", " ", r.stdout + r.stderr)


def test_good_inputs_pass_the_check_without_contacting_a_host(tmp_path):
    r, _ = check_good_fleet(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "unreachable=0" in r.stdout and "failed=0" in r.stdout


@pytest.mark.parametrize("change,message", [
    # smg passes each client's key on unchanged: one key for every host behind the gateway
    ({"gpu-b": {"k26_api_key": "another-key-of-24-chars0"}},
     "the k26 hosts behind this gateway have 2 different k26_api_key values"),
    # the gateway must accept the fleet's key (a rotation lists the next key there ahead)
    ({"gw": {"k26_gateway_api_keys": ["only-the-next-key-0123456"]}}, "k26_gateway_api_keys does not hold the fleet's key"),
    ({"gpu-a": {"k26_api_key_previous": "a-test-key-of-24-chars00"}}, "k26_api_key_previous equals k26_api_key"),
    ({"gpu-a": {"k26_api_key_previous": "too-short"}}, "k26_api_key_previous is 9 characters long"),
])
def test_the_fleets_keys_are_checked_before_any_connection(tmp_path, change, message):
    def apply(groups):
        for host, settings in change.items():
            groups["k26_gateway" if host == "gw" else "k26"]["hosts"][host].update(settings)

    r, out = check_good_fleet(tmp_path, apply)
    assert r.returncode != 0 and message in out, out[-3000:]
    assert "unreachable=0" in out
    for value in (v for settings in change.values() for v in settings.values()):
        assert str(value).strip("[]'") not in out                           # no key is printed


def evaluate(expression: str, tmp: Path, extra: dict, files: tuple[str, ...] = ()) -> str:
    """An expression of the roles evaluated by Ansible itself on the controller (the filters of
    roles/k26_defaults on the path), written to a file and read back."""
    out = tmp / "evaluated.txt"
    (tmp / "extra.json").write_text(json.dumps(extra))
    args = [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m", "ansible.builtin.copy",
            "-a", json.dumps({"content": "{{ " + expression + " }}", "dest": str(out)}), "-e", f"@{tmp / 'extra.json'}",
            "-e", f"ansible_python_interpreter={sys.executable}"]
    for f in files:
        args += ["-e", f"@{ROOT / f}"]
    r = run(args, tmp, env={"ANSIBLE_FILTER_PLUGINS": str(ROOT / "roles/k26_defaults/filter_plugins")})
    assert r.returncode == 0, r.stdout + r.stderr
    return out.read_text()


def test_the_host_locks_ttl_outlasts_a_failed_deploys_waits(tmp_path):
    """drain 660 + reboot 1800 (driver managed) + 2 health waits + ready 300 + margin 1800."""
    extra = {"k26_health_timeout": 3600, "k26_gateway_drain_timeout": 660, "k26_gateway_ready_timeout": 300,
             "k26_driver_reboot_timeout": 1800, "k26_lock_margin": 1800}
    managed = int(evaluate("k26_lock_ttl | int", tmp_path, {**extra, "k26_manage_driver": True},
                           ("roles/host_lock/defaults/main.yml",)))
    plain = int(evaluate("k26_lock_ttl | int", tmp_path, {**extra, "k26_manage_driver": False},
                         ("roles/host_lock/defaults/main.yml",)))
    assert managed == 660 + 1800 + 2 * 3600 + 300 + 1800
    assert plain == managed - 1800


def test_a_snapshot_redacts_a_urls_password_and_secret_names_but_keeps_the_rest(tmp_path):
    store = yaml.safe_load((ROOT / "roles/snapshot/tasks/store.yml").read_text())
    task = next(t for t in store if "_redacted" in (t.get("vars") or {}))
    expression = task["vars"]["_redacted"].strip()[2:-2]
    env = ("K26_API_KEY=abc\nHTTPS_PROXY=http://ops:hunter2@proxy.example:3128\nHF_TOKEN=hf_x\n"
           "DB_PASSWD=p\nNCCL_P2P_DISABLE=1\nNO_PROXY=localhost\n")
    shaped = ("MIRROR=https://m.example/x?token=s3cr3tvalue&a=1\nNCCL_DEBUG_SUBSYS=hf_AbCdEfGhIjKlMnOpQrSt\n"
              "SOME_SETTING=0123456789abcdef0123456789abcdef01\nLOG_URL=https://user:pw1@logs.example/x\n"
              "PATH=/opt/k26/releases/0123456789abcdef0123456789abcdef/venv/bin:/usr/bin\n"
              "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7\nSGLANG_DDTREE_BUDGET=1:8,16:16,32:8\n")
    out = evaluate(expression, tmp_path, {"_env_text": env + shaped})
    assert "hunter2" not in out and "HTTPS_PROXY=http://ops:<redacted>@proxy.example:3128" in out
    assert "K26_API_KEY=<redacted>" in out and "HF_TOKEN=<redacted>" in out and "DB_PASSWD=<redacted>" in out
    assert "NCCL_P2P_DISABLE=1" in out and "NO_PROXY=localhost" in out
    # issue 48: by the value's shape too, under names that sound harmless
    for secret in ("s3cr3tvalue", "hf_AbCdEfGhIjKlMnOpQrSt", "0123456789abcdef0123456789abcdef01", "pw1"):
        assert secret not in out, secret
    assert "PATH=/opt/k26/releases/0123456789abcdef0123456789abcdef/venv/bin:/usr/bin" in out      # a path part stays
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in out and "SGLANG_DDTREE_BUDGET=1:8,16:16,32:8" in out


def test_a_rollback_without_an_inventory_refuses_another_sites_tag_before_any_connection(tmp_path):
    """Without -i the run's inventory is ansible.cfg's sandbox: a tag taken on the site's hosts holds
    no snapshot of the sandbox hosts, and the rollback stops there naming the inventory it used."""
    repo = tmp_path / "snapshots"
    (repo / "k26-gpu-01").mkdir(parents=True)
    (repo / "k26-gpu-01" / "manifest.json").write_text("{}\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "site snapshot"], ["tag", "site-baseline"]):
        subprocess.run(git + args, check=True, capture_output=True)
    r = run([str(BIN / "ansible-playbook"), "playbooks/rollback.yml", "-e", "snapshot_tag=site-baseline",
             "-e", f"k26_snapshot_repo={repo}"], tmp_path)
    out = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0 and "unreachable=0" in out
    assert "snapshot_tag=site-baseline holds no snapshot of sandbox (it holds k26-gpu-01)" in out
    assert "(ansible.cfg's default, the local sandbox)" in out and "-i inventory/site" in out


HOOK = ["https://pager.invalid/hook"]


@pytest.mark.parametrize("monitor,refusal", [
    ({}, "k26_alert_webhooks is empty"),                           # a monitor host, no receiver: refused
    ({"k26_alert_webhooks": HOOK}, "k26_alert_heartbeat_webhooks is empty"),   # no heartbeat service (issue 49)
    ({"k26_alert_webhooks": HOOK, "k26_alert_heartbeat_webhooks": ["https://heartbeat.invalid/ping"]}, None),
    ({"k26_alerts_unrouted": True}, None),                         # no receiver, on purpose
    ({"k26_monitoring": False}, None),                             # monitoring left out of the run
])
def test_a_monitor_host_without_an_alert_receiver_is_refused_unless_on_purpose(tmp_path, monitor, refusal):
    """Issue 47: with a monitor host and no receiver, every alert stays in Alertmanager's UI and pages nobody; issue
    49: without a heartbeat service nothing notices the monitoring itself going quiet."""
    r, out = check_good_fleet(tmp_path, lambda groups: groups.update(k26_monitor={"hosts": {"gw": monitor}}))
    assert "unreachable=0" in out
    if refusal is None:
        assert r.returncode == 0, out[-3000:]
    else:
        assert r.returncode != 0 and f"gw runs Prometheus and Alertmanager, but {refusal}" in out, out[-3000:]
        assert "k26_alerts_unrouted: true" in out


def computed_names() -> set[str]:
    """Every set_fact and register name of the roles and playbooks, less those a role default or vars file defines."""
    names: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("ansible.builtin.set_fact", "set_fact") and isinstance(value, dict):
                    names.update(n for n in value if n != "cacheable")
                if key == "register" and isinstance(value, str):
                    names.add(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for f in [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("playbooks/*.yml"), *ROOT.glob("playbooks/tasks/*.yml")]:
        walk(yaml.safe_load(f.read_text()))
    defined = set()
    for f in [*ROOT.glob("roles/*/defaults/main.yml"), *ROOT.glob("roles/*/vars/main.yml"), ROOT / "playbooks/vars/fleet.yml"]:
        defined |= set(yaml.safe_load(f.read_text()) or {})
    return names - defined


def test_the_computed_list_is_every_set_fact_and_register_name():
    listed = set(yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_computed"])
    found = computed_names()
    assert found - listed == set(), f"computed by a task but not refused from outside: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but no task computes them: {sorted(listed - found)}"


def test_a_computed_fact_given_with_e_or_in_the_inventory_is_refused_before_any_connection(tmp_path):
    inv = unreachable_fleet(tmp_path)
    (inv / "host_vars").mkdir()
    (inv / "host_vars/gpu-b.yml").write_text(yaml.safe_dump({"__service_unit": {"changed": False}}))
    r = run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/check_inputs.yml", "--limit", "gpu-a:gpu-b",
             "-e", json.dumps({"k26_release_dir": "/usr", "_host_lock_token": "forged"})], tmp_path)
    out = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0 and "UNREACHABLE" not in out
    assert "__service_unit, _host_lock_token, k26_release_dir: computed by the plays, not an input" in out, out[-3000:]
    assert "_host_lock_token, k26_release_dir: computed by the plays" in out      # gpu-a: the -e values only


def test_every_variable_of_every_roles_argument_specs_has_a_rule():
    """Each is checked by type and pattern (_preflight_inputs), refused from outside as computed by a task
    (_preflight_computed), or - k26_gateway_host alone - held to the inventory by its own task (inputs.yml)."""
    preflight = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())
    covered = set(preflight["_preflight_inputs"]) | set(preflight["_preflight_computed"]) | {"k26_gateway_host"}
    names = {(name, spec.parent.parent.name)
             for spec in ROOT.glob("roles/*/meta/argument_specs.yml")
             for entry in yaml.safe_load(spec.read_text())["argument_specs"].values()
             for name in (entry.get("options") or {})}
    assert sorted(n for n in names if n[0] not in covered) == [], "argument_specs variables without a rule"


@pytest.mark.parametrize(("extra", "said"), [
    ({"k26_demo_api_keys": []}, "k26_demo_api_keys=[] is invalid: is a constant of this repository"),
    ({"k26_api_key_file": "/tmp/x.yaml"}, "k26_api_key_file=/tmp/x.yaml is invalid: is derived by the roles from k26_config_dir"),
    ({"k26_rollback_dir": "/etc"}, "k26_rollback_dir=/etc is invalid: is a system folder"),
    ({"k26_persistenced_exec": "/usr/bin/nvidia-persistenced\nExecStartPre=/bin/sh -c id"},
     "k26_persistenced_exec="),
    ({"k26_gpu_device_groups": ["video", "disk"]}, "k26_gpu_device_groups=['video', 'disk'] is invalid: item 1 ('disk')"),
    ({"k26_driver_reboot_timeout": -5}, "k26_driver_reboot_timeout=-5 is invalid: expected an integer 120..7200"),
    ({"k26_gpu_name_pattern": "RTX ("}, "k26_gpu_name_pattern='RTX (' is invalid: is not a regular expression"),
    ({"k26_models": [{"name": "t", "source": "ftp://x/y", "dest": "/srv/m", "digests": "/nonexistent"}]},
     "source ftp://x/y: expected https://HOST[:PORT][/PATH]"),
    ({"k26_gateway_host": "gpu-a"}, "k26_gateway_host=gpu-a is invalid: it is derived from the inventory's k26_gateway group"),
    ({"k26_models": [{"name": "target", "source": "https://hub.test/m/resolve/0123", "dest": "/srv/models/m/",
                      "digests": str(ROOT / "README.md")}], "k26_draft_model_path": "/srv/models/d"},
     "k26_models has no entry whose dest is the folder of k26_draft_model_path (/srv/models/d)"),
])
def test_each_new_rule_refuses_a_bad_value_before_any_connection(tmp_path, extra, said):
    inv = unreachable_fleet(tmp_path)
    (inv / "host_vars").mkdir()
    (inv / "host_vars/gpu-b.yml").write_text(yaml.safe_dump({"k26_state_dir": "/var/lib/k26"}))
    r = run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/check_inputs.yml", "--limit", "gpu-a:gpu-b",
             "-e", json.dumps(extra)], tmp_path)
    out = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0 and "UNREACHABLE" not in out and said in out, out[-3000:]


@pytest.mark.parametrize("inventory", ["inventory/sandbox", "inventory/production"])
def test_the_example_inventories_pass_every_new_rule(tmp_path, inventory):
    password = tmp_path / "vault-pass"
    password.write_text("k26-demo-vault-password\n")          # the example vault's (tests/ansible/test_site_inventory.py)
    r = run([str(BIN / "ansible-playbook"), "-i", inventory, "playbooks/check_inputs.yml",
             "--vault-password-file", str(password)], tmp_path)
    out = r.stdout + r.stderr
    assert "SGLang reads it as" not in out and "has no option" not in out, out[-3000:]
    assert "is derived by the roles" not in out and "constant of this repository" not in out, out[-3000:]
    assert "computed by the plays" not in out and "does not exist on the controller" not in out, out[-3000:]


def test_start_at_task_past_the_input_check_takes_no_lock_and_changes_nothing(tmp_path):
    """--start-at-task skips the check play whatever its tags; the lock's acquire then refuses before it connects."""
    r, out = check_good_fleet(tmp_path, lambda groups: None, playbook="playbooks/maintenance.yml",
                              extra=["--start-at-task", "Take the host lock", "-e", "maintenance_action=restart"])
    assert r.returncode != 0 and "UNREACHABLE" not in out, out[-3000:]
    assert "the input check (playbooks/check_inputs.yml, the first play of every playbook) did not run" in out


@pytest.mark.parametrize("playbook", [p for p in PLAYBOOKS if p != "playbooks/stage_models.yml"])
def test_tags_never_leave_out_the_input_check_or_a_lock(playbook, tmp_path):
    r = run([str(BIN / "ansible-playbook"), playbook, "--list-tasks", "--tags", "no-such-tag"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Check this host's inputs" in r.stdout and "Record that this host's inputs passed" in r.stdout
    assert re.search(r"Take the (host|fleet|host deploy) lock", r.stdout), r.stdout


SECRET_MARKER = "k26SecretMarker7f3a"


@pytest.mark.parametrize("extra", [
    {"k26_api_key": f"{SECRET_MARKER} with spaces"},
    {"k26_api_key_previous": f"{SECRET_MARKER}$"},
    {"k26_gateway_admin_key": f"{SECRET_MARKER} x"},
    {"k26_gateway_api_keys": [f"{SECRET_MARKER} y"]},
    {"k26_models_token": f"{SECRET_MARKER} z"},
    {"k26_service_env": {"NCCL_DEBUG": f"{SECRET_MARKER}$(id)"}},
    {"k26_service_env": {"LD_PRELOAD": SECRET_MARKER}},
    {"k26_alert_webhooks": [f"https://pager.invalid/{SECRET_MARKER} hook"]},
    {"k26_alert_heartbeat_webhooks": [f"https://heartbeat.invalid/{SECRET_MARKER} ping"]},
    {"k26_gateway_tls_key": f"-----BEGIN PRIVATE KEY-----\n{SECRET_MARKER}"},
])
def test_a_bad_secret_is_named_and_never_printed(tmp_path, extra):
    """Issue 48, item 5: every input that holds a key, a token, an env value or a receiver URL, given a bad value
    holding a marker: the run fails naming the variable, and no output holds the marker."""
    r, out = check_good_fleet(tmp_path, playbook="playbooks/check_inputs.yml", extra=["-e", json.dumps(extra)])
    assert r.returncode != 0 and f"{next(iter(extra))}=<not shown> is invalid" in out, out[-2000:]
    assert SECRET_MARKER not in r.stdout + r.stderr


@pytest.mark.parametrize("item,said", [
    ("--api-ke K", "SGLang reads it as --api-key, which the roles set from k26_api_key"),
    ("--disable-radix-cache --api-key=K", "SGLang reads it as --api-key"),
    ("--admin-api-k A", "SGLang reads it as --admin-api-key"),
    ("--enable-metric", "ambiguous option: --enable-metric could match"),
    ("--no-such-option", "SGLang 0.5.23 has no option --no-such-option"),
])
def test_extra_args_are_read_as_sglangs_own_parser_reads_them(tmp_path, item, said):
    """Issue 48: a prefix of an owned flag, a flag inside a value, the admin key, an ambiguous prefix and an option
    SGLang does not have, each refused by name before any connection (the option table: make sglang-flags)."""
    r, out = check_good_fleet(tmp_path, extra=["-e", json.dumps({"k26_extra_args": [item]})])
    assert r.returncode != 0 and "UNREACHABLE" not in out and said in out, out[-2000:]


def test_the_code_running_and_random_weight_options_warn_at_every_run(tmp_path):
    """Issue 72: k26_custom_logit_processors and k26_load_format dummy pass the check (their own variables) and print
    a WARNING naming the host in the first play of every playbook; off, no warning."""
    quiet, out = check_good_fleet(tmp_path)
    assert quiet.returncode == 0 and "WARNING: k26_custom" not in out and "WARNING: k26_load_format" not in out
    (tmp_path / "on").mkdir()
    r, out = check_good_fleet(tmp_path / "on", extra=["-e", json.dumps({"k26_custom_logit_processors": True,
                                                                        "k26_load_format": "dummy"})])
    assert r.returncode == 0, out[-2000:]
    for host in ("gpu-a", "gpu-b"):
        assert f"WARNING: k26_custom_logit_processors is true on {host}" in out, out[-3000:]
        assert f"WARNING: k26_load_format is dummy on {host}" in out


@pytest.mark.parametrize("extra,said", [
    ({"k26_verify_host": "198.51.100.7"}, "k26_verify_host=198.51.100.7 is invalid: the verify client sends the API key"),
    ({"k26_user": "deployer", "ansible_user": "deployer"}, "k26_user=deployer is invalid: it is the account Ansible logs in as"),
    # issue 48: a lock that expires while its holder still waits for health lets a second run take the host
    ({"k26_lock_ttl": 60, "k26_health_timeout": 120}, "k26_lock_ttl=60 is invalid: expected at least 2 x k26_health_timeout (240 s"),
    # issue 48: the service's writable folder inside a tree root runs from, or holding the release's
    ({"k26_state_dir": "/usr/local/lib/python3.11/dist-packages"},
     "k26_state_dir=/usr/local/lib/python3.11/dist-packages is invalid: it lies inside or holds /usr,"),
    ({"k26_prefix": "/var/lib/k26/opt"}, "k26_state_dir=/var/lib/k26 is invalid: it lies inside or holds /var/lib/k26/opt"),
])
def test_the_verify_host_and_the_service_account_are_held_to_this_host(tmp_path, extra, said):
    r, out = check_good_fleet(tmp_path, extra=["-e", json.dumps(extra)])
    assert r.returncode != 0 and said in out, out[-2000:]


@pytest.mark.parametrize("playbook,record", [("playbooks/deploy.yml", "record"), ("playbooks/rollback.yml", "record")])
def test_old_releases_are_removed_only_after_the_rollback_record(playbook, record):
    """Issue 48: a run stopped between the prune and the record would leave a saved state naming a removed release."""
    text = (ROOT / playbook).read_text()
    promote, prune = text.index("tasks_from: promote"), text.index("tasks_from: prune")
    saved = text.index(f"tasks_from: {record}", promote)      # the record after the promote
    assert promote < saved < prune
    assert "prune" not in (ROOT / "roles/release/tasks/promote.yml").read_text().split("# the releases beyond")[0]


@pytest.mark.parametrize(("extra", "said"), [
    ({"_rollback_env_dir": "/etc"}, "_rollback_env_dir: computed by the plays"),          # another role's vars file
    ({"_preflight_computed": []}, "_preflight_computed: computed by the plays"),          # its list, emptied
    ({"_preflight_inputs": {}}, "_preflight_inputs: computed by the plays"),              # every type rule, dropped
])
def test_a_role_vars_name_given_with_e_is_refused_even_the_checks_own(tmp_path, extra, said):
    """A name beginning with _ is a role's own (its vars file, a task's vars): -e outranks both, so a copied name
    (-e _rollback_env_dir=/etc) would steer the rollback, and -e of preflight's own lists would switch the checks
    off. Not guarded: the check task's own vars (-e outranks every variable; forging them is no slip of the hand)."""
    inv = unreachable_fleet(tmp_path)
    r = run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/check_inputs.yml", "--limit", "gpu-a",
             "-e", json.dumps(extra)], tmp_path)
    out = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0 and "UNREACHABLE" not in out and said in out, out[-3000:]


@pytest.mark.parametrize("dests", [("/srv/models/m", "/srv/models/d"), ("/srv/staged/elsewhere",)])
def test_models_staged_together_or_elsewhere_pass(tmp_path, dests):
    """The target and the draft both staged, or a model staged to a folder the server does not load (the sandbox's
    staging test): no refusal. One of the two alone is refused (test_each_new_rule_refuses_a_bad_value_...)."""
    models = [{"name": f"m{i}", "source": "https://hub.test/m/resolve/0123", "dest": d, "digests": str(ROOT / "README.md")}
              for i, d in enumerate(dests)]
    r, out = check_good_fleet(tmp_path, extra=["-e", json.dumps({"k26_models": models,
                                                                  "k26_draft_model_path": "/srv/models/d"})])
    assert "k26_models has no entry" not in out and r.returncode == 0, out[-3000:]

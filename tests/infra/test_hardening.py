"""testinfra: malformed settings change nothing, the unit quotes what it renders, the unit's exposure."""

from __future__ import annotations

import json
import re
import subprocess
import time

from .conftest import SANDBOX, deploy, guest
from .test_sandbox_host import service_state

# 24 malformed values across string, number, list and map variables, given to one deploy
MALFORMED = {
    "k26_host": "0.0.0.0 --api-key ''", "k26_port": "30000 --x", "k26_model_path": "/srv/m --trust-remote-code",
    "k26_draft_model_path": "relative/draft", "k26_served_model_name": "name with spaces",
    "k26_speculative_algorithm": "EAGLE", "k26_ddtree_budget": "16;", "k26_ddtree_topk_cap": -4,
    "k26_dflash_block_size": 1, "k26_cuda_graph": "maybe", "k26_cuda_graph_max_bs": 0,
    "k26_max_running_requests": "many", "k26_reference_dtype": "int4", "k26_reference_device": "cpu --x",
    "k26_user": "Root", "k26_state_dir": "/var/lib/k26\nReadWritePaths=/", "k26_timeout_stop_sec": 5,
    "k26_restart_sec": "1s", "k26_extra_args": ["--ok", "--evil $(id)"], "k26_service_env": {"A B": "1"},
    "k26_min_driver_version": "latest", "k26_nccl_p2p": "sometimes", "k26_health_timeout": "forever",
    "k26_releases_keep": 0,
}


def test_malformed_values_are_all_named_before_the_lock_and_change_nothing(host, converged, tmp_path):
    assert len(MALFORMED) >= 20
    before = service_state(host)
    play = deploy("-e", json.dumps(MALFORMED), tmp=tmp_path)
    text = re.sub(r"\s+", " ", play.out)
    assert play.rc != 0
    for name in MALFORMED:
        assert f"{name}=" in text and "is invalid" in text, name
    assert "Take the host deploy lock" not in play.out
    assert service_state(host) == before


def test_an_account_or_group_that_is_not_the_projects_is_refused_before_the_lock(host, converged, tmp_path):
    """Issue 48: a person's account (a login shell, a home of its own) or another program's group named as the
    service's is refused by preflight on the host, naming it, before the lock - nothing is taken over or changed."""
    guest("id k26person >/dev/null 2>&1 || useradd -m -s /bin/bash k26person; "
          "getent group k26other >/dev/null || groupadd -r k26other")
    try:
        before = service_state(host)
        for extra, said in ((("-e", "k26_user=k26person"), "k26_user=k26person is an account of this host that is not "
                                                             "the project's"),
                            (("-e", "k26_group=k26other"), "k26_group=k26other is a group of this host that is not the "
                                                           "project's")):
            play = deploy(*extra, tmp=tmp_path / extra[1].split("=")[0])
            text = re.sub(r"\s+", " ", play.out)
            assert play.rc != 0 and said in text, text[-3000:]
            assert "Take the host deploy lock" not in play.out
        assert guest("getent passwd k26person").stdout.split(":")[6].strip() == "/bin/bash"     # not taken over
        assert service_state(host) == before
    finally:
        guest("userdel -r k26person; groupdel k26other", check=False)


def test_a_folder_of_another_program_is_refused_before_the_lock(host, converged, tmp_path):
    """Issue 48: a folder the project owns must be new or already the project's; another program's (here a folder of
    nobody's holding a data file, named as the state folder) is refused on the host before the lock, naming its owner
    and what it holds - not given to the service user, nothing changed."""
    guest("mkdir -p /srv/otherapp && touch /srv/otherapp/data.db && chown -R nobody /srv/otherapp")
    try:
        before = service_state(host)
        play = deploy("-e", "k26_state_dir=/srv/otherapp", tmp=tmp_path)
        text = re.sub(r"\s+", " ", play.out)
        assert play.rc != 0 and ("k26_state_dir=/srv/otherapp is a folder of this host that is not the project's "
                                 "(owner nobody, 1 entry: data.db)") in text, text[-3000:]
        assert "Take the host deploy lock" not in play.out
        assert guest("stat -c %U /srv/otherapp").stdout.strip() == "nobody"
        assert service_state(host) == before
    finally:
        guest("rm -rf /srv/otherapp")


def test_a_value_past_preflight_is_still_one_word_on_the_command_line(tmp_path, converged):
    # the second wall: render (no preflight) a unit whose values would add flags, lines or expansions if
    # not quoted; run it under another name with an executable that prints each argument it receives
    out = tmp_path / "render"
    out.mkdir()
    root = "/run/k26-quoting-test"
    evil = {"k26_host": "0.0.0.0 --api-key x", "k26_served_model_name": 'a"b $HOME %n',
            "k26_extra_args": ["--flag value; --other"], "k26_venv": f"{root}/venv"}
    render = deploy("-e", f"k26_render_dir={out}", "-e", json.dumps(evil), tmp=tmp_path / "r",
                    playbook="tests/ansible/render.yml")
    assert render.rc == 0, render.out[-2000:]
    unit = (out / "sandbox.service").read_text()
    guest(f"mkdir -p {root}/venv/bin && printf '#!/bin/sh\\nfor a in \"$@\"; do echo \"<$a>\"; done\\n' "
          f"> {root}/venv/bin/ddtree-serve && chmod -R a+rX {root} && chmod +x {root}/venv/bin/ddtree-serve")
    name = "k26-quoting-test.service"
    subprocess.run(["ssh", "-F", str(SANDBOX / "ssh_config"), "k26-sandbox",
                    f"cat > /run/systemd/system/{name} && systemctl daemon-reload && systemctl start {name}"],
                   input=unit, text=True, check=True, timeout=60)
    try:
        argv = []
        for _ in range(40):
            lines = guest(f"journalctl -u {name} -o cat --no-pager").stdout.splitlines()
            argv = [x[1:-1] for x in lines if x.startswith("<") and x.endswith(">")]
            if "--config" in argv:
                break
            time.sleep(0.25)
        assert argv[argv.index("--host") + 1] == "0.0.0.0 --api-key x"      # one argument, spaces inside
        assert argv[argv.index("--served-model-name") + 1] == 'a"b $HOME %n'  # no expansion, no specifier
        assert argv[-2:] == ["--flag", "value; --other"] and argv.count("--api-key") == 0
    finally:
        guest(f"systemctl stop {name}; rm -f /run/systemd/system/{name}; systemctl daemon-reload; "
              f"systemctl reset-failed {name}; rm -rf {root}", check=False)


def test_the_unit_exposure_is_printed_and_at_most_4(converged):
    first = re.sub(r"\s+", " ", converged[0].out)
    found = re.search(r"systemd-analyze security k26-ddtree.service: exposure ([0-9.]+) \(at most 4.0\)", first)
    assert found, first[-3000:]
    assert float(found.group(1)) <= 4.0
    live = guest("systemd-analyze security --no-pager k26-ddtree.service").stdout
    level = re.search(r"Overall exposure level for k26-ddtree.service: ([0-9.]+)", live)
    assert level and float(level.group(1)) <= 4.0, live[-500:]


def test_the_hardened_service_writes_only_its_state_dir(host, converged):
    unit = host.file("/etc/systemd/system/k26-ddtree.service").content_string
    for line in ("ProtectSystem=strict", "ProtectProc=invisible", "DevicePolicy=closed", "CapabilityBoundingSet="):
        assert line in unit.splitlines()
    pid = host.check_output("systemctl show -p MainPID --value k26-ddtree")
    inside = f"nsenter -t {pid} -m --"                      # the service's own mount namespace, as root
    assert guest(f"{inside} touch /var/lib/k26/.k26-rw-test && rm /var/lib/k26/.k26-rw-test", check=False).returncode == 0
    for path in ("/opt/k26/.k26-ro-test", "/etc/.k26-ro-test", "/usr/.k26-ro-test"):
        denied = guest(f"{inside} touch {path} 2>&1", check=False)
        assert denied.returncode != 0 and "Read-only file system" in denied.stdout, (path, denied.stdout)

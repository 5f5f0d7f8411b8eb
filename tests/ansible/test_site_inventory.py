"""The README's site-inventory block, run as written on a copy: the site's own vault made with
ansible-vault (an editor script types two fresh keys; the password comes from a file instead of the
prompt), then every input checked with it; the example's demo vault refused outside the sandbox."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
from pathlib import Path

from .conftest import BIN, ROOT

BLOCK = re.compile(r"<!-- site-inventory -->\n(?:<!--[^\n]*-->\n)?```bash\n(.*?)```", re.S)


def readme_commands() -> list[str]:
    """The block's command lines, comments stripped (a line ending in `on the real host only` is not run here)."""
    found = BLOCK.search((ROOT / "docs/operations.md").read_text())
    assert found, "docs/operations.md has no site-inventory block"
    lines = [line.split("  #", 1)[0].strip() for line in found.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def edit_clients_network(site: str) -> None:
    """The operator's edit the block's comment asks for: the clients' network instead of the example's placeholder."""
    network = ROOT / site / "group_vars/k26/network.yml"
    text = network.read_text()
    assert "k26_firewall_allow: [192.0.2.0/24]" in text
    network.write_text(text.replace("k26_firewall_allow: [192.0.2.0/24]", "k26_firewall_allow: [10.20.0.0/16]"))


def run_block(tmp: Path, site: str, edit: bool = True) -> list[subprocess.CompletedProcess]:
    keys = {"vault_k26_api_key": secrets.token_hex(24), "vault_k26_gateway_admin_key": secrets.token_hex(24)}
    editor = tmp / "editor.sh"                 # what the operator types into ansible-vault's editor
    editor.write_text("#!/bin/sh\ncat > \"$1\" <<'EOF'\n---\n" + "".join(f"{k}: {v}\n" for k, v in keys.items()) + "EOF\n")
    editor.chmod(0o755)
    password = tmp / "vault-pass"
    password.write_text(secrets.token_hex(16) + "\n")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "EDITOR": str(editor),
           "ANSIBLE_VAULT_PASSWORD_FILE": str(password), "ANSIBLE_HOME": str(tmp / "home"),
           "ANSIBLE_LOCAL_TEMP": str(tmp / "tmp"), "ANSIBLE_NOCOLOR": "1"}
    done = []
    for line in readme_commands():
        if "deploy.yml" in line:
            continue                                           # the real host only
        if line == "make venv":              # the venv this test runs in: a dry run (a real one re-points the shared venv)
            done.append(subprocess.run(["make", "-n", "venv"], cwd=ROOT, env=env, capture_output=True, text=True,
                                       timeout=120))
            done[-1].args = ["make", "-n", "venv"]
            continue
        if line.startswith(". "):                              # the venv for the shell: it must be this very venv
            done.append(subprocess.run(["bash", "-c", f"{line} && command -v ansible-playbook ansible-vault"], cwd=ROOT,
                                       env=env, capture_output=True, text=True, timeout=120))
            done[-1].args = [".", line]
            assert done[-1].stdout.split() == [str(BIN / "ansible-playbook"), str(BIN / "ansible-vault")], done[-1]
            continue
        argv = [a for a in shlex.split(line.replace("inventory/site", site)) if a != "--ask-vault-pass"]
        if edit and "check_inputs.yml" in line:
            edit_clients_network(site)
        # ansible-vault opens the editor only on a terminal: util-linux's `script` gives it one
        wrapped = ["script", "-qec", shlex.join(argv), "/dev/null"] if argv[0] == "ansible-vault" else argv
        done.append(subprocess.run(wrapped, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600))
        done[-1].args = argv
        if done[-1].returncode != 0:
            break
    return done


def test_the_readmes_site_inventory_block_works_as_written(tmp_path):
    site = f"inventory/.site-test-{os.getpid()}"                  # beside the example: its relative paths hold
    try:
        done = run_block(tmp_path, site)
        for r in done:
            assert r.returncode == 0, (r.args, r.stdout[-3000:], r.stderr[-3000:])
        assert [r.args[0] for r in done] == ["make", ".", "cp", "rm", "ansible-vault", "ansible-playbook"]
        vault = (ROOT / site / "group_vars/all/vault.yml").read_text()
        assert vault.startswith("$ANSIBLE_VAULT;") and "demo" not in vault
        assert "failed=0" in done[-1].stdout and "unreachable=0" in done[-1].stdout
        # the example has no monitor host: every check and deploy says that nothing pages anyone
        assert "WARNING: the inventory has no k26_monitor host" in re.sub(r"\s+", " ", done[-1].stdout)
    finally:
        shutil.rmtree(ROOT / site, ignore_errors=True)


def test_the_examples_placeholder_network_is_refused_until_the_site_lists_its_clients(tmp_path):
    site = f"inventory/.site-net-{os.getpid()}"
    try:
        done = run_block(tmp_path, site, edit=False)
        check = done[-1]
        assert check.args[1:3] == ["-i", site] and check.returncode != 0
        out = re.sub(r"\s+", " ", check.stdout)
        assert "k26_firewall_allow holds 192.0.2.0/24: a documentation network" in out, out[-3000:]
        assert "inventory/site/group_vars/k26/network.yml" in out
    finally:
        shutil.rmtree(ROOT / site, ignore_errors=True)


def test_the_example_vaults_demo_keys_are_refused_outside_the_sandbox(tmp_path):
    password = tmp_path / "vault-pass"
    password.write_text("k26-demo-vault-password\n")
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", "inventory/production", "playbooks/check_inputs.yml",
                        "--vault-password-file", str(password)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "ANSIBLE_HOME": str(tmp_path / "home"), "ANSIBLE_NOCOLOR": "1"})
    out = re.sub(r"\s+", " ", r.stdout)
    assert r.returncode != 0 and "k26_api_key is the demo key of the example vault" in out
    assert "demo-api-key-replace-me" not in out


def test_ansible_vault_create_refuses_an_existing_file(tmp_path):
    """Why the block removes the demo vault first."""
    target = tmp_path / "vault.yml"
    target.write_text("x\n")
    password = tmp_path / "p"
    password.write_text("p\n")
    argv = [str(BIN / "ansible-vault"), "create", "--vault-password-file", str(password), str(target)]
    r = subprocess.run(["script", "-qec", shlex.join(argv), "/dev/null"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "EDITOR": "true"})
    assert r.returncode != 0 and "exists" in (r.stdout + r.stderr), r.stdout + r.stderr
    assert target.read_text() == "x\n"

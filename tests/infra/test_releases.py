"""testinfra: each deploy runs its own release venv; rollback and pruning never touch the healthy one.

Each new release costs a venv build on the sandbox (about 20 s from the local wheelhouse without
bytecode), so the release story runs as one test: a failed build, a release that fails its smoke, a
healthy release with pruning, and the original release rebuilt at the end.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest

from .conftest import ROOT, current_release, deploy, guest

API_KEY = "sandbox-demo-key"


CHAT_ROUTE = "src/ddtree/serve/routes/chat.py"


def source_copy(into: Path, patch: tuple[str, str, str] | None = None, note: str = "") -> Path:
    """A copy of the sources the wheel is built from, changed so it builds another release;
    patch = (file, old text, new text)."""
    into.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, into / name)
    shutil.copytree(ROOT / "src", into / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    if patch:
        target = into / patch[0]
        text = target.read_text()
        assert patch[1] in text, f"the patch of {patch[0]} no longer applies: update the test"
        target.write_text(text.replace(patch[1], patch[2], 1))
    app = into / "src" / "ddtree" / "serve" / "app.py"
    app.write_text(app.read_text() + f"\n# {note}\n")
    return into


def snapshot_of(host) -> dict[str, str]:
    """What runs: the service's PID, the current release, its .ready record, the unit's release."""
    unit = host.file("/etc/systemd/system/k26-ddtree.service").content_string
    return {"pid": host.check_output("systemctl show -p MainPID --value k26-ddtree"),
            "current": current_release(host),
            "ready": host.check_output(f"stat -c %Y:%s {current_release(host)}/.ready"),
            "unit_release": re.search(r"/opt/k26/releases/[0-9a-f]+", unit).group(0)}


def releases(host) -> set[str]:
    return set(host.check_output("ls -d /opt/k26/releases/*/").replace("/\n", "\n").rstrip("/").split())


def answers_with_the_key(host) -> bool:
    code = host.check_output(
        f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {API_KEY}' "
        f"-H 'content-type: application/json' -d '{{\"prompt\": \"hi\", \"max_tokens\": 2}}' "
        f"http://127.0.0.1:30000/v1/completions")
    return code == "200"


@pytest.mark.extended
def test_releases_fail_alone_and_old_ones_are_pruned(host, converged, tmp_path):
    start = snapshot_of(host)
    assert start["unit_release"] == start["current"]
    present = releases(host)

    # 1. a build that fails (a source folder with no project in it; a folder that does not exist is refused by the
    #    input check before any change): nothing the service uses changed, so no restart
    empty = tmp_path / "no-project"
    empty.mkdir()
    failed_build = deploy("-e", f"k26_extension_source={empty}", tmp=tmp_path / "a")
    text = re.sub(r"\s+", " ", failed_build.out)
    assert failed_build.rc != 0 and "holds no pyproject.toml" in text, text[-3000:]
    assert "no restart needed" in text, text[-3000:]
    assert snapshot_of(host) == start

    # 2. a new release that starts and is healthy but fails the smoke (chat completions answer 500):
    #    the previous release runs again, with its unit, env files and key
    route = "async def chat_completions(body: ChatCompletionRequest, service: Service = Depends(service_of)):\n"
    broken = source_copy(tmp_path / "broken", (CHAT_ROUTE, route, route + "    raise RuntimeError('broken on purpose')\n"),
                         f"broken {uuid.uuid4()}")
    failed = deploy("-e", f"k26_extension_source={broken}", tmp=tmp_path / "b")
    text = re.sub(r"\s+", " ", failed.out)
    assert failed.rc != 0 and "Send smoke chat completions" in text, text[-3000:]
    assert "restarted k26-ddtree" in text and "healthy again" in text, text[-3000:]
    after = snapshot_of(host)
    assert after["pid"] != start["pid"]                       # the failed release ran, then the old one again
    assert {k: after[k] for k in ("current", "ready", "unit_release")} == \
           {k: start[k] for k in ("current", "ready", "unit_release")}
    built = releases(host) - present
    assert len(built) == 1 and start["current"] in releases(host), built   # the failed release stays, not current
    assert answers_with_the_key(host)

    # 3. a healthy new release becomes current; with keep=1 every other release is pruned
    fine = source_copy(tmp_path / "fine", note=f"another release {uuid.uuid4()}")   # a new release every run
    ok = deploy("-e", f"k26_extension_source={fine}", "-e", "k26_releases_keep=1", tmp=tmp_path / "c")
    assert ok.rc == 0, ok.out[-3000:]
    now = snapshot_of(host)
    assert now["current"] not in present | built and now["unit_release"] == now["current"]
    assert releases(host) == {now["current"]}
    assert answers_with_the_key(host)

    # 4. back to this checkout's release (built again: it was pruned)
    back = deploy(tmp=tmp_path / "d")
    assert back.rc == 0, back.out[-3000:]
    assert snapshot_of(host)["current"] == start["current"]


PROMOTE_ONLY = "tests/infra/plays/promote_only.yml"


def test_promotion_needs_the_running_process_to_be_the_release(host, tmp_path):
    """Issue 48: the release becomes current only when systemd holds no older copy of the unit, the main process
    runs from the release folder and started after the unit was written; each way of failing that is refused by
    name and `current` stays where it was. The host is put back as it was after each case."""
    unit = "/etc/systemd/system/k26-ddtree.service"
    before = current_release(host)
    ok = deploy(tmp=tmp_path / "ok", playbook=PROMOTE_ONLY)
    assert ok.rc == 0, ok.out[-3000:]

    written = host.check_output(f"stat -c %Y {unit}")
    try:                                   # a lost daemon-reload: the unit on disk is newer than systemd's copy
        guest(f"echo '# not yet loaded' >> {unit}")
        lost = deploy(tmp=tmp_path / "lost", playbook=PROMOTE_ONLY)
    finally:
        guest(f"sed -i '/^# not yet loaded$/d' {unit} && touch -d @{written} {unit} && systemctl daemon-reload")
    assert lost.rc != 0 and "not promoting" in lost.out and "NeedDaemonReload=yes" in lost.out, lost.out[-3000:]
    assert current_release(host) == before

    try:                                   # the unit rewritten after the process started (a restart that never ran)
        guest(f"touch -d '+1 hour' {unit} && systemctl daemon-reload")
        stale = deploy(tmp=tmp_path / "stale", playbook=PROMOTE_ONLY)
    finally:
        guest(f"touch -d @{written} {unit} && systemctl daemon-reload")
    assert stale.rc != 0 and "not promoting" in stale.out and "against the unit written at" in stale.out, \
        stale.out[-3000:]
    assert current_release(host) == before

    # a release that is not the one running (extra vars win over the play's own fact)
    promote_other = deploy("-e", "k26_release_dir=/opt/k26/releases/0000", tmp=tmp_path / "other",
                           playbook=PROMOTE_ONLY)
    assert promote_other.rc != 0 and "command line under the release: False" in promote_other.out, \
        promote_other.out[-3000:]
    assert current_release(host) == before
    again = deploy(tmp=tmp_path / "again", playbook=PROMOTE_ONLY)
    assert again.rc == 0, again.out[-3000:]

"""playbooks/sweep.yml on the sandbox host: results, the original restored, the lock, an interrupted run."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import time

import pytest

from .conftest import BIN, ROOT, SINGLE_HOST, deploy, guest, not_waited_for

SMALL = '{"sweep_budgets": [4, 16], "sweep_topk_caps": [4], "sweep_max_tokens": 12, "sweep_concurrency": 2}'


def original_is_running() -> None:
    unit = guest("cat /etc/systemd/system/k26-ddtree.service").stdout
    assert "--speculative-ddtree-budget 16" in unit and "--speculative-ddtree-topk-cap 4" in unit
    health = guest("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout
    assert health == "200"
    assert guest("test -e /var/lib/k26-rollback/sweep-in-progress", check=False).returncode != 0


def test_sweep_writes_results_and_restores_the_original(converged, tmp_path):
    """Two loads (1 and 2 at once) and the schedule written into an inventory overlay's host_vars (that a deploy
    from such an overlay renders and serves its schedule: the extended test below, issue 43)."""
    overlay = tmp_path / "overlay"
    (overlay / "host_vars").mkdir(parents=True)
    (overlay / "hosts.yml").write_text("all:\n  children:\n    k26:\n      hosts:\n        sandbox:\n")
    schedule_file = overlay / "host_vars" / "sandbox" / "ddtree_schedule.yml"
    loads = json.dumps({"sweep_concurrency_levels": [1, 2], "sweep_write_schedule": True,
                        "sweep_schedule_file": str(schedule_file)})
    play = deploy("-e", SMALL, "-e", loads, "-e", f"sweep_results_root={tmp_path}", tmp=tmp_path / "a",
                  playbook="playbooks/sweep.yml")
    assert play.rc == 0, play.out[-4000:]
    [run] = [p for p in tmp_path.iterdir() if p.name.endswith("Z")]
    rows = list(csv.DictReader((run / "results.csv").open()))
    configs = {("DDTREE", b) for b in ("4", "16")} | {("DFLASH", ""), ("NONE", "")}
    assert {(r["algorithm"], r["budget"], r["temperature"]) for r in rows} == \
        {(a, b, t) for a, b in configs for t in ("0.0", "0.7")}
    assert all(r["status"] == "ok" and float(r["tokens_per_s"]) > 0 and r["errors"] == "0" for r in rows)
    # the server's own counters over each load: tokens/s, and generated tokens per verify step (the
    # reference engine counts every target pass as one, so plain decoding reads 1.0 there)
    assert all(float(r["server_tokens_per_s"]) > 0 for r in rows)
    assert all(float(r["server_accept_length"]) == 1.0 for r in rows if r["algorithm"] == "NONE")
    assert all(float(r["server_accept_length"]) >= 1.0 for r in rows if r["algorithm"] == "DDTREE")
    summary = (run / "results.md").read_text()
    assert "Best at temperature 0" in summary and "(DFLASH x" in summary and "NONE x" in summary
    assert (run / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the monitoring role's speculation floors, from this sweep (k26_alert_sweep_results)
    floors = json.loads((run / "thresholds.json").read_text())
    best = max((r for r in rows if r["algorithm"] == "DDTREE" and r["temperature"] == "0.0"),
               key=lambda r: float(r["server_tokens_per_s"]))
    assert floors["accept_length_floor"] == round(0.8 * float(best["server_accept_length"]), 3)
    [none] = [r for r in rows if r["algorithm"] == "NONE" and r["temperature"] == "0.0"
              and r["concurrency"] == best["concurrency"]]
    assert floors["tokens_per_s_per_request_floor"] == round(float(none["server_tokens_per_s"]) / int(none["concurrency"]), 3)
    assert "best" in play.out
    original_is_running()
    # every configuration at both loads; the schedule is the fastest DDTREE budget at each load
    assert {(r["algorithm"], r["budget"], r["concurrency"]) for r in rows if r["temperature"] == "0.0"} == \
        {(a, b, c) for a, b in configs for c in ("1", "2")}
    fastest = {c: max((r for r in rows if r["algorithm"] == "DDTREE" and r["temperature"] == "0.0"
                       and r["concurrency"] == c and r["cuda_graph"] == best["cuda_graph"]),
                      key=lambda r: float(r["server_tokens_per_s"]))["budget"] for c in ("1", "2")}
    want = fastest["1"] if fastest["1"] == fastest["2"] else f"1:{fastest['1']},2:{fastest['2']}"
    plan = json.loads((run / "schedule.json").read_text())
    assert plan["k26_ddtree_budget"] == want and plan["k26_ddtree_topk_cap"] == "4", plan
    written = schedule_file.read_text()
    assert f'k26_ddtree_budget: "{want}"' in written and 'k26_ddtree_topk_cap: "4"' in written
    # ddtree-serve has no overlap scheduler: every row and the written schedule say SGLang's default, auto
    assert {r["overlap_schedule"] for r in rows} == {"auto"} and 'k26_overlap_schedule: "auto"' in written


@pytest.mark.extended
def test_a_schedule_in_an_inventory_overlay_is_rendered_and_served_by_the_next_deploy(converged, tmp_path):
    """What the sweep writes (host_vars/HOST/ddtree_schedule.yml, as above) taken by the next deploy from the
    inventory with that overlay, then the original again."""
    overlay = tmp_path / "overlay"
    (overlay / "host_vars" / "sandbox").mkdir(parents=True)
    (overlay / "hosts.yml").write_text("all:\n  children:\n    k26:\n      hosts:\n        sandbox:\n")
    want = "1:4,2:16"
    (overlay / "host_vars" / "sandbox" / "ddtree_schedule.yml").write_text(
        f'k26_ddtree_budget: "{want}"\nk26_ddtree_topk_cap: "4"\nk26_overlap_schedule: "auto"\n')
    try:
        rendered = deploy("-i", "inventory/sandbox", "-i", str(overlay))
        assert rendered.rc == 0, rendered.out[-4000:]
        assert f"--speculative-ddtree-budget {want}" in guest("cat /etc/systemd/system/k26-ddtree.service").stdout
        info = json.loads(guest("curl -s -H 'Authorization: Bearer sandbox-demo-key' "
                                "http://127.0.0.1:30000/server_info").stdout)   # the sandbox inventory's key
        assert str(info["budget"]) == want, info
    finally:
        back = deploy()
    assert back.rc == 0, back.out[-4000:]
    original_is_running()


def test_sweep_fails_fast_while_the_lock_is_held(converged, tmp_path):
    holder = guest("exec 9>>/run/k26-deploy/lock; flock -n 9 || exit 75; "
                   "echo 'feed someone-else@elsewhere controller-pid 1 since now ttl 300' > /run/k26-deploy/holder; "
                   "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!").stdout.strip()
    try:
        play = deploy("-e", SMALL, "-e", f"sweep_results_root={tmp_path}", tmp=tmp_path / "a",
                      playbook="playbooks/sweep.yml")
        assert play.rc != 0 and "another play holds /run/k26-deploy/lock" in play.out
        assert "someone-else@elsewhere" in play.out and not_waited_for(play)
    finally:
        guest(f"kill {holder}", check=False)   # the sleep this test started
    original_is_running()


def kill_a_sweep_in_its_first_configuration(tmp_path) -> None:
    """Start a sweep and SIGKILL ansible-playbook once the first configuration's unit is written."""
    env = os.environ.copy()
    env.update(PATH=f"{BIN}:{env['PATH']}", ANSIBLE_HOME=str(tmp_path / "home"), ANSIBLE_NOCOLOR="1")
    log = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen([str(BIN / "ansible-playbook"), "playbooks/sweep.yml", *SINGLE_HOST, "-e", SMALL, "-e",
                             f"sweep_results_root={tmp_path}"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline:  # kill it once the first sweep configuration is being applied
        unit = guest("cat /etc/systemd/system/k26-ddtree.service").stdout
        if "--speculative-ddtree-budget 4" in unit:
            break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    mark = guest("cat /var/lib/k26-rollback/sweep-in-progress", check=False)
    assert mark.returncode == 0 and mark.stdout.startswith("release: /opt/k26/releases/"), mark.stdout


@pytest.mark.extended
def test_an_interrupted_sweep_is_repaired_by_the_next_run(converged, tmp_path):
    kill_a_sweep_in_its_first_configuration(tmp_path)
    play = deploy("-e", '{"sweep_budgets": [16], "sweep_topk_caps": [4], "sweep_max_tokens": 8, "sweep_references": [], '
                  '"sweep_temperatures": [0.0]}', "-e",
                  f"sweep_results_root={tmp_path}", tmp=tmp_path / "b", playbook="playbooks/sweep.yml")
    text = re.sub(r"\s+", " ", play.out)
    assert play.rc == 0, text[-3000:]
    assert "Tell the dead run's holder to end" in text  # the killed run's lock was taken over
    assert "restoring the configuration an interrupted sweep left" in text
    original_is_running()


@pytest.mark.extended
def test_a_deploy_after_an_interrupted_sweep_wins_over_what_the_sweep_saved(converged, tmp_path):
    """The deploy after the dead sweep is the state to keep: it forgets the sweep's mark, and the next
    sweep restores the deploy's configuration, not the one the dead sweep saved (issue 29)."""
    kill_a_sweep_in_its_first_configuration(tmp_path)
    play = deploy("-e", "k26_smoke_max_tokens=12", tmp=tmp_path / "d")
    assert play.rc == 0, play.out[-3000:]
    assert guest("test -e /var/lib/k26-rollback/sweep-in-progress", check=False).returncode != 0
    play = deploy("-e", '{"sweep_budgets": [16], "sweep_topk_caps": [4], "sweep_max_tokens": 8, "sweep_references": [], '
                  '"sweep_temperatures": [0.0]}', "-e",
                  f"sweep_results_root={tmp_path}", tmp=tmp_path / "b", playbook="playbooks/sweep.yml")
    text = re.sub(r"\s+", " ", play.out)
    assert play.rc == 0, text[-3000:]
    assert "an interrupted sweep left" not in text and "was deployed since" not in text
    original_is_running()


def test_a_sweep_the_server_cannot_decode_is_refused_before_the_lock(converged, tmp_path):
    play = deploy("-e", SMALL, "-e", f"sweep_results_root={tmp_path}", "-e", "k26_server_kind=sglang", "-e", "k26_attention_backend=fa3",
                  tmp=tmp_path / "a", playbook="playbooks/sweep.yml")
    out = re.sub(r"\s+", " ", play.out)
    assert play.rc != 0 and "k26_attention_backend=fa3 cannot verify a DDTree with sglang" in out, out[-3000:]
    assert "Take the host lock" not in play.out
    original_is_running()

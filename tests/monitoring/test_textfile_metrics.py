"""The host's textfile collector (roles/monitoring/files/k26_textfile_metrics.py) on the CPU: the GPUs
from nvidia-smi's CSV and the kernel log's Xid lines, a host without GPUs marked skipped, the locks
(held by another open file's flock, since when, the TTL), disks, thresholds and expected workers."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("k26_textfile_metrics", ROOT / "roles/monitoring/files/k26_textfile_metrics.py")
collector = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("k26_textfile_metrics", collector)
_spec.loader.exec_module(collector)

SMI = ("0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 61, 412.50, 90112, 97887, 0, 3, 2430, 0x0000000000000000\n"
       "1, NVIDIA RTX PRO 6000 Blackwell Server Edition, 63, 398.10, 90100, 97887, 2, 0, 2430, 0x0000000000000004\n"
       "2, NVIDIA RTX PRO 6000 Blackwell Server Edition, 58, [N/A], 12, 97887, [N/A], [N/A], 2430, 0x0\n")
KERNEL = ("NVRM: Xid (PCI:0000:81:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
          "some other line\n"
          "NVRM: Xid (PCI:0000:81:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
          "NVRM: Xid (PCI:0000:C1:00): 31, pid=99, name=python3, Ch 00000008, intr 10000000. MMU Fault\n")


def test_gpus_and_xid_lines_become_metrics():
    lines = collector.gpu_lines(SMI, KERNEL)
    text = "\n".join(lines)
    assert 'k26_gpu_collector_skipped{reason=""} 0' in lines
    assert 'k26_gpu_temperature_celsius{gpu="1",name="NVIDIA RTX PRO 6000 Blackwell Server Edition"} 63.0' in lines
    assert 'k26_gpu_ecc_uncorrected_errors{gpu="1",name="NVIDIA RTX PRO 6000 Blackwell Server Edition"} 2.0' in lines
    assert 'k26_gpu_throttle_reasons{gpu="1",name="NVIDIA RTX PRO 6000 Blackwell Server Edition"} 4' in lines
    assert 'k26_gpu_power_watts{gpu="2"' not in text and 'k26_gpu_ecc_uncorrected_errors{gpu="2"' not in text   # [N/A]
    assert 'k26_gpu_xid_errors_total{pci="0000:81:00",xid="79"} 2' in lines
    assert 'k26_gpu_xid_errors_total{pci="0000:c1:00",xid="31"} 1' in lines


def test_a_host_without_gpus_says_the_collector_skipped():
    assert collector.gpu_lines(None, "") == ['k26_gpu_collector_skipped{reason="no nvidia-smi on this host"} 1']


# --- issue 71, item 3: GPU loss seen -------------------------------------------------------------------------------

def collector_run(tmp_path: Path, smi_rc: int, kernel: str, expected: int = 3) -> str:
    """The collector's command as the timer runs it, with an nvidia-smi that prints SMI and exits smi_rc and a
    journalctl that prints `kernel`; its k26-gpu.prom."""
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    (tmp_path / "smi.csv").write_text(SMI)
    (tmp_path / "kernel.log").write_text(kernel)
    (tools / "nvidia-smi").write_text(f"#!/bin/sh\n[ {smi_rc} = 0 ] && cat {tmp_path / 'smi.csv'}\n"
                                      f"[ {smi_rc} = 0 ] || echo 'Unable to determine the device handle' >&2\n"
                                      f"exit {smi_rc}\n")
    (tools / "journalctl").write_text(f"#!/bin/sh\ncat {tmp_path / 'kernel.log'}\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"locks": {}, "thresholds": {}, "expected_gpus": expected}))
    out = tmp_path / "textfile"
    r = subprocess.run([sys.executable, str(ROOT / "roles/monitoring/files/k26_textfile_metrics.py"), "--out", str(out),
                        "--config", str(config)], capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{tools}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return (out / "k26-gpu.prom").read_text()


XID_79 = "NVRM: Xid (PCI:0000:81:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"


def xid_value(prom: str, xid: str) -> str:
    """The value of the Xid series as written ("_": absent)."""
    found = [ln.rsplit(" ", 1)[1] for ln in prom.splitlines() if ln.startswith("k26_gpu_xid_errors_total") and
             f'xid="{xid}"' in ln]
    return found[0] if found else "_"


def test_a_first_xid_is_written_at_0_once_then_at_its_count(tmp_path):
    runs = [collector_run(tmp_path, 0, ""), collector_run(tmp_path, 0, XID_79), collector_run(tmp_path, 0, XID_79),
            collector_run(tmp_path, 0, XID_79 * 2)]
    assert [xid_value(r, "79") for r in runs] == ["_", "0", "1", "2"]
    assert json.loads((tmp_path / "textfile/k26-xid-seen.json").read_text())["seen"] == [["0000:81:00", "79"]]


def test_a_new_boot_starts_the_xid_codes_again(tmp_path):
    seen = {("0000:81:00", "79")}
    collector.write_seen(tmp_path / "seen.json", "boot-a", seen)
    assert collector.read_seen(tmp_path / "seen.json", "boot-a") == seen
    assert collector.read_seen(tmp_path / "seen.json", "boot-b") == set()
    (tmp_path / "seen.json").write_text("not json")
    assert collector.read_seen(tmp_path / "seen.json", "boot-a") == set()


def test_a_failing_nvidia_smi_keeps_the_xid_lines_and_counts_no_gpu(tmp_path):
    collector_run(tmp_path, 0, XID_79)                       # seen once, while nvidia-smi still answered
    prom = collector_run(tmp_path, 255, XID_79)               # after Xid 79 nvidia-smi fails
    lines = prom.splitlines()
    assert 'k26_gpu_collector_skipped{reason="nvidia-smi failed"} 1' in lines
    assert "k26_gpu_visible{} 0" in lines and "k26_gpu_expected{} 3" in lines
    assert 'k26_gpu_xid_errors_total{pci="0000:81:00",xid="79"} 1' in lines
    assert not any(ln.startswith("k26_gpu_temperature_celsius") for ln in lines)
    healthy = collector_run(tmp_path, 0, XID_79).splitlines()
    assert "k26_gpu_visible{} 3" in healthy and 'k26_gpu_collector_skipped{reason=""} 0' in healthy


def test_the_xid_alert_fires_on_the_collectors_own_output_and_would_not_on_a_series_starting_at_1(tmp_path):
    """The collector's files of five runs a minute apart (the first Xid 79 between the second and the third), as
    promtool's input series: K26GpuXid fires. The same counts without the 0 (the old collector) fire nothing."""
    import os

    import pytest
    import yaml

    promtool = os.environ.get("K26_PROMTOOL", "")
    if not promtool or not Path(promtool).exists():
        pytest.skip("K26_PROMTOOL is not set: `make promtool` unpacks Debian's, make test sets it")
    kernels = ["", "", XID_79, XID_79, XID_79]
    written = " ".join(xid_value(collector_run(tmp_path, 0, k), "79") for k in kernels)
    assert written == "_ _ 0 1 1"
    old = written.replace(" 0 ", " 1 ")

    def case(values: str, expected: list) -> dict:
        return {"interval": "1m",
                "input_series": [{"series": 'k26_gpu_xid_errors_total{host="gpu1", pci="0000:81:00", xid="79"}',
                                  "values": values}],
                "alert_rule_test": [{"eval_time": "4m", "alertname": "K26GpuXid", "exp_alerts": expected}]}

    rules = yaml.safe_load((ROOT / "roles/monitoring/files/k26-alerts.rules.yml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "K26GpuXid")
    fired = [{"exp_labels": {"severity": "page", "host": "gpu1", "pci": "0000:81:00", "xid": "79"},
              "exp_annotations": {**rule["annotations"], "summary": "GPU Xid 79 on gpu1"}}]
    for values, expected, ok in ((written, fired, True), (old, fired, False), (old, [], True)):
        test = tmp_path / "xid.test.yml"
        test.write_text(yaml.safe_dump({"rule_files": [str(ROOT / "roles/monitoring/files/k26-alerts.rules.yml")],
                                        "tests": [case(values, expected)]}))
        r = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
        assert (r.returncode == 0) == ok, (values, expected, r.stdout[-2000:])


def test_a_held_lock_its_age_and_ttl_and_the_rest_of_the_state(tmp_path):
    locks = tmp_path / "run-k26-deploy"
    locks.mkdir()
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 120))
    (locks / "holder").write_text(f"ab12cd34 ops@controller controller-pid 4242 since {since} ttl 300\n")
    free = tmp_path / "run-k26-fleet"
    free.mkdir()
    (free / "lock").touch()
    config = {"locks": {"host": str(locks), "fleet": str(free)}, "snapshot_paths": [str(tmp_path / "not-yet")],
              "thresholds": {"accept_length_floor": 2.5, "queue_depth_max": 64},
              "expected_workers": {"http://10.0.0.2:30000": "gpu2"}}
    with open(locks / "lock", "a") as holder:               # the holder loop's flock, as another open file
        fcntl.flock(holder, fcntl.LOCK_EX)
        lines = collector.state_lines(config, time.time())
    by_name = {ln.split("{")[0] + ln.split("{")[1].split("}")[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines}
    assert by_name[f'k26_lock_heldlock="host",lock_dir="{locks}"'] == 1
    assert 118 <= by_name[f'k26_lock_held_secondslock="host",lock_dir="{locks}"'] <= 125
    assert by_name[f'k26_lock_ttl_secondslock="host",lock_dir="{locks}"'] == 300
    assert by_name[f'k26_lock_heldlock="fleet",lock_dir="{free}"'] == 0
    assert "k26_maintenance{} 1" in lines
    assert 0 < by_name[f'k26_snapshot_disk_used_ratiopath="{tmp_path / "not-yet"}"'] < 1
    assert 'k26_alert_threshold{name="accept_length_floor"} 2.5' in lines
    assert 'k26_gateway_expected_worker{worker="http://10.0.0.2:30000",host="gpu2"} 1' in lines
    assert "k26_maintenance{} 0" in collector.state_lines(config, time.time())  # released


def test_the_command_writes_both_files_whole(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"locks": {}, "thresholds": {"queue_depth_max": 8}}))
    out = tmp_path / "textfile"
    r = subprocess.run([sys.executable, str(ROOT / "roles/monitoring/files/k26_textfile_metrics.py"), "--out", str(out),
                        "--config", str(config)], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})                     # no nvidia-smi on PATH
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["k26-gpu.prom", "k26-state.prom", "k26-xid-seen.json"]
    assert (out / "k26-gpu.prom").read_text() == 'k26_gpu_collector_skipped{reason="no nvidia-smi on this host"} 1\n'
    state = (out / "k26-state.prom").read_text()
    assert 'k26_alert_threshold{name="queue_depth_max"} 8' in state
    # the run's end, which K26CollectorStale compares with the time (a stopped collector leaves the files)
    stamp = float(state.split("k26_collector_last_success_timestamp_seconds{} ", 1)[1].split()[0])
    assert abs(stamp - time.time()) < 60


def test_throttle_reasons_one_series_each_and_the_power_limit():
    """Issue 49: PromQL has no bit operators, so each reason an alert reads is its own 0/1 series; the power limit
    beside the draw (nvidia-smi's last field)."""
    smi = ("0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 91, 600.00, 90112, 97887, 0, 0, 1800, 0x0000000000000044, 600.00\n"
           "1, NVIDIA RTX PRO 6000 Blackwell Server Edition, 55, 120.00, 12, 97887, 0, 0, 2430, 0x0000000000000001, 600.00\n")
    lines = collector.gpu_lines(smi, "")
    gpu = 'gpu="{}",name="NVIDIA RTX PRO 6000 Blackwell Server Edition"'
    active = {ln.split('reason="')[1].split('"')[0] + "@" + ln.split('gpu="')[1][0]: int(ln.rsplit(" ", 1)[1])
              for ln in lines if ln.startswith("k26_gpu_throttle_active")}
    assert active == {"sw_power_cap@0": 1, "hw_slowdown@0": 0, "sw_thermal_slowdown@0": 0, "hw_thermal_slowdown@0": 1,
                      "hw_power_brake_slowdown@0": 0, "sw_power_cap@1": 0, "hw_slowdown@1": 0,
                      "sw_thermal_slowdown@1": 0, "hw_thermal_slowdown@1": 0, "hw_power_brake_slowdown@1": 0}
    assert f"k26_gpu_throttle_reasons{{{gpu.format(0)}}} 68" in lines       # the mask stays, 0x44
    assert f"k26_gpu_power_limit_watts{{{gpu.format(1)}}} 600.0" in lines


def test_the_watched_disks_by_purpose(tmp_path):
    """Issue 49: the root, log, model and extra disks as k26_disk_used_ratio{purpose, path}; a folder not made yet
    is measured on its parent's disk."""
    config = {"locks": {}, "disks": {"root": "/", "model": str(tmp_path / "models" / "not-yet")}}
    lines = collector.state_lines(config, time.time())
    ratios = {ln.split('purpose="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1])
              for ln in lines if ln.startswith("k26_disk_used_ratio")}
    assert sorted(ratios) == ["model", "root"] and all(0 <= r <= 1 for r in ratios.values())
    assert abs(ratios["model"] - collector.used_ratio(tmp_path)) < 0.01



def test_a_lock_whose_locking_process_ended_is_still_held(tmp_path):
    """The host lock as try_lock takes it: `flock` (gone at once) locks descriptor 9 of a shell whose
    background loop keeps the descriptor; the lock is held while the loop runs, then free."""
    folder = tmp_path / "run-k26-deploy"
    folder.mkdir()
    loop = subprocess.Popen(["bash", "-c", f'exec 9>>{folder}/lock; flock --nonblock 9 || exit 75; '
                             'exec sleep 30'], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not collector.lock_state(folder, time.time()).held:
            assert loop.poll() is None and time.monotonic() < deadline, "the loop never took the lock"
            time.sleep(0.05)
        assert collector.lock_state(folder, time.time()).held            # the probe did not take it
    finally:
        loop.kill()
        loop.wait()
    assert not collector.lock_state(folder, time.time()).held


def test_xid_lines_come_from_dmesg_on_a_host_without_journalctl(tmp_path, monkeypatch):
    """The H200 test bed has nvidia-smi and no journalctl: the collector read no kernel log there
    until it fell back to dmesg (it crashed first)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dmesg").write_text("#!/bin/sh\nprintf 'usb 1-1: new device\\n" + KERNEL.replace("\n", "\\n") + "'\n")
    (bin_dir / "dmesg").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    log = collector.kernel_log()
    assert log.count("NVRM: Xid") == 3 and "usb" not in log
    assert 'k26_gpu_xid_errors_total{pci="0000:81:00",xid="79"} 2' in collector.gpu_lines(SMI, log)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert collector.kernel_log() == ""


def test_a_host_stopped_by_maintenance_is_in_maintenance_until_its_marker_goes(tmp_path):
    """playbooks/maintenance.yml's stop leaves `stopped` in the host lock's folder: k26_maintenance 1 with no lock
    held, and how long ago; a start (or a deploy, or a reboot: the folder is under /run) removes it."""
    locks = tmp_path / "run-k26-deploy"
    locks.mkdir()
    (locks / "lock").touch()
    config = {"locks": {"host": str(locks)}, "thresholds": {}}
    assert "k26_maintenance{} 0" in collector.state_lines(config, time.time())
    (locks / "stopped").write_text("stopped by playbooks/maintenance.yml\n")
    lines = collector.state_lines(config, time.time() + 120)
    assert "k26_maintenance{} 1" in lines and 'k26_lock_held{lock="host",lock_dir="' + str(locks) + '"} 0' in lines
    age = float(next(ln for ln in lines if ln.startswith("k26_stopped_by_maintenance_seconds")).rsplit(" ", 1)[1])
    assert 115 < age < 130
    (locks / "stopped").unlink()
    lines = collector.state_lines(config, time.time())
    assert "k26_maintenance{} 0" in lines and "k26_stopped_by_maintenance_seconds{} 0" in lines

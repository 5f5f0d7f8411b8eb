"""The host's own metrics for Prometheus, as node exporter textfiles (run by k26-metrics.timer as
root; each file written whole, then renamed, so a scrape never reads half of one).

    k26_textfile_metrics.py --out DIR --config FILE

k26-gpu.prom      from `nvidia-smi --query-gpu` (temperature, power and its limit, memory, ECC, clocks,
                  throttle reasons: the bit mask and one 0/1 series per reason an alert reads), the GPUs it
                  lists against those the inventory expects (k26_gpu_visible, k26_gpu_expected: one missing
                  pages), and the kernel log's `NVRM: Xid` lines, counted by code since boot. Each Xid series
                  is first written at 0 (the codes seen this boot are kept in k26-xid-seen.json beside the
                  files), so that increase() sees its first error too; Xid lines are written whether or not
                  nvidia-smi answers (after Xid 79 it fails). A host without nvidia-smi, or whose nvidia-smi
                  fails, gets k26_gpu_collector_skipped{reason=...} 1.
k26-state.prom    the deploy locks (held, since how long, their TTL: k26_maintenance is 1 while the
                  host lock is held - a deploy, sweep or validation is changing the host - and while the
                  service is stopped by playbooks/maintenance.yml: k26_stopped_by_maintenance_seconds), the used share
                  of the snapshot folders' disks, the alert thresholds and, on a gateway host, the
                  workers it must route to (from FILE, which the monitoring role writes from the inventory),
                  and on a k26 host what it runs: k26_service_info{release, algorithm, budget, topk_cap,
                  cuda_graph} 1 (the release `current` points at; the rest from the unit's ExecStart, so
                  a sweep's configuration shows while it runs); the used share of the root, model and log
                  disks (k26_disk_used_ratio{purpose, path}); and the time this run finished
                  (k26_collector_last_success_timestamp_seconds: a stopped or failing collector leaves
                  its files in place, so their values alone cannot show it).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

GPU_FIELDS = ("index", "name", "temperature.gpu", "power.draw", "memory.used", "memory.total",
              "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total", "clocks.sm",
              "clocks_throttle_reasons.active", "power.limit")
# nvidia-smi's clocks_throttle_reasons bits that slow a GPU down against its will (NVML's
# nvmlClocksEventReason*: idle, application clocks, sync boost and display clocks are left out)
THROTTLE_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                    0x80: "hw_power_brake_slowdown"}
XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+)")
HOLDER = re.compile(r"^(?P<token>[0-9a-f]+) (?P<owner>\S+) controller-pid (?P<pid>\S+) since (?P<since>\S+) ttl (?P<ttl>\d+)")


def line(name: str, labels: dict, value) -> str:
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in labels.items())
    return f"{name}{{{inner}}} {value}"


def number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None          # "[N/A]", "[Not Supported]"


# --- GPUs ---------------------------------------------------------------------------------------

NO_SMI, SMI_FAILED = "no nvidia-smi on this host", "nvidia-smi failed"


def gpu_lines(smi: str | None, kernel_log: str, skipped: str = NO_SMI, expected: int = 0,
              seen: set[tuple[str, str]] | None = None) -> list[str]:
    """Prometheus lines of the GPUs (nvidia-smi's CSV; None: `skipped` says why there is none), of how many it lists
    against `expected` (0: no expectation, nothing written), and of the kernel log's Xid lines (xid_lines)."""
    out = [line("k26_gpu_collector_skipped", {"reason": "" if smi is not None else skipped}, 0 if smi is not None else 1)]
    rows = smi.strip().splitlines() if smi is not None else []
    if expected:
        out += [line("k26_gpu_visible", {}, len(rows)), line("k26_gpu_expected", {}, expected)]
    return out + smi_lines(rows) + xid_lines(kernel_log, seen)


def smi_lines(rows: list[str]) -> list[str]:
    out = []
    names = {"temperature.gpu": "k26_gpu_temperature_celsius", "power.draw": "k26_gpu_power_watts",
             "memory.used": "k26_gpu_memory_used_mib", "memory.total": "k26_gpu_memory_total_mib",
             "ecc.errors.uncorrected.volatile.total": "k26_gpu_ecc_uncorrected_errors",
             "ecc.errors.corrected.volatile.total": "k26_gpu_ecc_corrected_errors", "clocks.sm": "k26_gpu_sm_clock_mhz",
             "power.limit": "k26_gpu_power_limit_watts"}
    for row in rows:
        cells = dict(zip(GPU_FIELDS, (c.strip() for c in row.split(","))))
        labels = {"gpu": cells["index"], "name": cells["name"]}
        for field, metric in names.items():
            value = number(cells.get(field, ""))
            if value is not None:
                out.append(line(metric, labels, value))
        reasons = cells.get("clocks_throttle_reasons.active", "")
        if reasons.startswith("0x"):
            out += throttle_lines(labels, int(reasons, 16))
    return out


def xid_counts(kernel_log: str) -> dict[tuple[str, str], int]:
    """(PCI address, Xid code) -> how many times this boot's kernel log has it."""
    counts: dict[tuple[str, str], int] = {}
    for m in XID.finditer(kernel_log):
        key = (m["pci"].lower(), m["xid"])
        counts[key] = counts.get(key, 0) + 1
    return counts


def xid_lines(kernel_log: str, seen: set[tuple[str, str]] | None = None) -> list[str]:
    """One counter per (PCI address, Xid code); with `seen` (the codes of earlier runs this boot, updated here), a
    code not seen before is written at 0 this run and at its count from the next on, so that increase() over the
    alert's window sees the step from 0 (a series that starts at 1 shows no increase)."""
    out = []
    for key, n in sorted(xid_counts(kernel_log).items()):
        first = seen is not None and key not in seen
        out.append(line("k26_gpu_xid_errors_total", {"pci": key[0], "xid": key[1]}, 0 if first else n))
        if seen is not None:
            seen.add(key)
    return out


def read_seen(path: Path, boot_id: str) -> set[tuple[str, str]]:
    """The Xid codes written before during this boot (an unreadable file or another boot: none)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(data, dict) or data.get("boot_id") != boot_id:
        return set()
    return {(str(p), str(x)) for p, x in data.get("seen", [])}


def write_seen(path: Path, boot_id: str, seen: set[tuple[str, str]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"boot_id": boot_id, "seen": sorted(seen)}))
    os.replace(tmp, path)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def throttle_lines(labels: dict, mask: int) -> list[str]:
    """The mask as nvidia-smi gave it, and k26_gpu_throttle_active{reason} 0/1 for each reason an alert
    reads (PromQL has no bit operators)."""
    return [line("k26_gpu_throttle_reasons", labels, mask)] + [
        line("k26_gpu_throttle_active", {**labels, "reason": reason}, int(bool(mask & bit)))
        for bit, reason in THROTTLE_REASONS.items()]


def read_gpus() -> tuple[str | None, str, str]:
    """(nvidia-smi's CSV or None, why there is none, this boot's Xid lines): the Xid lines whatever nvidia-smi did."""
    if shutil.which("nvidia-smi") is None:
        return None, NO_SMI, kernel_log()
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60)
        ok = smi.returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    return (smi.stdout if ok else None), SMI_FAILED, kernel_log()


def kernel_log() -> str:
    """This boot's kernel lines with `NVRM: Xid`: the journal's, else dmesg's (a host or container
    without journalctl), else none."""
    if shutil.which("journalctl"):
        argv = ["journalctl", "-k", "-b", "--no-pager", "-o", "cat", "--grep", "NVRM: Xid"]
    elif shutil.which("dmesg"):
        argv = ["dmesg", "--notime"]
    else:
        return ""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    return "".join(line + "\n" for line in out.splitlines() if "NVRM: Xid" in line)


# --- locks, disks, thresholds, expected workers --------------------------------------------------

@dataclass(frozen=True)
class LockState:
    held: bool
    held_seconds: float
    ttl_seconds: float


def flock_held(path: Path) -> bool:
    """Whether a process holds the file's flock: a non-blocking try on an open file of our own,
    released at once. /proc/locks cannot say: it hides a flock whose locking process has ended
    (the holder loop keeps the descriptor, the `flock` command that took the lock is gone) from
    every pid namespace but the first, a container's included. A deploy's own try waits 2 s
    (host_lock's try_lock), so this moment's hold never fails it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def lock_state(folder: Path, now: float) -> LockState:
    """A lock is held while a process holds its flock (the holder loop does); its record says since
    when and for how long."""
    lock = folder / "lock"
    if not lock.exists() or not flock_held(lock):
        return LockState(False, 0.0, 0.0)
    found = HOLDER.match((folder / "holder").read_text()) if (folder / "holder").exists() else None
    if not found:
        return LockState(True, 0.0, 0.0)
    since = datetime.strptime(found["since"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    return LockState(True, max(0.0, now - since), float(found["ttl"]))


def used_ratio(path: Path) -> float:
    """The used share of the file system holding path (its nearest existing parent: a folder a deploy
    has not made yet), as df counts it: the blocks an unprivileged user cannot use are used."""
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return round(1 - st.f_bavail / st.f_blocks, 4) if st.f_blocks else 0.0


def stopped_seconds(folder: Path, now: float) -> float | None:
    """How long ago playbooks/maintenance.yml stopped the service (its marker in the host lock's folder, root's and
    gone at reboot), or None when it did not."""
    try:
        return round(max(0.0, now - (folder / "stopped").stat().st_mtime), 1)
    except OSError:
        return None


def state_lines(config: dict, now: float) -> list[str]:
    out = []
    maintenance = 0
    for name, folder in config.get("locks", {}).items():
        state = lock_state(Path(folder), now)
        labels = {"lock": name, "lock_dir": folder}
        out += [line("k26_lock_held", labels, int(state.held)), line("k26_lock_held_seconds", labels, state.held_seconds),
                line("k26_lock_ttl_seconds", labels, state.ttl_seconds)]
        maintenance |= state.held and name == "host"
        if name == "host":
            stopped = stopped_seconds(Path(folder), now)
            out.append(line("k26_stopped_by_maintenance_seconds", {}, stopped if stopped is not None else 0))
            maintenance |= stopped is not None
    out.append(line("k26_maintenance", {}, int(maintenance)))
    for path in config.get("snapshot_paths", []):
        out.append(line("k26_snapshot_disk_used_ratio", {"path": path}, used_ratio(Path(path))))
    for purpose, path in sorted(config.get("disks", {}).items()):
        out.append(line("k26_disk_used_ratio", {"purpose": purpose, "path": path}, used_ratio(Path(path))))
    for name, value in sorted(config.get("thresholds", {}).items()):
        out.append(line("k26_alert_threshold", {"name": name}, value))
    for worker, host in sorted(config.get("expected_workers", {}).items()):
        out.append(line("k26_gateway_expected_worker", {"worker": worker, "host": host}, 1))
    return out


# --- what the service runs ----------------------------------------------------------------------

def exec_start_words(unit_text: str) -> list[str]:
    """The words of the unit's ExecStart (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", unit_text)
    found = re.search(r"^ExecStart=(.*)$", joined, re.MULTILINE)
    return found.group(1).split() if found else []


def flag(words: list[str], name: str, default: str = "") -> str:
    return words[words.index(name) + 1] if name in words and words.index(name) + 1 < len(words) else default


def service_lines(unit_text: str | None, release: str) -> list[str]:
    """k26_service_info: the release, and from the unit's ExecStart the speculative algorithm, the
    DDTree budget and top-k cap, CUDA graphs on or off. No unit (a gateway host): no line."""
    words = exec_start_words(unit_text) if unit_text is not None else []
    if not words:
        return []
    algorithm = flag(words, "--speculative-algorithm", "NONE")
    labels = {"release": release, "algorithm": algorithm,
              "budget": flag(words, "--speculative-ddtree-budget") if algorithm == "DDTREE" else "",
              "topk_cap": flag(words, "--speculative-ddtree-topk-cap") if algorithm == "DDTREE" else "",
              "cuda_graph": "false" if flag(words, "--cuda-graph-backend-decode") == "disabled" else "true"}
    return [line("k26_service_info", labels, 1)]


def write_textfile(folder: Path, name: str, lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, folder / name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the node exporter's textfile folder")
    ap.add_argument("--config", type=Path, required=True, help="JSON: locks, snapshot_paths, disks, thresholds, expected_workers, service_unit, current_release, expected_gpus")
    args = ap.parse_args(argv)
    config = json.loads(args.config.read_text())
    smi, why, xids = read_gpus()
    seen_file, boot = args.out / "k26-xid-seen.json", boot_id()
    seen = read_seen(seen_file, boot)
    write_textfile(args.out, "k26-gpu.prom", gpu_lines(smi, xids, why, int(config.get("expected_gpus", 0)), seen))
    write_seen(seen_file, boot, seen)
    unit = Path(config["service_unit"]) if config.get("service_unit") else None
    unit_text = unit.read_text() if unit is not None and unit.exists() else None
    current = Path(config.get("current_release", "/nonexistent"))
    release = current.resolve().name if current.is_symlink() else ""
    now = time.time()
    finished = [line("k26_collector_last_success_timestamp_seconds", {}, round(now, 3))]
    write_textfile(args.out, "k26-state.prom", state_lines(config, now) + service_lines(unit_text, release) + finished)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

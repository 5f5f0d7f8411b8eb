"""Preflight's capacity reading on the host (read-only): sizes of the model folders, free and total
space where the releases and the caches go, and the host's memory, as one JSON object in GiB.

    python3 k26_capacity.py PREFIX STATE_DIR MODEL [DRAFT]
"""

from __future__ import annotations

import json
import os
import sys

GIB = 1 << 30


def folder_gib(path: str) -> float:
    """Bytes of the regular files under path (a model folder: safetensors and configs), in GiB."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                total += os.path.getsize(full)
    return round(total / GIB, 1)


def filesystem(path: str) -> dict:
    """Free and total GiB of the filesystem that holds path (its nearest existing parent)."""
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    st = os.statvfs(path)
    return {"free": round(st.f_bavail * st.f_frsize / GIB, 1), "size": round(st.f_blocks * st.f_frsize / GIB, 1),
            "device": os.stat(path).st_dev}


def memory() -> dict:
    """MemTotal and MemAvailable from /proc/meminfo, in GiB."""
    values = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, rest = line.split(":", 1)
            values[name] = int(rest.split()[0]) * 1024
    return {"total": round(values["MemTotal"] / GIB, 1), "available": round(values["MemAvailable"] / GIB, 1)}


def main(argv: list[str]) -> int:
    prefix, state, model = argv[:3]
    draft = argv[3] if len(argv) > 3 and argv[3] else None
    prefix_fs, state_fs = filesystem(prefix), filesystem(state)
    out = {"model_gib": folder_gib(model), "draft_gib": folder_gib(draft) if draft else 0.0,
           "prefix": {k: prefix_fs[k] for k in ("free", "size")}, "state": {k: state_fs[k] for k in ("free", "size")},
           "same_filesystem": prefix_fs["device"] == state_fs["device"], "memory": memory()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

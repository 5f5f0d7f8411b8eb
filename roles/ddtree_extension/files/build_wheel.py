"""Build the k26-ddtree wheel on the controller once per source tree; print where it is.

Usage: build_wheel.py SOURCE BUILD_DIR  ->  {"wheel": PATH, "sha256": HEX, "built": BOOL} on stdout.

The wheel is kept under BUILD_DIR/<hash of the sources>/, so an unchanged tree costs one pass of
hashing (no pip, no setuptools); timestamps are fixed (SOURCE_DATE_EPOCH), so a rebuild of the
same sources gives the same sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip file can hold
INPUTS = ("pyproject.toml", "README.md", "LICENSE", "src")
SKIPPED_PARTS = {"__pycache__", ".pytest_cache"}


def source_files(source: Path) -> list[Path]:
    """The files that go into the wheel (sorted, so the hash does not depend on listing order)."""
    found: list[Path] = []
    for name in INPUTS:
        top = source / name
        if top.is_file():
            found.append(top)
        elif top.is_dir():
            found.extend(p for p in top.rglob("*") if p.is_file() and not SKIPPED_PARTS & set(p.parts)
                         and p.suffix != ".pyc" and ".egg-info" not in str(p))
    return sorted(found)


def tree_hash(source: Path) -> str:
    digest = hashlib.sha256()
    for path in source_files(source):
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(source: Path, into: Path) -> Path:
    """pip wheel into a temporary folder next to `into`, then rename (a killed build leaves nothing)."""
    into.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=into.parent))
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--wheel-dir", str(tmp), str(source)],
                       check=True, env={**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH})
        tmp.rename(into)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return into


def wheel_in(folder: Path) -> Path | None:
    wheels = sorted(folder.glob("k26_ddtree-*.whl")) if folder.is_dir() else []
    return wheels[0] if len(wheels) == 1 else None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: build_wheel.py SOURCE BUILD_DIR", file=sys.stderr)
        return 2
    source, build_dir = Path(argv[0]).resolve(), Path(argv[1])
    if not (source / "pyproject.toml").is_file():
        print(f"build_wheel.py: SOURCE={source} holds no pyproject.toml: pass the repository root", file=sys.stderr)
        return 2
    folder = build_dir / tree_hash(source)
    wheel = wheel_in(folder)
    built = wheel is None
    if built:
        shutil.rmtree(folder, ignore_errors=True)
        wheel = wheel_in(build(source, folder))
        if wheel is None:
            print(f"build_wheel.py: pip built no single k26_ddtree wheel in {folder}", file=sys.stderr)
            return 1
    print(json.dumps({"wheel": str(wheel), "sha256": file_sha256(wheel), "built": built}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""training/put_draft.sh on the CPU: a draft brought back alone (speed_sweep.sh PACK=draft) put over the carried pair
whose target it was trained on, parted again; the next session's speed_sweep.sh finds that pair trained. A block-16
draft takes the target into its own folder; a missing part or a used output folder writes nothing."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.helpers import speed_sweep_snapshot, speed_sweep_train

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def put(*args: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "training/put_draft.sh", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin"})


def members(parts_dir: Path) -> dict[str, bytes]:
    joined = parts_dir / "joined.tgz"
    joined.write_bytes(b"".join(p.read_bytes() for p in sorted(parts_dir.glob("pair.tgz.part*"))))
    with tarfile.open(joined) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def joined_parts(carried: tuple[Path, Path], to: Path) -> None:
    """The carried pair's parts of both folders in one (as the GPU machine gathers them)."""
    to.mkdir()
    for part in [*carried[0].iterdir(), *carried[1].iterdir()]:
        (to / part.name).write_bytes(part.read_bytes())


@pytest.fixture(scope="module")
def carried(tmp_path_factory) -> tuple[Path, Path]:
    """A block-8 pair packed in parts (as carried), split over two folders like .gpu-pairs/speed-d1 and -d2."""
    tmp = tmp_path_factory.mktemp("carried")
    (tmp / "parts").mkdir()
    speed_sweep_train(tmp / "speed", PACK="1", OUT=str(tmp / "parts"))
    parts = sorted((tmp / "parts").iterdir())
    (tmp / "d1").mkdir(), (tmp / "d2").mkdir()
    for i, part in enumerate(parts):
        part.rename(tmp / ("d1" if i == 0 else "d2") / part.name)
    return tmp / "d1", tmp / "d2"


@pytest.mark.parametrize("block", ["8", pytest.param("16", marks=pytest.mark.extended)])   # 16: make test-cpu-extended
def test_a_draft_brought_back_alone_goes_over_its_target(tmp_path, carried, block):
    d1, d2 = carried
    joined_parts(carried, tmp_path / "all")
    (tmp_path / "draft").mkdir()
    speed_sweep_train(tmp_path / "gpu", UNPACK=str(tmp_path / "all"), PACK="draft", OUT=str(tmp_path / "draft"),
                REDRAFT="1", DISTILL="1", BLOCK=block)
    r = put(d1, d2, tmp_path / "draft", tmp_path / "new")
    assert r.returncode == 0, r.stderr
    old, new = members(tmp_path / "all"), members(tmp_path / "new")
    trained = tmp_path / "gpu/pair"
    assert new[f"pair/b{block}/draft/model.safetensors"] == (trained / f"b{block}/draft/model.safetensors").read_bytes()
    assert new[f"pair/b{block}/target/model.safetensors"] == old["pair/b8/target/model.safetensors"]
    assert new["pair/train.json"] == (trained / "train.json").read_bytes()
    assert new["pair/train_prompts.json"] == old["pair/train_prompts.json"]
    assert (block == "8") == ("pair/b8/target/model.safetensors" in new)        # b16: the target moved, one copy
    sums = (tmp_path / "new/pair-sums.txt").read_text()
    assert all(p.name in sums for p in (tmp_path / "new").glob("pair.tgz.part*"))
    # the next session carries the new parts: the pair is there, trained, nothing trains again
    out = speed_sweep_train(tmp_path / "next", UNPACK=str(tmp_path / "new"), DISTILL="1", BLOCK=block)
    assert "pair already trained" in out


def test_a_missing_part_or_a_used_folder_writes_nothing(tmp_path, carried):
    d1, d2 = carried
    (tmp_path / "used").mkdir()
    (tmp_path / "used/pair.tgz.partaa").write_text("old")
    r = put(d1, d2, tmp_path, tmp_path / "used")
    assert r.returncode == 2 and "OUT_DIR" in r.stderr and "is not empty" in r.stderr
    r = put(d1, d2, tmp_path / "no-draft-here", tmp_path / "new")       # the draft's parts are not there
    assert r.returncode == 1 and "holds no draft.tgz.part*" in r.stderr
    assert not (tmp_path / "new").exists()
    r = put(d2, tmp_path, tmp_path / "new")                              # the pair's first part left behind
    assert r.returncode == 1 and "has no pair.tgz.partaa" in r.stderr
    assert not (tmp_path / "new").exists()


@pytest.mark.extended   # make test-cpu-extended (44-61 s); make test: test_snapshots.py (a snapshot packs like a draft),
#                         the draft put over its target above, and a training on from a draft (test_bench_smoke.py)
def test_a_snapshot_brought_back_goes_over_its_target_and_is_trained_on(tmp_path, carried):
    """A machine taken back mid-training: the last snapshot (speed_sweep.sh snapshot) is put over the pair like a
    finished draft, and the next session's training starts from its (bf16) weights."""
    d1, d2 = carried
    joined_parts(carried, tmp_path / "all")
    speed_sweep_train(tmp_path / "gpu", UNPACK=str(tmp_path / "all"), REDRAFT="1", DISTILL="1", SNAPSHOT_EVERY="0.001")
    r = speed_sweep_snapshot(tmp_path / "gpu", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    r = put(d1, d2, tmp_path / "out/gpu", tmp_path / "new")
    assert r.returncode == 0, r.stderr
    snap = tmp_path / "gpu/snapshot/current/pair"
    new = members(tmp_path / "new")
    assert new["pair/b8/draft/model.safetensors"] == (snap / "b8/draft/model.safetensors").read_bytes()
    assert new["pair/train.json"] == (snap / "train.json").read_bytes()
    speed_sweep_train(tmp_path / "next", UNPACK=str(tmp_path / "new"), DISTILL="1", REDRAFT="1")
    log = (tmp_path / "next/train.log").read_text()
    assert "draft b8: trained on from" in log and "draft b8 held-out loss" in log

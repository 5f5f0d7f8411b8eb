"""A draft's training leaves snapshots of its weights while it runs (train_pair.py --snapshot-every,
speed_sweep.sh SNAPSHOT_EVERY / snapshot): the last one is the draft as trained (bf16), and speed_sweep.sh snapshot
packs it as PACK=draft packs a finished draft. Trainings side by side read one file of greedy continuations
(--distill-cache) instead of each generating them; a file from another target is refused by name."""

from __future__ import annotations

import json
import tarfile

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import speed_sweep_snapshot, speed_sweep_train


def test_the_last_snapshot_is_the_draft_as_trained_and_packs_like_a_draft(tmp_path):
    speed_sweep_train(tmp_path / "speed", SNAPSHOT_EVERY="0.001")
    pair, snaps = tmp_path / "speed/pair", tmp_path / "speed/snapshot"
    current = snaps / "current"
    assert current.is_symlink() and len(list(snaps.glob("s8-*"))) <= 2          # older ones pruned, two kept
    final = load_file(str(pair / "b8/draft/model.safetensors"))
    snap = load_file(str(current / "pair/b8/draft/model.safetensors"))
    assert snap.keys() == final.keys()
    for name, weight in final.items():
        assert snap[name].dtype == torch.bfloat16
        assert torch.equal(snap[name], weight.to(torch.bfloat16)), name
    report, snap_report = (json.loads(p.read_text()) for p in (pair / "train.json", current / "pair/train.json"))
    assert snap_report["drafts"]["b8"]["steps"] == report["drafts"]["b8"]["steps"] > 0
    assert snap_report["drafts"]["b8"]["snapshot"]["dtype"] == "bfloat16"
    assert snap_report["distill"] == report["distill"]

    r = speed_sweep_snapshot(tmp_path / "speed", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    parts = sorted((tmp_path / "out/speed").glob("draft.tgz.part*"))
    assert [p.name for p in parts] == ["draft.tgz.partaa"]
    with tarfile.open(parts[0]) as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
    assert names == {"pair/train.json", "pair/b8/draft/model.safetensors", "pair/b8/draft/config.json",
                     "pair/b8/draft/tokenizer.json"}


def test_snapshot_before_any_is_written_says_so(tmp_path):
    r = speed_sweep_snapshot(tmp_path / "none", tmp_path / "out")
    assert r.returncode == 1 and "holds no snapshot yet" in r.stderr and "SNAPSHOT_EVERY" in r.stderr
    assert not (tmp_path / "out").exists()


def test_snapshot_flags_are_given_together(tmp_path, capsys):
    from training import train_pair
    with pytest.raises(SystemExit):
        train_pair.main(["--out", str(tmp_path), "--device", "cpu", "--snapshot-every", "30"])
    assert "--snapshot-every 30.0 with --snapshot-dir None is invalid" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_pair.main(["--out", str(tmp_path), "--device", "cpu", "--distill-cache", str(tmp_path / "c")])
    assert "invalid without --target-from" in capsys.readouterr().err


@pytest.fixture(scope="module")
def small_target(tmp_path_factory):
    from training import train_pair
    from ddtree.reference.pair import save_model
    from ddtree.reference.target import TargetLM

    torch.manual_seed(0)
    target = TargetLM(train_pair.configs(8, "small")[0]).eval()
    folder = tmp_path_factory.mktemp("target")
    save_model(target, train_pair.TOK, folder)
    return target, folder / "model.safetensors"


def test_the_distill_cache_is_read_not_made_again(tmp_path, small_target):
    from training import train_pair
    target, weights = small_target
    data = torch.randint(0, 256, (4096,))
    cache = tmp_path / "distill.safetensors"
    made = train_pair.cached_greedy_windows(target, data, 6, 16, torch.Generator().manual_seed(0), cache, weights)
    assert made.shape == (6, 16) and made.dtype == torch.int64
    assert torch.equal(made, train_pair.greedy_windows(target, data, 6, 16, torch.Generator().manual_seed(0)))
    written = cache.read_bytes()
    # another seed would draw other windows: the same rows back means they were read
    again = train_pair.cached_greedy_windows(target, data, 4, 16, torch.Generator().manual_seed(1), cache, weights)
    assert torch.equal(again, made[:4]) and cache.read_bytes() == written
    fresh = train_pair.greedy_windows(target, data, 4, 16, torch.Generator().manual_seed(1))
    assert not torch.equal(fresh, made[:4])


def test_a_distill_cache_of_another_target_or_too_few_windows_is_refused(tmp_path, small_target):
    from training import train_pair
    target, weights = small_target
    data = torch.randint(0, 256, (4096,))
    cache = tmp_path / "distill.safetensors"
    train_pair.cached_greedy_windows(target, data, 3, 16, torch.Generator(), cache, weights)
    other = tmp_path / "other.safetensors"
    other.write_bytes(weights.read_bytes() + b" ")
    with pytest.raises(SystemExit, match=rf"--distill-cache {cache} is invalid here: .* from target .*remove it"):
        train_pair.cached_greedy_windows(target, data, 3, 16, torch.Generator(), cache, other)
    with pytest.raises(SystemExit, match="holds 3 windows of 16 tokens .* asked 5 of 16"):
        train_pair.cached_greedy_windows(target, data, 5, 16, torch.Generator(), cache, weights)

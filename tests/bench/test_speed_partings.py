"""testbed/speed_partings.py on a small trained speed pair (CPU): answers equal to NONE's are counted equal;
an answer that parts where NONE took a token the float32 model ranks below its own choice passes as "exact"; a
deliberate fault - an answer that takes a token the float32 model puts far below NONE's - is a real difference and
fails the run; jobs without answers and prompt files that are not the sweep's are refused by name; the census of
NONE's own answers finds where float32's greedy choice parts from one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import speed_sweep_train

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 10


def tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.speed_partings", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A trained small pair, the sweep's 1-request prompts, NONE's answers to them (the float32 referee's own
    greedy answers, TOKENS each), the referee and its target (bf16-rounded weights in float32)."""
    import torch

    from bench.sglang_speed import mixed_prompts, prompts_per_load

    from testbed.referee import bf16_served_pair, target_referee

    speed = tmp_path_factory.mktemp("partings") / "speed"
    speed_sweep_train(speed)
    pair_dir = speed / "pair" / "b8"
    held, seen = (json.loads((speed / "pair" / n).read_text()) for n in ("heldout_prompts.json", "train_prompts.json"))
    prompts = mixed_prompts(held, seen, prompts_per_load(1))
    target = bf16_served_pair(pair_dir, "cpu").target.eval()
    referee = target_referee(target, "cpu")
    greedy = [target.greedy_continue(torch.tensor([p]), TOKENS)[0, len(p):].tolist() for p in prompts]
    return pair_dir, prompts, greedy, referee, target


def job(folder: Path, none: list[list[int]], settings: dict[str, list[list[int]]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "none_outputs.json").write_text(json.dumps({"off-1": none}))
    (folder / "answers.json").write_text(json.dumps({name: {"1": a} for name, a in settings.items()}))
    return folder


def ranked(referee, context: list[int]) -> list[int]:
    """The referee's tokens after context, best first."""
    return referee.logprobs(context).argsort(descending=True).tolist()


def test_equal_exact_and_a_real_difference(sweep, tmp_path):
    pair_dir, prompts, greedy, referee, _ = sweep
    at = 3
    # NONE took the float32 model's second choice at `at` in answer 0 (a bf16 flip); the setting took its first
    none = [list(a) for a in greedy]
    second = ranked(referee, prompts[0] + greedy[0][:at])[1]
    none[0] = greedy[0][:at] + [second] + greedy[0][at + 1:]
    gap = float(referee.logprobs(prompts[0] + greedy[0][:at])[greedy[0][at]]
                - referee.logprobs(prompts[0] + greedy[0][:at])[second])
    # the fault: answer 1 takes the float32 model's worst token at `at`
    worst = ranked(referee, prompts[1] + greedy[1][:at])[-1]
    faulty = [list(a) for a in greedy]
    faulty[1] = greedy[1][:at] + [worst] + greedy[1][at + 1:]
    clean = job(tmp_path / "clean", none, {"dflash-bs48": greedy})
    r = tool(clean, "--pair", pair_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("| dflash-bs48 |"))
    assert f"| {len(prompts) - 1}/{len(prompts)} | 1 | 0 | 0 |" in row, row
    assert f"{-gap:.4f} (position {at})" in row, row           # NONE's token lies below the token taken

    broken = job(tmp_path / "broken", greedy, {"dflash-bs48": greedy, "ddtree-b64-c8-graphs-bs48": faulty})
    r = tool(broken, "--pair", pair_dir)
    assert r.returncode == 1, r.stdout + r.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in r.stdout.splitlines() if "-bs48 |" in line}
    assert f"| {len(prompts)}/{len(prompts)} | 0 | 0 | 0 | - |" in rows["dflash-bs48"]
    assert f"| {len(prompts) - 1}/{len(prompts)} | 0 | 0 | 1 |" in rows["ddtree-b64-c8-graphs-bs48"]


def test_bad_input_is_named(sweep, tmp_path):
    pair_dir, prompts, greedy, _, _ = sweep
    empty = tmp_path / "empty"
    empty.mkdir()
    r = tool(empty, "--pair", pair_dir)
    assert r.returncode == 2 and f"{empty} holds neither answers.json nor none_outputs.json" in r.stderr, r.stderr
    r = tool(empty, "--pair", tmp_path / "nowhere")
    assert r.returncode == 2 and "nowhere/target/config.json" in r.stderr and "missing" in r.stderr, r.stderr
    short = job(tmp_path / "short", greedy[:5], {"dflash-bs48": greedy[:5]})
    r = tool(short, "--pair", pair_dir)
    assert r.returncode == 2 and "dflash-bs48 at load 1: 5 answers" in r.stderr and "--prompt-files" in r.stderr
    r = tool(short, "--pair", pair_dir, "--loads", "one")
    assert r.returncode == 2 and "--loads 'one'" in r.stderr


def test_the_census_finds_where_float32_parts_from_nones_own_answer(sweep, tmp_path):
    from testbed import speed_partings

    pair_dir, prompts, greedy, referee, target = sweep
    own = speed_partings.answer_ties(target, prompts[0], greedy[0])
    assert own.float32_parts_at is None and own.min_gap >= 0
    at = 4
    flipped = greedy[0][:at] + [ranked(referee, prompts[0] + greedy[0][:at])[1]] + greedy[0][at + 1:]
    assert speed_partings.answer_ties(target, prompts[0], flipped).float32_parts_at == at
    none = [flipped] + [list(a) for a in greedy[1:]]
    r = tool(job(tmp_path / "census", none, {}), "--pair", pair_dir, "--census")
    assert r.returncode == 0, r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("| off-1 |"))
    assert row.startswith(f"| off-1 | {len(prompts)} |") and row.endswith("| 1 |"), row

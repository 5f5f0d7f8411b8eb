"""tools/validate_report.py: which first divergence from NONE is a near tie and which is a bug."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def report_module():
    spec = importlib.util.spec_from_file_location("validate_report", ROOT / "tools/validate_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


vr = report_module()
MARGIN = 0.0625
# NONE's top log-probs at step 2: tokens 5 and 6 tie exactly, 7 one bf16 step lower, 8 far below
STEP = [[5, -0.5], [6, -0.5], [7, -0.5625], [8, -3.0]]
NONE = {"output_ids": [1, 2, 5, 9], "top": [[[1, -0.1]], [[2, -0.2]], STEP, [[9, -0.1]]]}


def run(ids):
    return {"output_ids": ids}


@pytest.mark.parametrize("ids,status,margin", [
    ([1, 2, 5, 9], "identical", None),
    ([1, 2, 6, 4], "near-tie", 0.0),        # the runner-up of an exact tie
    ([1, 2, 7, 4], "near-tie", 0.0625),     # a third token one bf16 step below: the tie the GPU run met
    ([1, 2, 8, 4], "mismatch", 2.5),        # among NONE's top, but far below its best: a bug
    ([1, 2, 3, 4], "mismatch", None),       # not among NONE's top log-probs at all: a bug
    ([1, 4, 5, 9], "mismatch", None),       # a divergence where NONE has no log-probs to excuse it
])
def test_the_first_divergence_is_a_near_tie_only_within_the_margin_of_nones_best(ids, status, margin):
    result = vr.compare(NONE, run(ids), MARGIN)
    assert result["status"] == status
    assert result.get("margin") == margin


def test_results_written_with_the_old_top2_key_are_still_read():
    legacy = {"output_ids": NONE["output_ids"], "top2": NONE["top"]}
    assert vr.compare(legacy, run([1, 2, 6, 4]), MARGIN)["status"] == "near-tie"


def test_a_run_with_only_near_ties_passes_and_one_bug_fails(tmp_path):
    def write(directory: Path, runs: dict) -> None:
        directory.mkdir()
        for name, ids in runs.items():
            prompts = [{"id": "p", "output_ids": ids, "top": NONE["top"] if name == "NONE" else [],
                        "accept_length": None if name == "NONE" else 3.0, "error": None}]
            (directory / f"{name}.json").write_text(json.dumps({"prompts": prompts, "errors": 0, "tokens_per_s_c1": 1.0,
                                                                "tokens_per_s_cn": 1.0, "concurrency": 4,
                                                                "ttft_p50_s": 0.01}))

    write(tmp_path / "ok", {"NONE": [1, 2, 5, 9], "DDTREE-graphs": [1, 2, 7, 4]})
    write(tmp_path / "bad", {"NONE": [1, 2, 5, 9], "DDTREE-graphs": [1, 2, 3, 4]})
    assert vr.main(["x", str(tmp_path / "ok"), str(MARGIN)]) == 0
    assert vr.main(["x", str(tmp_path / "bad"), str(MARGIN)]) == 1
    report = (tmp_path / "bad" / "report.md").read_text()
    assert report.startswith("VERDICT: FAIL") and "mismatch at token 2: expected 5, got 3, margin None" in report


def test_the_playbooks_margin_takes_the_flip_the_gpu_run_met_and_not_two_steps_more():
    """validate.yml's margin: a token 0.125 below NONE's best (the 1-in-22 flip of the production
    path's run 5 on the GPU test bed) is a near tie; 0.25 below is a mismatch."""
    from tests.playbook_clients import play_vars

    margin = float(play_vars("playbooks/validate.yml")["validate_near_tie_margin"])
    step = [[5, -1.0], [6, -1.125], [7, -1.25]]
    none = {"output_ids": [5, 9], "top": [step, [[9, -0.1]]]}
    assert vr.compare(none, run([6, 4]), margin)["status"] == "near-tie"
    assert vr.compare(none, run([7, 4]), margin)["status"] == "mismatch"

"""The plugin's graph hooks on sglang 0.5.23's DecodeCudaGraphRunner (CPU, real SGLang): the input
check before load_batch copies a replay's sources, and the tree mask in DDTREE's capture input.

Each case runs tests/sglang/graph_check_scenarios.py in a fresh interpreter, where SGLang's own
load_plugins() registers and applies the hook, as in a scheduler process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

SCENARIOS = Path(__file__).with_name("graph_check_scenarios.py")
WHERE = "draft TARGET_VERIFY graph (batch 2, 4 tokens per request)"


def scenarios(**env) -> dict:
    e = {**os.environ, **env}
    r = subprocess.run([sys.executable, str(SCENARIOS)], capture_output=True, text=True, timeout=300, env=e)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def hooked() -> dict:
    return scenarios()


def test_load_plugins_hooks_load_batch(hooked):
    assert hooked["hooked"] is True


def test_a_clean_batch_passes_the_check_and_reaches_sglang(hooked):
    assert hooked["clean_draft"] == "ok"
    # past the check, SGLang's own body runs (and stops on the CPU-built runner, not in the check)
    assert hooked["clean_draft_through_sglang"].startswith("AttributeError")


@pytest.mark.parametrize("case,message", [
    ("draft_without_embeds", f"{WHERE}: graph input 'input_embeds' is None; SGLang would skip the copy and replay "
                             "the previous step's values. Set forward_batch.input_embeds (shape (8, 16))"),
    ("short_positions", f"{WHERE}: graph input 'positions' has shape (7,), expected (8,); fix how "
                        "forward_batch.positions is built"),
    ("float_seq_lens", f"{WHERE}: graph input 'seq_lens' has dtype torch.float32, expected an integer dtype"),
    ("wide_embeds", f"{WHERE}: graph input 'input_embeds' has shape (8, 17), expected (8, 16)"),
    ("no_token_count", f"{WHERE}: graph input 'num_token_non_padded' is None (and global_num_token_non_padded too)"),
    ("ddtree_target_missing_ids", "target TARGET_VERIFY graph (batch 2, 4 tokens per request): graph input "
                                  "'input_ids' is None"),
])
def test_a_bad_source_raises_naming_the_field_before_any_copy(hooked, case, message):
    assert hooked[case].startswith("GraphBufferError: " + message), hooked[case]


def test_fields_a_runner_does_not_copy_are_not_required(hooked):
    assert hooked["target_without_embeds"] == "ok"        # only a dflash draft replays input_embeds
    assert hooked["no_token_count_slot"] == "ok"          # no num_token_non_padded slot registered
    assert hooked["eagle_is_not_checked"] == "ok"         # other algorithms: untouched


def test_checked_once_per_key_and_again_when_a_source_changes(hooked):
    assert hooked["checks_for_three_clean_replays"] == 1
    assert hooked["later_none_on_same_runner"].startswith("GraphBufferError: ")
    assert "'input_embeds' is None" in hooked["later_none_on_same_runner"]


def test_the_switch_turns_the_hook_off():
    off = scenarios(SGLANG_DDTREE_GRAPH_CHECK="off")
    assert off["hooked"] is False
    assert off["draft_without_embeds"].startswith("AttributeError")   # straight into SGLang's body


def test_a_bad_switch_value_is_the_servers_error():
    code = ("from sglang.srt.plugins import load_plugins; load_plugins()\n"
            "from ddtree.sglang.plugin import validate_server_args\n"
            "validate_server_args(None)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "SGLANG_DDTREE_GRAPH_CHECK": "maybe"})
    assert r.returncode != 0
    assert "SGLANG_DDTREE_GRAPH_CHECK='maybe' is invalid: expected 1 or 0" in r.stderr


def test_the_ddtree_target_captures_with_the_tree_mask(hooked):
    # SGLang alone captures DFlash-family target verify without a mask on triton (causal chain);
    # the DDTREE target needs its tree mask in the captured path
    assert hooked["capture_ddtree_target"] == {"type": "DFlashVerifyInput", "width": 4,
                                               "mask_is_the_runner_buffer": True, "mask_is_none": False}


def test_the_draft_and_dflash_captures_are_left_as_sglang_builds_them(hooked):
    for case in ("capture_ddtree_draft", "capture_dflash_target"):
        assert hooked[case]["mask_is_none"] is True, hooked[case]

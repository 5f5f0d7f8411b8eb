"""Preflight's pair check (roles/preflight/files/k26_pair_check.py) on Kimi-shaped configs: the
published layout passes (the wrapper, its INT4 experts with lm_head ignored, the text model alone),
each misfit is named with the field and the fix."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("k26_pair_check", ROOT / "roles/preflight/files/k26_pair_check.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)
from bench import kimi_probe  # noqa: E402  (Kimi-K2.5's public config, scaled; z-lab's draft layout)


@pytest.mark.parametrize("kind", ["wrapper", "int4", "dsv3"])
def test_the_kimi_shaped_pairs_fit(kind):
    assert check.problems(kimi_probe.target_config(kind), kimi_probe.DRAFT, 8, "T", "D") == []


def misfit(change_target=None, change_draft=None):
    target, draft = copy.deepcopy(kimi_probe.target_config("int4")), copy.deepcopy(kimi_probe.DRAFT)
    (change_target or (lambda t: None))(target)
    (change_draft or (lambda d: None))(draft)
    return check.problems(target, draft, 8, "T", "D")


@pytest.mark.parametrize("target,draft,message", [
    (None, lambda d: d.update(hidden_size=1024), "the draft's hidden_size 1024 (D/config.json) is not the target's 512"),
    (None, lambda d: d.update(vocab_size=32000), "the draft's vocab_size 32000 is not the target's 163840"),
    (None, lambda d: d["dflash_config"].update(mask_token_id=163840), "the draft's mask_token_id 163840 is not a token"),
    (None, lambda d: d["dflash_config"].update(target_layer_ids=[0, 3, 7]), "target_layer_ids [7] are not below the target's last layer (8 layers)"),
    (None, lambda d: d["dflash_config"].update(block_size=16), "k26_dflash_block_size=8 differs from the draft's block_size 16"),
    (lambda t: t["text_config"]["quantization_config"].update(ignore=["re:.*self_attn.*"]), None,
     "the target's quantization_config (T/config.json) covers lm_head"),
])
def test_a_misfit_is_named_with_the_field_and_the_fix(target, draft, message):
    found = misfit(target, draft)
    assert len(found) == 1 and message in found[0], found


def test_the_reference_engine_reads_any_layer():
    """SGLang's capture rule (layers below the last) is SGLang's: the sandbox's reference server reads
    the last layer too."""
    target, draft = kimi_probe.target_config("dsv3"), copy.deepcopy(kimi_probe.DRAFT)
    draft["dflash_config"]["target_layer_ids"] = [0, 7]
    assert check.problems(target, draft, 8, "T", "D", server_kind="reference") == []
    assert len(check.problems(target, draft, 8, "T", "D", server_kind="sglang")) == 1


def test_a_ddtree_service_on_an_mla_target_takes_triton_only():
    target = kimi_probe.target_config("wrapper")
    assert check.problems(target, kimi_probe.DRAFT, 8, "T", "D", ddtree_backend="triton") == []
    found = check.problems(target, kimi_probe.DRAFT, 8, "T", "D", ddtree_backend="flashinfer")
    assert len(found) == 1 and "k26_attention_backend=flashinfer is not proven for DDTREE" in found[0] \
        and "set k26_attention_backend=triton" in found[0]
    assert check.problems(target, kimi_probe.DRAFT, 8, "T", "D", ddtree_backend="") == []   # DFLASH: not checked


def test_the_host_side_list_of_mla_backends_is_the_plugins():
    """The pair check runs on the host without this package, so it keeps its own copy: the same one."""
    from ddtree.sglang.setup.refusals import MLA_MASK_BACKENDS

    assert check.MLA_BACKENDS == MLA_MASK_BACKENDS

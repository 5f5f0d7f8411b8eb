"""DDTREE server settings, per-request refusals and the reference pair's SGLang export (CPU, no SGLang)."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest
import torch
from safetensors.torch import load_file

from ddtree.reference.config import DraftConfig, TargetConfig
from ddtree.reference.export import draft_config, export_pair
from ddtree.reference.pair import init_pair
from ddtree import switches
from ddtree.sglang.requests import ServedFeatures, request_refusal
from ddtree.settings import DDTreeConfigError, DDTreeSettings
from ddtree.sglang.setup.refusals import refusals, validate
from ddtree.sglang.setup.server_env import block_to_env, draft_block_size, from_env, resolved_block, schedule_to_env


def server(**changes):
    """The server arguments a DDTREE deployment renders (as SGLang's ServerArgs fields), with changes."""
    base = dict(page_size=None, disable_overlap_schedule=True, attention_backend="triton", pp_size=1, attn_dp_size=1,
                enable_dp_attention=False, speculative_draft_window_size=None,
                speculative_use_block_verification=False, speculative_adaptive=False, enable_lora=None,
                lora_paths=None, enable_two_batch_overlap=False, enable_mixed_chunk=False,
                enable_unified_memory=False, enable_return_hidden_states=False, disaggregation_mode="null",
                speculative_accept_threshold_single=1.0, speculative_accept_threshold_acc=1.0,
                speculative_num_draft_tokens=None, speculative_num_steps=None, speculative_eagle_topk=None)
    base.update(changes)
    return NS(**base)


GOOD = DDTreeSettings(budget=32, topk_cap=8, block_size=8)


def test_the_rendered_production_settings_pass():
    assert list(refusals(GOOD, server())) == []
    assert list(refusals(DDTreeSettings(budget=7, topk_cap=1, block_size=8), server())) == []   # the chain


@pytest.mark.parametrize("settings,changes,message", [
    (DDTreeSettings(0, 8, 8), {}, "--speculative-ddtree-budget=0 is invalid: expected 1..1023"),
    (DDTreeSettings(1024, 8, 8), {}, "--speculative-ddtree-budget=1024 is invalid"),
    (DDTreeSettings(32, 33, 8), {}, "--speculative-ddtree-topk-cap=33 is invalid: expected 1..budget (32)"),
    (DDTreeSettings(6, 1, 8), {}, "use a budget >= 7 (7 with --speculative-ddtree-topk-cap 1 is the DFlash chain)"),
    (DDTreeSettings(32, 8, 1), {}, "--speculative-dflash-block-size=1 is invalid"),
    (GOOD, {"page_size": 64}, "--page-size=64 is invalid for DDTREE"),
    (GOOD, {"attention_backend": "fa3"}, "--attention-backend=fa3 cannot verify a tree"),
    (GOOD, {"attention_backend": None}, "--attention-backend=None cannot verify a tree"),
    (GOOD, {"pp_size": 2}, "--pp-size=2 is not supported with DDTREE"),
    (GOOD, {"attn_dp_size": 8}, "--attn-dp-size=8 is not supported with DDTREE"),
    (GOOD, {"enable_dp_attention": True}, "--enable-dp-attention=True is not supported"),
    (GOOD, {"speculative_draft_window_size": 2048}, "--speculative-draft-window-size=2048 is not supported"),
    (GOOD, {"speculative_adaptive": True}, "--speculative-adaptive=True is not supported"),
    (GOOD, {"lora_paths": ["a"]}, "--lora-paths=['a'] is not supported"),
    (GOOD, {"disaggregation_mode": "prefill"}, "--disaggregation-mode=prefill is not supported with DDTREE"),
    (GOOD, {"speculative_accept_threshold_acc": 0.9}, "--speculative-accept-threshold-acc=0.9 is not supported"),
    (GOOD, {"speculative_num_draft_tokens": 8}, "the plugin sets it to budget + 1 (33)"),
    (GOOD, {"speculative_eagle_topk": 4}, "--speculative-eagle-topk=4 does not apply to DDTREE"),
    (GOOD, {"enable_return_hidden_states": True}, "--enable-return-hidden-states=True is not supported"),
])
def test_unsupported_settings_are_refused_with_flag_value_and_fix(settings, changes, message):
    with pytest.raises(DDTreeConfigError) as err:
        validate(settings, server(**changes))
    assert message in str(err.value)


@pytest.mark.parametrize("config", [{"kv_lora_rank": 512}, {"text_config": {"kv_lora_rank": 512}}])
def test_flashinfer_is_refused_for_an_mla_target_and_kept_for_others(tmp_path, config):
    """An MLA target (DeepSeek-V3's config, or Kimi's wrapper with it in text_config) gets triton only: FlashInfer's
    verify graphs failed on the test bed's trained Kimi-shaped pair; a GQA target keeps FlashInfer."""
    mla, gqa = tmp_path / "mla", tmp_path / "gqa"
    for folder, cfg in ((mla, config), (gqa, {"num_key_value_heads": 2})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DDTreeConfigError) as err:
        validate(GOOD, server(attention_backend="flashinfer", model_path=str(mla)))
    assert "--attention-backend=flashinfer is not proven for DDTREE on a multi-head latent attention target" in \
        str(err.value) and "use --attention-backend triton" in str(err.value)
    assert list(refusals(GOOD, server(attention_backend="triton", model_path=str(mla)))) == []
    assert list(refusals(GOOD, server(attention_backend="flashinfer", model_path=str(gqa)))) == []
    assert list(refusals(GOOD, server(attention_backend="flashinfer", model_path=str(tmp_path / "none")))) == []


def test_the_width_the_plugin_set_itself_is_accepted():
    assert list(refusals(GOOD, server(speculative_num_draft_tokens=33, speculative_num_steps=1,
                                      speculative_eagle_topk=1))) == []


def test_simulated_acceptance_is_refused(monkeypatch):
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3")
    assert any("SGLANG_SIMULATE_ACC_LEN=3" in m for m in refusals(GOOD, server()))


def test_settings_travel_through_the_environment():
    env: dict = {}
    schedule_to_env(GOOD.budget, GOOD.topk_cap, env)         # the CLI hook's write
    block_to_env(GOOD.block_size, env)                       # handle_server_args' write
    assert from_env(env) == GOOD
    assert from_env({}).block_size is None
    with pytest.raises(DDTreeConfigError, match="SGLANG_DDTREE_BLOCK_SIZE is not set"):
        resolved_block(from_env({}))
    with pytest.raises(DDTreeConfigError, match=r"--speculative-ddtree-budget \(SGLANG_DDTREE_BUDGET\)='x'"):
        from_env({"SGLANG_DDTREE_BUDGET": "x"})


def test_a_schedule_travels_through_the_environment_and_sizes_for_its_widest_step():
    from ddtree.sglang.setup.server_env import schedule_from_env

    env: dict = {}
    schedule_to_env(" 1:64,8:32,32:8 ", "1:8,32:4", env)
    schedule = schedule_from_env(env)
    assert schedule.stepped and str(schedule) == "budget 1:64,8:32,32:8 cap 1:8,32:4"
    assert [schedule.at(b) for b in (1, 7, 8, 31, 32, 48)] == [(64, 8), (64, 8), (32, 8), (32, 8), (8, 4), (8, 4)]
    assert schedule.widths == (9, 33, 65)
    assert schedule.batches_at_width(33, 48) == list(range(8, 32)) and schedule.batches_at_width(9, 20) == []
    assert from_env({**env, "SGLANG_DDTREE_BLOCK_SIZE": "8"}) == DDTreeSettings(64, 8, 8)
    assert schedule.problems(8) == []
    plain = schedule_from_env({"SGLANG_DDTREE_BUDGET": "32"})
    assert not plain.stepped and plain.widths == (33,) and plain.at(48) == (32, 8)
    with pytest.raises(DDTreeConfigError, match=r"--speculative-ddtree-budget \(SGLANG_DDTREE_BUDGET\)=8:64 is invalid"):
        schedule_from_env({"SGLANG_DDTREE_BUDGET": "8:64"})


def test_a_schedule_is_served_without_a_switch_and_checked_at_every_step(monkeypatch):
    """The schedule's switch went when its GPU tests passed on the three decidable pairs (issue 45); a leftover
    SGLANG_DDTREE_SCHEDULE in an env file changes nothing."""
    monkeypatch.setenv("SGLANG_DDTREE_BUDGET", "1:64,8:32")
    monkeypatch.setenv("SGLANG_DDTREE_TOPK_CAP", "8")
    widest = DDTreeSettings(64, 8, 8)
    for leftover in (None, "0", "1"):
        if leftover is None:
            monkeypatch.delenv("SGLANG_DDTREE_SCHEDULE", raising=False)
        else:
            monkeypatch.setenv("SGLANG_DDTREE_SCHEDULE", leftover)
        assert list(refusals(widest, server())) == [], leftover
    monkeypatch.setenv("SGLANG_DDTREE_BUDGET", "1:64,8:6")
    monkeypatch.setenv("SGLANG_DDTREE_TOPK_CAP", "1:8,8:4")
    assert next(refusals(widest, server())).startswith("from batch size 8: --speculative-ddtree-budget=6 is invalid")


def test_the_drafts_block_comes_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"dflash_config": {"block_size": 16}, "block_size": 4}))
    assert draft_block_size(tmp_path) == 16
    (tmp_path / "config.json").write_text(json.dumps({"block_size": 4}))
    assert draft_block_size(tmp_path) == 4
    assert draft_block_size(tmp_path / "missing") is None and draft_block_size(None) is None


# --- per request ---------------------------------------------------------------------------

@pytest.mark.parametrize("params,request_fields,field", [
    (None, {"return_hidden_states": True}, "return_hidden_states=True"),
    (None, {"return_sampling_mask": True}, "return_sampling_mask=True"),
    ({"sampling_seed": 7, "temperature": 0.7}, {}, "sampling_params.sampling_seed=7"),
])
def test_unsupported_requests_name_the_field_and_the_fix(params, request_fields, field):
    message = request_refusal(params, NS(**request_fields))
    assert message is not None and message.startswith(field) and "--speculative-algorithm DFLASH or NONE" in message


def test_plain_sampled_requests_pass():
    params = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "min_p": 0.05, "repetition_penalty": 1.0,
              "frequency_penalty": 0.0, "logit_bias": {"5": 1.0}, "stop": ["\n"], "max_new_tokens": 64}
    assert request_refusal(params, NS(return_logprob=False)) is None
    assert request_refusal(None, NS()) is None
    assert request_refusal({"temperature": 0.0, "sampling_seed": 7}, NS()) is None     # greedy: nothing to seed


def test_a_seed_is_served_under_deterministic_inference_and_refused_without_it():
    seeded = {"temperature": 0.7, "sampling_seed": 7}
    message = request_refusal(seeded, NS())
    assert "sampling_params.sampling_seed=7" in message and "--enable-deterministic-inference" in message
    assert request_refusal(seeded, NS(), ServedFeatures(deterministic=True)) is None
    assert "frequency_penalty" in request_refusal({**seeded, "frequency_penalty": 0.5}, NS(),
                                                  ServedFeatures(deterministic=True, overlap=True))


def test_penalties_and_logprobs_are_served_without_a_switch():
    """Shown equal to NONE on the H200 test bed (penalties and min_new_tokens alone and the order-free combinations,
    output logprobs within SGLang's own DFLASH's spread; 2026-12-04): no switch, no refusal on a DDTREE server without
    the overlap scheduler."""
    asks = NS(return_logprob=True, top_logprobs_num=5, token_ids_logprob=[[1, 2]])
    for params in ({"frequency_penalty": 0.5}, {"presence_penalty": 0.5}, {"repetition_penalty": 1.2},
                   {"min_new_tokens": 8}, None):
        assert request_refusal(params, asks, ServedFeatures()) is None
    assert not {"SGLANG_DDTREE_PENALTIES", "SGLANG_DDTREE_LOGPROBS"} & {s.name for s in switches.SWITCHES}


@pytest.mark.parametrize("leftover", [None, "0", "1"])
def test_the_overlap_scheduler_is_served_without_a_switch(monkeypatch, leftover):
    """Its GPU tests passed (issue 45): no start-up refusal with or without --disable-overlap-schedule, whatever an
    env file left of the removed SGLANG_DDTREE_OVERLAP, and the switch is no longer declared."""
    monkeypatch.delenv("SGLANG_DDTREE_OVERLAP", raising=False)
    if leftover is not None:
        monkeypatch.setenv("SGLANG_DDTREE_OVERLAP", leftover)
    assert list(refusals(GOOD, server(disable_overlap_schedule=False))) == []
    assert list(refusals(GOOD, server(disable_overlap_schedule=True))) == []
    assert "SGLANG_DDTREE_OVERLAP" not in {s.name for s in switches.SWITCHES}


@pytest.mark.parametrize("field,value", [("frequency_penalty", 0.5), ("presence_penalty", 0.3),
                                         ("repetition_penalty", 1.1), ("min_new_tokens", 4)])
def test_penalties_stay_refused_under_the_overlap_scheduler(field, value):
    assert request_refusal({field: value}, NS(), ServedFeatures()) is None
    message = request_refusal({field: value}, NS(), ServedFeatures(overlap=True))
    assert message.startswith(f"sampling_params.{field}={value}") and "under the overlap scheduler" in message
    assert "--disable-overlap-schedule" in message
    neutral = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}
    assert request_refusal({field: neutral[field]}, NS(), ServedFeatures(overlap=True)) is None


def test_served_features_are_read_from_the_server_args():
    args = NS(enable_deterministic_inference=True, disable_overlap_schedule=False)
    assert ServedFeatures.from_server(args) == ServedFeatures(deterministic=True, overlap=True)
    assert ServedFeatures.from_server(NS()) == ServedFeatures()      # SGLang's defaults: overlap off here
    served = ServedFeatures.from_server(NS(disable_overlap_schedule=True))
    asks = NS(return_logprob=True, top_logprobs_num=3, custom_logit_processor="p")
    assert request_refusal({"json_schema": "{}", "min_new_tokens": 4}, asks, served) is None


def test_grammars_and_logit_processors_are_served_without_a_switch():
    """Shown equal to NONE on the H200 test bed (2026-12-03): no switch, no refusal on a plain DDTREE server."""
    asks = NS(custom_logit_processor="p")
    for field in ("json_schema", "regex", "ebnf", "structural_tag"):
        assert request_refusal({field: "x"}, asks, ServedFeatures()) is None
    assert not {"SGLANG_DDTREE_GRAMMARS", "SGLANG_DDTREE_PROCESSORS"} & {s.name for s in switches.SWITCHES}


def test_the_sync_check_logs_each_site_once_and_passes_other_warnings_on(caplog):
    import warnings

    from ddtree.sglang.diagnostics.sync_check import MARK, SyncCheck

    with pytest.raises(ValueError, match="SGLANG_DDTREE_SYNC_CHECK='loud' is invalid"):
        SyncCheck("loud")
    check = SyncCheck("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for line in (3, 3, 9):
            warnings.warn_explicit("called a synchronizing CUDA operation", UserWarning, "/x/ddtree/a.py", line)
        warnings.warn_explicit("something else", UserWarning, "/x/b.py", 1)
    with warnings.catch_warnings(record=True) as passed:
        warnings.simplefilter("always")
        with caplog.at_level("WARNING", logger="ddtree.sglang.diagnostics.sync_check"):
            check.report(caught)
    assert [r.getMessage() for r in caplog.records] == [f"{MARK} /x/ddtree/a.py:3", f"{MARK} /x/ddtree/a.py:9"]
    assert [str(w.message) for w in passed] == ["something else"]


# --- the export ----------------------------------------------------------------------------

def tiny_pair(target_layer_ids=(0, 1)):
    target = TargetConfig(num_hidden_layers=3)
    draft = DraftConfig(block_size=4, target_layer_ids=list(target_layer_ids))
    return init_pair(target, draft, seed=0)


def test_the_export_writes_qwen3_and_dflash_checkpoints_with_every_weight(tmp_path):
    pair = tiny_pair()
    export_pair(pair, tmp_path)
    target_cfg = json.loads((tmp_path / "target/config.json").read_text())
    draft_cfg = json.loads((tmp_path / "draft/config.json").read_text())
    assert target_cfg["architectures"] == ["Qwen3ForCausalLM"] and target_cfg["tie_word_embeddings"] is False
    assert draft_cfg["architectures"] == ["DFlashDraftModel"]
    assert draft_cfg["dflash_config"] == {"block_size": 4, "target_layer_ids": [0, 1], "mask_token_id": 258}
    # the tokenizer SGLang loads from the target's folder (no --skip-tokenizer-init needed)
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in (tmp_path / "target").iterdir()}
    assert draft_cfg["num_target_layers"] == 3 and draft_cfg["vocab_size"] == target_cfg["vocab_size"] == 260
    target = load_file(str(tmp_path / "target/model.safetensors"))
    draft = load_file(str(tmp_path / "draft/model.safetensors"))
    # every parameter of the reference models is exported exactly once (bf16-rounded)
    assert len(target) == len(list(pair.target.parameters()))
    assert len(draft) == len(list(pair.draft.parameters()))
    assert torch.equal(target["model.layers.2.self_attn.k_norm.weight"],
                       pair.target.layers[2].self_attn.k_norm.weight.to(torch.bfloat16))
    assert torch.equal(draft["fc.weight"], pair.draft.fc.weight.to(torch.bfloat16))
    assert torch.equal(target["lm_head.weight"], pair.target.lm_head.weight.to(torch.bfloat16))
    assert "layers.0.mlp.gate_proj.weight" in draft and "hidden_norm.weight" in draft


def test_a_draft_reading_the_last_target_layer_is_refused_before_anything_is_written(tmp_path):
    pair = tiny_pair(target_layer_ids=(0, 2))
    with pytest.raises(ValueError, match=r"target_layer_ids \[2\] cannot be captured by SGLang"):
        export_pair(pair, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert draft_config(tiny_pair().draft.config, pair.target.config, "bfloat16")["block_size"] == 4


def test_custom_logit_processors_are_refused_under_the_overlap_scheduler_only():
    """A processor reads the answer so far, which SGLang's overlap loop brings up to date only after the next
    speculative step (ddtree.sglang.requests' docstring): refused there, served on every other DDTREE server."""
    overlap = ServedFeatures(overlap=True)
    for field in ("p", ["p"], [None, "p"]):                  # one prompt, or SGLang's per-prompt list
        message = request_refusal(None, NS(custom_logit_processor=field), overlap)
        assert message.startswith("custom_logit_processor is not supported by this DDTREE server under the overlap "
                                  "scheduler") and "--disable-overlap-schedule" in message, field
        assert request_refusal(None, NS(custom_logit_processor=field), ServedFeatures()) is None
    for none in (None, [None, None], "", []):                 # no processor in the request
        assert request_refusal(None, NS(custom_logit_processor=none), overlap) is None
    # the features that stay served under it: grammars, logprobs, logit bias, seeds under deterministic inference
    asks = NS(return_logprob=True, top_logprobs_num=3, custom_logit_processor=None)
    served = ServedFeatures(overlap=True, deterministic=True)
    assert request_refusal({"json_schema": "{}", "logit_bias": {"5": 1.0}, "temperature": 0.7, "sampling_seed": 3},
                           asks, served) is None


def test_auto_travels_through_the_environment_with_the_chain_beside_its_trees():
    """`--speculative-ddtree-budget auto` (issue 70): sized for its widest tree; every step may run no speculation
    (the root alone, width 1), the chain or any tree, at every running batch size; no speculation builds no tree."""
    from ddtree.sglang.setup.server_env import schedule_from_env

    env: dict = {}
    schedule_to_env("auto", "8", env)
    block_to_env(8, env)
    schedule = schedule_from_env(env)
    assert schedule.auto == (8, 16, 32) and schedule.chain == 7
    assert schedule.choices() == ((0, 1), (7, 1), (8, 8), (16, 8), (32, 8))
    assert schedule.widths == (1, 8, 9, 17, 33)
    assert schedule.batches_at_width(9, 4) == [1, 2, 3, 4] and schedule.batches_at_width(10, 4) == []
    assert schedule.batches_at_width(1, 4) == [1, 2, 3, 4]
    assert schedule.pairs(48) == {(7, 1), (8, 8), (16, 8), (32, 8)}
    assert from_env(env) == DDTreeSettings(32, 8, 8)
    assert str(schedule) == "budget auto:8,16,32 (and the chain, and no speculation) cap 8"
    narrow = schedule_from_env({**env, "SGLANG_DDTREE_BUDGET": "AUTO:4,16", "SGLANG_DDTREE_TOPK_CAP": "8"})
    assert narrow.choices() == ((0, 1), (4, 4), (7, 1), (16, 8))   # each tree's cap at most its budget


@pytest.mark.parametrize("budget, cap, message", [
    ("auto:", "8", r"--speculative-ddtree-budget \(SGLANG_DDTREE_BUDGET\)=auto: is invalid: expected auto"),
    ("auto:16,8", "8", r"=auto:16,8 is invalid: .*increasing"),
    ("auto:8,2048", "8", r"=auto:8,2048 is invalid: .*1\.\.1023"),
    ("automatic", "8", r"=automatic is invalid"),
])
def test_a_bad_auto_is_refused_naming_the_flag(budget, cap, message):
    from ddtree.sglang.setup.server_env import schedule_from_env

    with pytest.raises(DDTreeConfigError, match=message):
        schedule_from_env({"SGLANG_DDTREE_BUDGET": budget, "SGLANG_DDTREE_TOPK_CAP": cap})


def test_auto_is_checked_for_every_tree_and_keeps_one_cap(monkeypatch):
    monkeypatch.setenv("SGLANG_DDTREE_BLOCK_SIZE", "16")
    monkeypatch.setenv("SGLANG_DDTREE_TOPK_CAP", "8")
    monkeypatch.setenv("SGLANG_DDTREE_BUDGET", "auto:8,32")
    wide = DDTreeSettings(32, 8, 16)
    assert [m for m in refusals(wide, server()) if "auto budget 8" in m] == [
        "auto budget 8: --speculative-ddtree-budget=8 is invalid with block size 16: the draft's block must fit in "
        "the verify window (budget + 1 >= block size); use a budget >= 15 (15 with --speculative-ddtree-topk-cap 1 "
        "is the DFlash chain)"]
    monkeypatch.setenv("SGLANG_DDTREE_BUDGET", "auto:16,32")
    assert list(refusals(wide, server())) == []
    monkeypatch.setenv("SGLANG_DDTREE_TOPK_CAP", "1:8,16:4")
    with pytest.raises(DDTreeConfigError, match=r"--speculative-ddtree-topk-cap=1:8,16:4 is invalid with "
                                                r"--speculative-ddtree-budget=auto"):
        validate(wide, server())

"""Preflight reads k26_extra_args as the pinned SGLang's own parser does (issue 48): the option table the controller
uses (roles/k26_defaults/files/sglang-flags.json, written by tools/sglang_flags.py) equals `sglang serve`'s parser
in this SGLang 0.5.23, and for argument lists with prefixes, `=` forms, flags inside values, `--no-` forms and
value counts, the controller's reading sets the same options as SGLang's real parser (which options, not
their converted values: the check needs to know which options a list touches)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
from tools import sglang_flags

_spec = importlib.util.spec_from_file_location("k26_sglang_args",
                                               ROOT / "roles/k26_defaults/filter_plugins/k26_sglang_args.py")
k26_sglang_args = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(k26_sglang_args)
RULE = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_inputs"]["k26_extra_args"]


def test_the_committed_table_is_this_sglangs_parser():
    committed = json.loads(k26_sglang_args.SGLANG_FLAGS.read_text())
    assert committed == json.loads(sglang_flags.text(sglang_flags.table())), "run make sglang-flags after a bump"


def sglang_reading(words: list[str]) -> dict | str:
    """The dests SGLang's own parser sets from WORDS, or its error."""
    from sglang.srt.server_args import ServerArgs

    class Raising(argparse.ArgumentParser):
        def error(self, message):
            raise ValueError(message)

    parser = Raising(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    unset = object()
    for action in parser._actions:  # noqa: SLF001
        action.default = unset
    try:      # the unit always gives --model-path (required by SGLang's parser); left out of the reading
        namespace, unknown = parser.parse_known_args(["--model-path", "/m", *words])
    except ValueError as err:
        return f"error: {err}"
    if unknown:
        return f"unknown: {unknown[0]}"
    given = {k: v for k, v in vars(namespace).items() if v is not unset}
    if given.get("model_path") == "/m":
        del given["model_path"]
    return given


def controller_reading(words: list[str]) -> dict | str:
    try:
        return k26_sglang_args._given(words)  # noqa: SLF001
    except k26_sglang_args._Refused as err:  # noqa: SLF001
        text = str(err)
        return f"unknown: {text.rsplit(' ', 1)[1]}" if "has no option" in text else f"error: {text}"


CASES = [
    ["--log-level", "debug"], ["--log-level=debug"], ["--log-lev", "debug"], ["--api-ke", "K"],
    ["--disable-radix-cache", "--api-key=K"], ["--admin-api-key", "A"], ["--mem-fraction-static", "0.85"],
    ["--enable-metric"], ["--dis", "1"], ["--no-such-flag"], ["--log-level"], ["--enable-tf32-matmul"],
    ["--no-enable-tf32-matmul"], ["--cuda-graph-bs", "1", "2", "4"], ["--disable-cuda-graph"],
    ["--chunked-prefill-size", "8192", "--enable-mixed-chunk"], ["--speculative-num-steps", "3"],
    ["--tp", "8"], ["--config", "/dev/null"], ["--host=0.0.0.0"],
]


@pytest.mark.parametrize("words", CASES, ids=[" ".join(c) for c in CASES])
def test_the_controller_reads_each_list_as_sglang_does(words):
    ours, theirs = controller_reading(words), sglang_reading(words)
    if isinstance(theirs, dict):      # the same options set (values are SGLang's to convert; the check needs which)
        assert isinstance(ours, dict) and set(ours) == set(theirs), (ours, theirs)
    else:      # both refuse; the kind of refusal is the same (argparse's own wording for errors)
        assert isinstance(ours, str) and ours.split(":")[0] == theirs.split(":")[0], (ours, theirs)


@pytest.mark.parametrize("item,flag", [("--api-ke K", "--api-key"), ("--disable-radix-cache --api-key=K", "--api-key"),
                                       ("--admin-api-key A", "--admin-api-key"), ("--tp 8", "--tensor-parallel-size"),
                                       ("--speculative-algo NONE", "--speculative-algorithm"), ("--conf /x", "--config")])
def test_an_option_the_roles_own_is_refused_however_it_is_spelled(item, flag):
    errors = k26_sglang_args.k26_sglang_arg_errors([item], RULE)
    assert len(errors) == 1 and flag in errors[0] and "set that variable" in errors[0], errors


def test_options_on_the_allow_list_pass_in_any_spelling_sglang_takes():
    assert k26_sglang_args.k26_sglang_arg_errors(["--mem-fraction-static 0.85", "--log-level=info", "--disable-radix-cache",
                                             "--watchdog-time 1800", "--tool-call-parser kimi_k2"], RULE) == []


def test_the_allow_list_names_only_sglangs_options_none_the_roles_own():
    table = {s for o in json.loads(k26_sglang_args.SGLANG_FLAGS.read_text())["options"] for s in o["strings"]}
    assert set(RULE["allowed"]) <= table, set(RULE["allowed"]) - table
    owned = set(RULE["refused"]) | {f for f in table for p in RULE["refused_prefixes"] if f.startswith(p)}
    assert not set(RULE["allowed"]) & owned
    assert all(isinstance(why, str) and len(why) > 10 for why in RULE["allowed"].values())


@pytest.mark.parametrize("item,said", [
    ("--enable-mixed-chunk", "not on the list of options this service takes"),
    ("--kv-cache-dtype fp8_e5m2", "not on the list"),           # the equality tests ran bf16
    ("--log-requests-level 3", "not on the list"),              # prompts in the journal
    ("--custom-weight-loader x.y", "not on the list"),          # imports Python from a name
    ("--forward-hooks x", "not on the list"),
    ("--tokenizer-pa /srv/t", "not on the list"),               # a prefix: SGLang reads it as --tokenizer-path
    ("--load-format dummy", "k26_load_format"),                  # their own variables, warned at every run
    ("--load-form=dummy", "k26_load_format"),
    ("--enable-custom-logit-processor", "k26_custom_logit_processors"),
])
def test_an_option_off_the_allow_list_is_refused_naming_the_list_or_its_variable(item, said):
    errors = k26_sglang_args.k26_sglang_arg_errors(["--tool-call-parser kimi_k2", item], RULE)
    assert len(errors) == 1 and said in errors[0] and "item 1" in errors[0], errors

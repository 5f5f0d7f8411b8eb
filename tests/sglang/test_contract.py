"""Contract tests of the plugin against the real, pinned sglang==0.5.23 (CPU: import and parse only).

Run in the SGLang venv (`make test` does): python -m pytest tests/sglang
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

sglang = pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

ROOT = Path(__file__).resolve().parents[2]


def fresh(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (as SGLang's spawned processes are)."""
    e = os.environ.copy()
    e.pop("SGLANG_DDTREE_BUDGET", None)
    e.pop("SGLANG_DDTREE_TOPK_CAP", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e)


def test_version_is_the_pinned_one():
    from importlib.metadata import version

    assert version("sglang") == "0.5.23"


def test_load_plugins_registers_ddtree_in_a_fresh_process():
    r = fresh(
        "from sglang.srt.plugins import load_plugins; load_plugins()\n"
        "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as S\n"
        "spec = S.from_string('DDTREE')\n"
        "cls = spec.create_worker(None) if False else spec.factory(None)\n"
        "print(type(spec).__name__, spec.is_dflash_family(), spec.supports_target_verify_for_draft(), cls.__name__,\n"
        "      [b.__name__ for b in cls.__mro__][1])\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["DDTreeSpec", "True", "True", "DDTreeWorker", "DFlashWorkerV2"]


def test_the_allow_list_can_exclude_the_plugin():
    r = fresh("from sglang.srt.plugins import load_plugins; load_plugins()\n"
              "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as S\n"
              "S.from_string('DDTREE')\n", env={"SGLANG_PLUGINS": "someone-else"})
    assert r.returncode != 0 and "Unknown speculative algorithm name: DDTREE" in r.stderr


def test_the_server_parser_lists_the_ddtree_flags_after_plugins_load():
    r = fresh("from sglang.srt.plugins import load_plugins; load_plugins()\n"
              "from sglang.srt.server_args import prepare_server_args\n"
              "prepare_server_args(['--help'])\n")
    assert "--speculative-ddtree-budget" in r.stdout and "--speculative-ddtree-topk-cap" in r.stdout


def test_sglang_serve_help_prints_before_plugins_load_in_0_5_23():
    """Upstream 0.5.23: `sglang serve --help` returns before load_plugins(), so plugin flags are
    missing from that help text although `sglang serve` accepts them (README says so). If a later
    SGLang lists them, this test fails and the README note can go."""
    exe = Path(sys.executable).with_name("sglang")
    r = subprocess.run([str(exe), "serve", "--help"], capture_output=True, text=True, timeout=300)
    assert "--speculative-dflash-block-size" in r.stdout  # the help itself works
    assert "--speculative-ddtree-budget" not in r.stdout


def rendered_production_args(algorithm: str = "DDTREE") -> list[str]:
    """The ExecStart flags the Ansible template renders for inventory/production (tests/ansible renders both):
    DDTREE of the example inventory with its two DDTree flags, or the DFLASH fallback without them (and with
    SGLang's overlap scheduler, k26_overlap_schedule auto)."""
    ddtree = ["--speculative-ddtree-budget 32", "--speculative-ddtree-topk-cap 8"] if algorithm == "DDTREE" else []
    flags = ["--model-path /srv/models/Kimi-K2.6", "--served-model-name kimi-k2.6",
             f"--speculative-algorithm {algorithm}",
             "--speculative-draft-model-path /srv/models/Kimi-K2.6-DFlash", "--speculative-dflash-block-size 8",
             *ddtree, "--cuda-graph-max-bs-decode 48",
             "--tp 8", "--attention-backend triton", "--trust-remote-code",
             *(["--disable-overlap-schedule"] if algorithm == "DDTREE" else []),   # auto: SGLang's default otherwise
             "--max-running-requests 48", "--host 0.0.0.0", "--port 30000", "--enable-metrics",
             "--config /etc/k26/k26-ddtree.yaml", "--tool-call-parser kimi_k2", "--reasoning-parser kimi_k2",
             "--watchdog-timeout 1800"]
    return " ".join(flags).split()


RENDERED_CONFIG = "/etc/k26/k26-ddtree.yaml"
API_KEY = "contract-test-key-0123456789"


@functools.lru_cache(maxsize=1)
def config_file() -> str:
    """The config file the template renders (`api-key: <JSON string>`), in a temporary folder."""
    path = Path(tempfile.mkdtemp()) / "k26-ddtree.yaml"
    path.write_text(f"# rendered\napi-key: {json.dumps(API_KEY)}\n")
    return str(path)


def with_config(args: list[str]) -> list[str]:
    return [config_file() if a == RENDERED_CONFIG else a for a in args]


def each_in_one_process(imports: str, body: str, cases: dict[str, dict]) -> dict:
    """`body` run for every case in one fresh interpreter (SGLang's imports take 25-30 s a process), the plugins loaded
    as a server loads them: `body` (Python at no indent) reads `case` and sets `out[name]`; the DDTREE variables are
    cleared before each case (none inherits what an earlier one set) and the case's own `env` set. Returns name ->
    what the body put in `out`, or the error it raised."""
    script = ("import sys, json, os\n"
              "from sglang.srt.plugins import load_plugins; load_plugins()\n"
              f"{imports}"
              "out = {}\n"
              "for name, case in json.loads(sys.stdin.read()).items():\n"
              "    for k in [k for k in os.environ if k.startswith('SGLANG_DDTREE_')]:\n"
              "        del os.environ[k]\n"
              "    os.environ.update(case.get('env', {}))\n"
              "    try:\n"
              f"{textwrap.indent(body, ' ' * 8)}"
              "    except BaseException as e:\n"
              "        out[name] = f'{type(e).__name__}: {e}'\n"
              "print(json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DDTREE_")}
    r = subprocess.run([sys.executable, "-c", script], input=json.dumps(cases), capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


PARSE_IMPORTS = ("from sglang.srt.server_args import prepare_server_args\n"
                 "from ddtree.sglang.plugin import validate_server_args\n")
PARSE_BODY = ("a = prepare_server_args(case['args'])\n"
              "if a.speculative_algorithm == 'DDTREE': validate_server_args(a)   # SGLang calls it for DDTREE only\n"
              "out[name] = [str(v) for v in (a.speculative_algorithm, os.environ.get('SGLANG_DDTREE_BUDGET', '-'),\n"
              "             os.environ.get('SGLANG_DDTREE_TOPK_CAP', '-'), a.attention_backend, a.tp_size,\n"
              "             a.disable_overlap_schedule, a.api_key, engine._server_args_for_logging(a)['api_key'])]\n")
PARSED = {   # name -> the algorithm rendered, whether its --disable-overlap-schedule is dropped, variables set
    "dflash": ("DFLASH", False, {}),
    "ddtree": ("DDTREE", False, {}),
    "overlap": ("DDTREE", True, {}),
    "overlap, leftover switch 0": ("DDTREE", True, {"SGLANG_DDTREE_OVERLAP": "0"}),
}


def with_leftover_overlap_switch(value: str | None) -> dict:
    """This environment without the removed SGLANG_DDTREE_OVERLAP, or with it at `value` (an env file's leftover)."""
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_DDTREE_OVERLAP"}
    return env if value is None else {**env, "SGLANG_DDTREE_OVERLAP": value}


@pytest.fixture(scope="module")
def parsed() -> dict[str, list[str] | str]:
    """Every PARSED command line parsed by SGLang (and validated by the plugin where DDTREE) in one fresh interpreter
    (imports take 25-30 s: four processes took ~95 s of the lane): name -> [algorithm, SGLANG_DDTREE_BUDGET,
    SGLANG_DDTREE_TOPK_CAP, attention backend, tp size, overlap disabled, the API key SGLang holds, the key in its
    start-up log line] or the error it raised. The DDTREE variables are cleared before each case."""
    cases = {name: {"args": with_config([a for a in rendered_production_args(algorithm)
                                         if not (overlap and a == "--disable-overlap-schedule")]), "env": extra}
             for name, (algorithm, overlap, extra) in PARSED.items()}
    return each_in_one_process(PARSE_IMPORTS + "from sglang.srt.entrypoints import engine\n", PARSE_BODY, cases)


def test_the_rendered_dflash_fallback_command_line_parses(parsed):
    # SGLang's overlap scheduler on (k26_overlap_schedule auto): a DFLASH server runs it
    assert parsed["dflash"] == ["DFLASH", "32", "8", "triton", "8", "False", API_KEY, "<redacted>"]


def test_the_rendered_ddtree_command_line_parses_and_validates(parsed):
    # the key reaches SGLang from the config file (not argv), and its start-up log line redacts it
    assert parsed["ddtree"] == ["DDTREE", "32", "8", "triton", "8", "True", API_KEY, "<redacted>"]


def test_the_rendered_ddtree_command_line_under_the_overlap_scheduler_parses_and_validates(parsed):
    """k26_overlap_schedule true renders no --disable-overlap-schedule: SGLang keeps its overlap scheduler on for
    DDTREE (registered overlap-capable) and the plugin's start-up refuses nothing, with no switch in the environment
    (SGLANG_DDTREE_OVERLAP is gone; a leftover value changes nothing)."""
    for name in ("overlap", "overlap, leftover switch 0"):
        assert parsed[name] == ["DDTREE", "32", "8", "triton", "8", "False", API_KEY, "<redacted>"], name


def test_the_rendered_flags_match_the_template():
    """The list above is the one tests/ansible asserts for the production render (kept in step)."""
    text = (ROOT / "tests" / "ansible" / "test_static.py").read_text()
    for flag in rendered_production_args("DDTREE"):
        if flag.startswith("--"):
            assert flag in text


INVALID = [
    ({"--speculative-ddtree-budget": "0"}, "--speculative-ddtree-budget=0 is invalid"),
    ({"--speculative-ddtree-topk-cap": "64"}, "--speculative-ddtree-topk-cap=64 is invalid: expected 1..budget (32)"),
    ({"--speculative-ddtree-budget": "5", "--speculative-ddtree-topk-cap": "1"},
     "--speculative-ddtree-budget=5 is invalid with block size 8: the draft's block must fit in the verify window"),
    ({"--attention-backend": "trtllm_mla"}, "--attention-backend=trtllm_mla cannot verify a tree"),
    ({"--attention-backend": None}, "--attention-backend=None cannot verify a tree"),
    ({"--page-size": "16"}, "--page-size=16 is invalid for DDTREE"),
    ({"--pp-size": "2"}, "--pp-size=2 is not supported with DDTREE"),
    ({"--speculative-num-draft-tokens": "9"}, "--speculative-num-draft-tokens=9 is invalid with DDTREE"),
    ({"--speculative-num-steps": "3"}, "--speculative-num-steps=3 does not apply to DDTREE"),
    ({"--speculative-draft-window-size": "64"}, "--speculative-draft-window-size=64 is not supported with DDTREE"),
    ({"--speculative-accept-threshold-single": "0.5"}, "--speculative-accept-threshold-single=0.5 is not supported"),
    ({"--speculative-use-block-verification": True}, "--speculative-use-block-verification=True is not supported"),
    ({"--enable-two-batch-overlap": True}, "--enable-two-batch-overlap=True is not supported with DDTREE"),
    ({"--enable-mixed-chunk": True}, "--enable-mixed-chunk=True is not supported with DDTREE"),
    ({"--enable-lora": True}, "--enable-lora=True is not supported with DDTREE"),
    ({"--disaggregation-mode": "decode"}, "--disaggregation-mode=decode is not supported with DDTREE"),
]

VALIDATE = ("validate_server_args(prepare_server_args(case['args']))\n"
            "out[name] = 'accepted'\n")


def changed(args: list[str], change: dict) -> list[str]:
    args = list(args)
    for flag, value in change.items():
        if value is None:
            i = args.index(flag)
            del args[i: i + (1 if flag.startswith("--disable") else 2)]
        elif value is True:
            args.append(flag)
        elif flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return args


@pytest.fixture(scope="module")
def invalid_outcomes() -> list[str]:
    """Every INVALID command line parsed and validated in one fresh interpreter (imports take ~25 s)."""
    cases = {str(i): {"args": with_config(changed(rendered_production_args("DDTREE"), change))}
             for i, (change, _) in enumerate(INVALID)}
    outcomes = each_in_one_process(PARSE_IMPORTS, VALIDATE, cases)
    return [outcomes[str(i)] for i in range(len(INVALID))]


@pytest.mark.parametrize("case", range(len(INVALID)), ids=[m.split(" ")[0] for _, m in INVALID])
def test_invalid_settings_are_rejected_with_the_plugins_message(invalid_outcomes, case):
    outcome, message = invalid_outcomes[case], INVALID[case][1]
    assert outcome != "accepted" and message in outcome, outcome


OVERRIDES = {"__init__", "forward_batch_generation", "_maybe_build_draft_sampler", "prewarm_sampling", "init_cuda_graphs"}
FAULT_HOOKS = {"step_tree", "verify_tree", "penalty_paths"}   # DDTreeWorker's own, the test bed's fault workers'


def test_dflash_worker_v2_has_what_the_worker_overrides_and_calls():
    from sglang.srt.speculative import dflash_worker_v2
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from ddtree.sglang.worker import make_worker_class

    worker = make_worker_class()
    own = {n for n, v in vars(worker).items() if callable(v) or isinstance(v, staticmethod)}
    assert own - {"_decode"} - FAULT_HOOKS == OVERRIDES
    assert not any(hasattr(DFlashWorkerV2, name) for name in FAULT_HOOKS | {"_decode"})
    for name in OVERRIDES:      # every override exists upstream with the same parameters
        assert inspect.signature(getattr(worker, name)).parameters.keys() == \
            inspect.signature(getattr(DFlashWorkerV2, name)).parameters.keys(), name
    # what the decode step calls on the parent (0.5.23 names)
    for name in ("_append_target_hidden_to_draft_kv_by_loc", "_draft_write_ids", "_make_next_draft_input_decode",
                 "_can_skip_verify_logits", "_defer_target_verify_gather"):
        assert callable(getattr(DFlashWorkerV2, name)), name
    assert callable(dflash_worker_v2._resolve_dflash_embedding_module)
    params = inspect.signature(DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc).parameters
    assert {"target_hidden", "cache_loc", "positions", "cache_loc_2d", "commit_lens"} <= params.keys()
    # SGLang functions the verdict and the commit call (logprobs in the chain layout; seeded draws)
    from sglang.srt.layers import logprob_processor, sampler
    assert {"batch", "logits_output", "predict", "chain_stride"} <= \
        inspect.signature(logprob_processor.compute_spec_logprobs).parameters.keys()
    assert {"sampling_seed", "positions"} <= inspect.signature(sampler.sampling_from_probs_torch).parameters.keys()


def worker_reads(module, name: str = "worker") -> set[str]:
    """The attributes a module's functions read off `name` (the DDTreeWorker: `worker` in the stage modules,
    `self` in the class)."""
    import ast

    tree = ast.parse(inspect.getsource(module))
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == name}


def test_every_parent_field_the_stages_read_is_dflash_worker_v2s_own():
    """DFlashWorkerV2.__getattr__ hands any attribute it lacks to the target worker, so a field renamed upstream
    would be read silently from the wrong object. Every attribute the decode stages and the set-up read off the
    worker is assigned in DFlashWorkerV2's (or its bases') source, or is one of its methods or properties."""
    import re

    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from ddtree.sglang import tree_worker
    from ddtree.sglang.setup import worker_setup

    sources = "\n".join(inspect.getsource(c) for c in DFlashWorkerV2.__mro__ if c.__module__.startswith("sglang"))
    assigned = set(re.findall(r"self\.(\w+)\s*(?::[^=\n]*)?=(?!=)", sources))
    read = worker_reads(worker_setup) | (worker_reads(tree_worker, "self") - {"ddtree", "_decode"} - FAULT_HOOKS)
    missing = {a for a in read if a not in assigned and not hasattr(DFlashWorkerV2, a)}
    assert read and not missing, missing
    view_reads = worker_reads(worker_setup.step_view)
    assert {"_mask_token_id", "_draft_sampler", "_append_target_hidden_to_draft_kv_by_loc"} <= view_reads, view_reads


def test_the_stages_read_the_step_view_not_the_worker():
    """The decode stages and the verdict take the StepView (built once after the graphs) and never the worker: no
    parameter named worker, no attribute read off one; every StepView field is filled by step_view."""
    import ast
    import dataclasses

    from ddtree.sglang.setup import worker_setup
    from ddtree.sglang.step import decode_step, verdict
    from ddtree.sglang.step.view import StepView

    for module in (decode_step, verdict):
        tree = ast.parse(inspect.getsource(module))
        params = {a.arg for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) for a in fn.args.args}
        assert "worker" not in params and worker_reads(module) == set(), module.__name__
    built = ast.parse(inspect.getsource(worker_setup.step_view))
    call = next(n for n in ast.walk(built) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "StepView")
    assert {k.arg for k in call.keywords} == {f.name for f in dataclasses.fields(StepView)}


def test_no_decode_step_reads_the_kernel_backend_from_the_environment():
    """The worker resolves DDTREE_BACKEND once (switches.read in __init__) and hands it on: every per-step call of a
    function that would otherwise read the environment (the tree build, the walk, the verify mask, the commit) passes
    its backend - the view's, the verdict setup's or the policy's - so no step reads os.environ."""
    import ast

    from ddtree import tree as tree_module, verify
    from ddtree.sglang import tree_worker
    from ddtree.sglang.policy import step_policy
    from ddtree.sglang.step import decode_step, glue, verdict

    functions = {"build_tree_from_candidates": tree_module.build_tree_from_candidates,
                 "accept_path": verify.accept_path, "verify_mask": glue.verify_mask, "commit_step": glue.commit_step}
    seen = 0
    for module in (decode_step, verdict, tree_worker, step_policy):
        for call in ast.walk(ast.parse(inspect.getsource(module))):
            name = getattr(getattr(call, "func", None), "id", None)
            if not isinstance(call, ast.Call) or name not in functions:
                continue
            seen += 1
            positional = list(inspect.signature(functions[name]).parameters).index("backend")
            assert len(call.args) > positional or "backend" in {k.arg for k in call.keywords}, \
                f"{module.__name__}: {name}(...) at line {call.lineno} leaves its backend to the environment"
    assert seen == 5                    # the tree (worker, policy), the walk, the mask, the commit


def test_a_fault_is_a_worker_class_chosen_at_start_up():
    """SGLANG_DDTREE_FAULT picks a subclass that overrides one hook; the served class has none of the faults'
    behaviour (its hooks hand back the step's own tree), and every fault the switch registry allows has a class."""
    import torch

    from ddtree import build_tree, switches
    from ddtree.sglang.diagnostics.faults import FAULT_WORKERS
    from ddtree.sglang.diagnostics.step_dump import drop_last_node, hide_paths_from_penalties, leak_siblings
    from ddtree.sglang.tree_worker import DDTreeWorker
    from ddtree.sglang.worker import make_worker_class

    assert set(FAULT_WORKERS) == set(switches.BY_FIELD["fault"].choices)
    assert make_worker_class({}) is DDTreeWorker
    tree = build_tree(torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0)), torch.tensor([1, 2]),
                      budget=6, topk_cap=2, backend="torch")
    served = DDTreeWorker.__new__(DDTreeWorker)              # the hooks read nothing of the worker
    assert served.verify_tree(tree) is tree and served.penalty_paths(tree) is tree and served.step_tree(tree) is tree
    for fault, made in (("sibling", leak_siblings), ("stale-penalties", hide_paths_from_penalties),
                        ("drop-leaf", drop_last_node)):
        cls = make_worker_class({"SGLANG_DDTREE_FAULT": fault})
        assert cls is FAULT_WORKERS[fault] and issubclass(cls, DDTreeWorker)
        worker = cls.__new__(cls)
        hook = {"sibling": "verify_tree", "stale-penalties": "penalty_paths", "drop-leaf": "step_tree"}[fault]
        hooked = getattr(worker, hook)(tree)
        assert torch.equal(hooked.ancestor_mask, made(tree).ancestor_mask)
        assert not torch.equal(hooked.ancestor_mask, tree.ancestor_mask)
        assert {n for n in vars(cls) if callable(vars(cls)[n])} == {hook}        # that hook alone
    with pytest.raises(Exception, match="SGLANG_DDTREE_FAULT"):
        make_worker_class({"SGLANG_DDTREE_FAULT": "typo"})


def test_the_worker_module_is_imported_only_when_the_worker_is_asked_for():
    """ddtree.sglang.worker (the release flag and the factory) imports no SGLang module; the worker
    class lives at module level in ddtree.sglang.tree_worker, which the factory imports."""
    r = fresh("import sys\nfrom ddtree.sglang import worker\n"
              "print(sorted(m for m in sys.modules if m == 'sglang' or m.startswith(('sglang.', 'ddtree.sglang.tree_worker'))))\n"
              "cls = worker.make_worker_class()\nprint(cls.__module__, cls.__qualname__, 'sglang' in sys.modules)\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:2] == ["[]", "ddtree.sglang.tree_worker DDTreeWorker True"], r.stdout


def test_the_worker_decodes_ddtree_in_this_release():
    from ddtree.sglang import worker

    assert worker.DECODE_READY is True
    cls = worker.make_worker_class()
    step = inspect.getsource(cls._decode)
    stages = ("plan_step(", "reserve_window(", "draft_candidates(", "narrow_candidates(", "build_tree_from_candidates(",
              "constrain_to_grammars(", "verify_forward_batch(", "run_verify(", "decide(", "commit(")
    assert [step.index(s) for s in stages] == sorted(step.index(s) for s in stages)    # each once, in this order


def test_target_verify_width_is_budget_plus_one_and_the_draft_keeps_its_block():
    r = fresh("from sglang.srt.plugins import load_plugins; load_plugins()\n"
              "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as S\n"
              "a = S.from_string('DDTREE')\n"
              "print(a.get_num_tokens_per_req_for_target_verify(49, False),"
              " a.get_num_tokens_per_req_for_target_verify(49, True))\n",
              env={"SGLANG_DDTREE_BUDGET": "48", "SGLANG_DDTREE_BLOCK_SIZE": "8"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["49", "8"]


def test_the_draft_width_without_the_resolved_block_is_an_error_not_a_guess():
    r = fresh("from sglang.srt.plugins import load_plugins; load_plugins()\n"
              "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as S\n"
              "S.from_string('DDTREE').get_num_tokens_per_req_for_target_verify(33, True)\n")
    assert r.returncode != 0 and "SGLANG_DDTREE_BLOCK_SIZE is not set" in r.stderr


def test_ddtree_spec_answers_every_method_of_a_builtin_algorithm():
    """The scheduler calls these on any algorithm (0.5.23's CustomSpecAlgo lacks four of them)."""
    r = fresh("from sglang.srt.plugins import load_plugins; load_plugins()\n"
              "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as S\n"
              "spec = S.from_string('DDTREE')\n"
              "names = {n for n, v in vars(S).items() if callable(v) and not n.startswith('_')}\n"
              "print(sorted(n for n in names if not hasattr(spec, n)))\n"
              "print(spec.carries_draft_hidden_states(), spec.need_topk(), spec.get_platform_worker_cls())\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["[]", "False False None"]


RESOLVE_IMPORTS = ("from sglang.srt.server_args import prepare_server_args\n"
                   "from sglang.srt.arg_groups.overrides import resolving_view\n")
RESOLVE_BODY = ("a = prepare_server_args(case['args'])\n"
                "a.resolve_once()\n"
                "c = resolving_view(a)\n"
                "out[name] = [str(v) for v in (c.speculative_num_draft_tokens, c.speculative_num_steps,\n"
                "             c.speculative_eagle_topk, c.speculative_draft_attention_backend,\n"
                "             c.max_running_requests, os.environ['SGLANG_DDTREE_BLOCK_SIZE'])]\n")

SCHEDULE = ("--speculative-ddtree-budget", "1:64,8:32,32:8", "--speculative-ddtree-topk-cap", "1:8,32:4")
RESOLVED = {   # name -> the DDTREE flags added to the tiny pair's command line
    "budget 32": ("--speculative-ddtree-budget", "32", "--speculative-ddtree-topk-cap", "8"),
    "schedule": SCHEDULE,
    "too narrow": ("--speculative-ddtree-budget", "1:64,32:4", "--speculative-ddtree-topk-cap", "1:8,32:4"),
    "block 16": ("--speculative-dflash-block-size", "16"),
}


def tiny_pair(root: Path) -> Path:
    """config.json files of a tiny Qwen3 target and its block-8 DFlash draft (--load-format dummy reads no weights)."""
    pair = root / "pair"
    for name, cfg in (("target", {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4}),
                      ("draft", {"architectures": ["DFlashDraftModel"], "num_hidden_layers": 1, "block_size": 8,
                                 "num_target_layers": 4,
                                 "dflash_config": {"block_size": 8, "target_layer_ids": [0, 2], "mask_token_id": 1000}})):
        (pair / name).mkdir(parents=True)
        (pair / name / "config.json").write_text(json.dumps({
            "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "max_position_embeddings": 2048, "torch_dtype": "bfloat16",
            "tie_word_embeddings": False, **cfg}))
    return pair


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict[str, list[str] | str]:
    """SGLang's own resolution pipeline on the CPU (--device cpu) for every RESOLVED case, in one fresh interpreter
    (its imports take 25-30 s; four processes took 110 s of the lane): name -> [draft tokens, steps, top-k, draft
    attention backend, running requests, the block handed to the schedulers] or the error it raised. The DDTREE
    variables are cleared before each case, so each case sets its own block."""
    pair = tiny_pair(tmp_path_factory.mktemp("resolve"))
    base = ["--model-path", str(pair / "target"), "--skip-tokenizer-init", "--device", "cpu", "--load-format",
            "dummy", "--attention-backend", "triton", "--speculative-algorithm", "DDTREE",
            "--speculative-draft-model-path", str(pair / "draft"), "--disable-overlap-schedule"]
    return each_in_one_process(RESOLVE_IMPORTS, RESOLVE_BODY, {n: {"args": base + list(x)} for n, x in RESOLVED.items()})


def test_sglangs_resolution_sizes_a_ddtree_server_for_its_verify_width(resolved):
    # width budget + 1, one step, top-k 1, the draft attends with the target's backend, DFLASH's
    # default concurrency, and the draft's block (from its config.json) handed to the schedulers
    assert resolved["budget 32"] == ["33", "1", "1", "triton", "48", "8"]


def test_a_budget_schedule_sizes_the_server_for_its_widest_step(resolved):
    # no switch: the schedule's went with its GPU tests (issue 45)
    assert resolved["schedule"] == ["65", "1", "1", "triton", "48", "8"]


def test_a_budget_schedule_is_checked_at_every_step(resolved):
    assert "from batch size 32: --speculative-ddtree-budget=4 is invalid with block size 8" in resolved["too narrow"]


def test_the_spec_answers_a_schedules_widths_and_the_widest_otherwise():
    script = ("import os\n"
              "os.environ.update(SGLANG_DDTREE_BUDGET='1:64,8:32,32:8', SGLANG_DDTREE_TOPK_CAP='8',\n"
              "                  SGLANG_DDTREE_BLOCK_SIZE='8')\n"
              "from ddtree.sglang.plugin import spec_class\n"
              "spec = spec_class()('DDTREE', None)\n"
              "f = spec.get_num_tokens_per_req_for_target_verify\n"
              "print(f(65, False), f(33, False), f(9, False), f(8, False), f(65, True))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-5:] == ["65", "33", "9", "65", "8"]


def test_the_sglang_names_the_width_states_use_exist():
    """widths.py builds a narrower width's verify state as SGLang's adaptive EAGLE worker builds its states."""
    from sglang.srt.arg_groups.arg_utils import namespace_of
    from sglang.srt.model_executor.cuda_graph_config import PhaseConfig
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner import base_cuda_graph_runner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.server_args import ServerArgs

    assert "init_new_workspace" in inspect.signature(ModelRunner._get_attention_backend).parameters
    assert {"attn_backend", "speculative_num_draft_tokens"} <= set(inspect.signature(DecodeCudaGraphRunner).parameters)
    assert "cuda_graph_config.decode.bs" in inspect.getsource(base_cuda_graph_runner.get_batch_sizes_to_capture)
    assert "speculative_num_draft_tokens" in namespace_of(ServerArgs)
    assert not PhaseConfig.__dataclass_params__.frozen and "bs" in PhaseConfig.__dataclass_fields__


def test_a_block_flag_that_contradicts_the_drafts_config_stops_resolution(resolved):
    assert "--speculative-dflash-block-size=16 differs from the draft's block_size 8" in resolved["block 16"]


def test_the_request_hook_is_applied_and_refuses_with_the_field(tmp_path):
    r = fresh("from sglang.srt.plugins import load_plugins; load_plugins()\n"
              "from types import SimpleNamespace as NS\n"
              "from sglang.srt.managers.io_struct import GenerateReqInput\n"
              "from sglang.srt.managers.tokenizer_manager import TokenizerManager as TM\n"
              "ddtree = NS(server_args=NS(speculative_algorithm='DDTREE', disable_overlap_schedule=False))\n"
              "for obj in (GenerateReqInput(input_ids=[1, 2], sampling_params={'temperature': 0.7, 'sampling_seed': 3}),\n"
              "            GenerateReqInput(input_ids=[1, 2], sampling_params={'frequency_penalty': 0.5}),\n"
              "            GenerateReqInput(input_ids=[1, 2], return_hidden_states=True),\n"
              "            GenerateReqInput(input_ids=[1, 2], return_logprob=True, top_logprobs_num=2),\n"
              "            GenerateReqInput(input_ids=[1, 2], custom_logit_processor='{\"callable\": \"x\"}')):\n"
              "    try:\n"
              "        TM._validate_one_request(ddtree, obj, [1, 2])\n"
              "    except Exception as e:\n"    # the plugin's refusal, or SGLang's own validation on the stand-in
              "        print(str(e).split(' ')[0] if 'DDTREE' in str(e) else 'reached SGLang')\n"
              "other = NS(server_args=NS(speculative_algorithm='DFLASH'))\n"
              "try:\n"
              "    TM._validate_one_request(other, GenerateReqInput(input_ids=[1, 2], return_logprob=True), [1, 2])\n"
              "except Exception as e:\n"    # SGLang's own validation runs (and fails on the stand-in manager)
              "    print('refused by the plugin' if 'DDTREE' in str(e) else 'reached SGLang')\n")
    assert r.returncode == 0, r.stderr[-2000:]
    # a seed without deterministic inference, a penalty and a custom logit processor under the overlap scheduler,
    # hidden states: refused, naming the field; logprobs: passed on to SGLang's own validation, as the same request
    # to DFLASH is
    assert r.stdout.split("\n")[:6] == ["sampling_params.sampling_seed=3", "sampling_params.frequency_penalty=0.5",
                                        "return_hidden_states=True", "reached SGLang", "custom_logit_processor",
                                        "reached SGLang"]


def test_sglang_synchronises_a_ddtree_grammar_batch_under_the_overlap_scheduler():
    """Grammars stay served under the overlap scheduler because SGLang 0.5.23 runs a grammar batch of an algorithm
    that does not advance the grammar inside its own verify synchronously (the previous step's tokens reach the
    grammar before DDTREE builds its tree): DDTREE registers without grammar overlap, unlike SGLang's DFLASH, whose
    worker takes the scheduler's grammar barrier."""
    script = ("from ddtree.sglang import plugin; plugin.register()\n"
              "from types import SimpleNamespace as NS\n"
              "from sglang.srt.managers.schedule_batch import ScheduleBatch\n"
              "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm\n"
              "for name in ('DDTREE', 'DFLASH'):\n"
              "    algo = SpeculativeAlgorithm.from_string(name)\n"
              "    print(name, algo.supports_grammar_overlap(),\n"
              "          ScheduleBatch.grammar_needs_sync(NS(has_grammar=True, spec_algorithm=algo)),\n"
              "          ScheduleBatch.grammar_needs_sync(NS(has_grammar=False, spec_algorithm=algo)))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["DDTREE False True False", "DFLASH True False False"]


def test_the_commit_plan_of_a_chain_matches_dflash_accept_in_sglang():
    """Budget = L, cap 1 is the DFlash chain: our commit (tokens, lengths, bonus) equals SGLang's own
    greedy DFlash accept + _commit_accept on the same candidates and target predictions."""
    import torch
    from sglang.kernels.ops.speculative.dflash import compute_dflash_correct_drafts_and_bonus
    from sglang.srt.speculative.dflash_worker_v2 import _commit_accept

    from ddtree import build_tree
    from ddtree.sglang.step.glue import commit_plan
    from ddtree.verify import walk_tree

    g = torch.Generator().manual_seed(0)
    bs, depth, vocab = 6, 7, 5
    draft = torch.randn(bs, depth, vocab, generator=g)
    roots = torch.randint(0, vocab, (bs,), generator=g)
    chain = build_tree(draft, roots, budget=depth, topk_cap=1, backend="torch")
    candidates = chain.tokens                                                # [bs, L+1] root + chain
    # the target agrees with the chain for a different number of steps per request
    target = torch.randint(0, vocab, (bs, depth + 1), generator=g)
    for b in range(bs):
        target[b, :b] = candidates[b, 1:b + 1]
    accept, bonus = compute_dflash_correct_drafts_and_bonus(candidates=candidates, target_predict=target)
    want_tokens, want_lens = _commit_accept(candidates, accept, bonus)
    plan = commit_plan(walk_tree(chain, target), torch.arange(bs * (depth + 1)).view(bs, -1),
                       torch.zeros(bs, dtype=torch.int64))
    assert plan.commit_lens.tolist() == want_lens.tolist()
    assert plan.bonus.tolist() == bonus.tolist()
    for b in range(bs):
        k = int(want_lens[b])
        assert plan.out_tokens[b, :k].tolist() == want_tokens[b, :k].tolist()
    assert sorted(set(accept.tolist())) == list(range(min(bs, depth + 1)))   # every accept length 0..5 seen


def test_sglang_sampling_info_maps_to_ddtree_sampling_params():
    """Real SGLang SamplingParams (their greedy and 'no top-k' encodings) -> the tensors verify_tree takes."""
    import torch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.sampling.sampling_params import SamplingParams as SgParams

    from ddtree.sglang.step.glue import sampling_params_from_sglang

    reqs = [SgParams(temperature=0.0), SgParams(temperature=0.7, top_k=20, top_p=0.9),
            SgParams(temperature=1.3, min_p=0.05)]
    vocab = 1000
    info = SamplingBatchInfo(
        temperatures=torch.tensor([r.temperature for r in reqs]).view(-1, 1),
        top_ps=torch.tensor([r.top_p for r in reqs]), top_ks=torch.tensor([r.top_k for r in reqs], dtype=torch.int32),
        min_ps=torch.tensor([r.min_p for r in reqs]), is_all_greedy=False, is_any_greedy=True,
        need_top_p_sampling=True, need_top_k_sampling=True, need_min_p_sampling=True, vocab_size=vocab)
    p = sampling_params_from_sglang(info, vocab)
    assert p.temperature.tolist() == pytest.approx([0.0, 0.7, 1.3])
    assert p.top_k.tolist() == [0, 20, 0]            # greedy's top_k 1 is carried by temperature 0
    assert p.top_p.tolist() == pytest.approx([1.0, 0.9, 1.0]) and p.min_p.tolist() == pytest.approx([0.0, 0.0, 0.05])
    assert p.all_greedy is False
    greedy = sampling_params_from_sglang(
        SamplingBatchInfo(temperatures=torch.ones(2, 1), top_ps=torch.ones(2), top_ks=torch.ones(2, dtype=torch.int32),
                          min_ps=torch.zeros(2), is_all_greedy=True, is_any_greedy=True, need_top_p_sampling=False,
                          need_top_k_sampling=False, need_min_p_sampling=False, vocab_size=vocab), vocab)
    assert greedy.all_greedy and greedy.top_k is None and greedy.temperature.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("leftover", [None, "0"])
def test_ddtree_is_registered_overlap_capable_without_a_switch(leftover):
    """DDTREE registers with supports_overlap (SGLang starts it under its overlap scheduler without the deprecation
    warning of plugin workers that lack it), whatever an env file left of the removed SGLANG_DDTREE_OVERLAP."""
    script = ("from ddtree.sglang import plugin; plugin.register()\n"
              "from sglang.srt.speculative import spec_registry as r\n"
              "algo = r._REGISTRY['DDTREE']; print(algo.supports_overlap)\n")
    out = subprocess.run([sys.executable, "-c", script], env=with_leftover_overlap_switch(leftover),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"


def test_a_widths_graphs_cover_its_batch_sizes_padded_as_sglang_pads():
    from ddtree.sglang.setup.widths import padded_batches

    captured = [1, 2, 4, 8, 12, 16, 24, 32, 48]
    assert padded_batches(list(range(8, 32)), captured) == [8, 12, 16, 24, 32]
    assert padded_batches([3, 5, 6], captured) == [4, 8]
    assert padded_batches([49], captured) == [] and padded_batches([], captured) == []


def test_the_worker_reads_the_running_limit_from_the_settings_sglang_fills_before_it():
    """SGLang 0.5.23 assigns ModelRunner.max_running_requests only when a memory pool is allocated, which for the
    target happens after the draft worker is built (every scheduled DDTREE server died of that AttributeError on the
    H200, 2026-12-03). The worker's construction reads the limit from get_schedule() (ServerArgs' field) instead."""
    import ast

    from sglang.srt import runtime_context
    from sglang.srt.model_executor import model_runner

    def attribute_uses(cls, store: bool) -> set[str]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        return {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) for node in ast.walk(fn)
                if isinstance(node, ast.Attribute) and node.attr == "max_running_requests"
                and isinstance(node.ctx, ast.Store) == store}

    setters = attribute_uses(model_runner.ModelRunner, store=True)
    assert "alloc_memory_pool" in setters and "__init__" not in setters, setters
    assert "schedule.max_running_requests" in inspect.getsource(runtime_context)      # SGLang's own reader
    from ddtree.sglang import tree_worker
    from ddtree.sglang.setup import worker_setup

    readers = attribute_uses(tree_worker.DDTreeWorker, store=False) | attribute_uses(worker_setup, store=False)
    assert readers & {"__init__", "init_cuda_graphs", "target_widths", "prewarm_trees"} == set(), readers
    assert "get_schedule().max_running_requests" in inspect.getsource(worker_setup.max_running)


def test_the_schedules_width_states_are_built_after_the_targets_graphs():
    """SGLang 0.5.23 builds the draft worker before any memory pool, attention backend or graph, and captures the
    target's graphs before the draft's; ModelRunner.decode_cuda_graph_runner first exists in its init_cuda_graphs.
    So the worker builds its narrower widths (widths.TargetWidths reads the target's graph runner) in its own
    init_cuda_graphs, after the parent's - the H200 showed the AttributeError of building them in __init__."""
    import ast

    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor import model_runner

    from ddtree.sglang import tree_worker

    order = inspect.getsource(Scheduler.init_model_worker)
    steps = ["self.maybe_init_draft_worker()", "self.init_memory_pools()", "self.init_all_attention_backends()",
             "self.init_all_cuda_graphs()"]
    assert [order.index(s) for s in steps] == sorted(order.index(s) for s in steps)
    graphs = inspect.getsource(Scheduler.init_all_cuda_graphs)
    assert graphs.index("self.tp_worker.init_cuda_graphs()") < graphs.index("self.draft_worker.init_cuda_graphs()")
    tree = ast.parse(textwrap.dedent(inspect.getsource(model_runner.ModelRunner)))
    setters = {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) for node in ast.walk(fn)
               if isinstance(node, ast.Attribute) and node.attr == "decode_cuda_graph_runner"
               and isinstance(node.ctx, ast.Store)}
    assert "init_cuda_graphs" in setters and "__init__" not in setters, setters
    worker = inspect.getsource(tree_worker.DDTreeWorker.init_cuda_graphs)
    assert worker.index("super().init_cuda_graphs()") < worker.index("target_widths(")
    assert "target_widths(" not in inspect.getsource(tree_worker.DDTreeWorker.__init__)

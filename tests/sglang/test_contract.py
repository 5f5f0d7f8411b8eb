"""Contract tests of the plugin against the real, pinned sglang==0.5.23 (CPU: import and parse only).

Run in the SGLang venv (`make test` does): python -m pytest tests/sglang
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
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


def rendered_production_args(algorithm: str = "DFLASH") -> list[str]:
    """The ExecStart flags the Ansible template renders for inventory/production (tests/ansible renders both):
    the DFlash chain of the example inventory, or with k26_speculative_algorithm=DDTREE its two DDTree flags."""
    ddtree = ["--speculative-ddtree-budget 32", "--speculative-ddtree-topk-cap 8"] if algorithm == "DDTREE" else []
    flags = ["--model-path /srv/models/Kimi-K2.6", "--served-model-name kimi-k2.6",
             f"--speculative-algorithm {algorithm}",
             "--speculative-draft-model-path /srv/models/Kimi-K2.6-DFlash", "--speculative-dflash-block-size 8",
             *ddtree, "--cuda-graph-max-bs-decode 32",
             "--tp 8", "--attention-backend triton", "--trust-remote-code", "--disable-overlap-schedule",
             "--max-running-requests 32", "--host 0.0.0.0", "--port 30000", "--enable-metrics",
             "--api-key demo", "--tool-call-parser kimi_k2", "--reasoning-parser kimi_k2"]
    return " ".join(flags).split()


PARSE = ("import sys, json, os\n"
         "from sglang.srt.plugins import load_plugins; load_plugins()\n"
         "from sglang.srt.server_args import prepare_server_args\n"
         "from ddtree.sglang.plugin import validate_server_args\n"
         "a = prepare_server_args(json.loads(sys.argv[1]))\n"
         "validate_server_args(a)\n"
         "print(a.speculative_algorithm, os.environ['SGLANG_DDTREE_BUDGET'], os.environ['SGLANG_DDTREE_TOPK_CAP'],\n"
         "      a.attention_backend, a.tp_size, a.disable_overlap_schedule)\n")


def parse(args: list[str]) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-c", PARSE, json.dumps(args)], capture_output=True, text=True, timeout=300)
    return r


def test_the_rendered_production_command_line_parses():
    r = parse(rendered_production_args())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["DFLASH", "32", "8", "triton", "8", "True"]


def test_the_rendered_ddtree_command_line_parses_and_validates():
    r = parse(rendered_production_args("DDTREE"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["DDTREE", "32", "8", "triton", "8", "True"]


def test_the_rendered_flags_match_the_template():
    """The list above is the one tests/ansible asserts for the production render (kept in step)."""
    text = (ROOT / "tests" / "ansible" / "test_static.py").read_text()
    for flag in rendered_production_args("DDTREE"):
        if flag.startswith("--") and flag != "--api-key":
            assert flag in text


@pytest.mark.parametrize("change,message", [
    ({"--speculative-ddtree-budget": "0"}, "--speculative-ddtree-budget=0 is invalid"),
    ({"--speculative-ddtree-topk-cap": "64"}, "--speculative-ddtree-topk-cap=64 is invalid: expected 1..budget (32)"),
    ({"--disable-overlap-schedule": None}, "add --disable-overlap-schedule"),
    ({"--attention-backend": "trtllm_mla"}, "--attention-backend=trtllm_mla cannot verify a tree"),
])
def test_invalid_settings_are_rejected_with_the_plugins_message(change, message):
    args = rendered_production_args("DDTREE")
    for flag, value in change.items():
        i = args.index(flag)
        if value is None:
            del args[i]
        else:
            args[i + 1] = value
    r = parse(args)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]


def test_dflash_worker_v2_has_the_constructor_the_worker_relies_on():
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    params = inspect.signature(DFlashWorkerV2.__init__).parameters
    for name in ("server_args", "gpu_id", "nccl_port", "target_worker"):
        assert name in params, f"DFlashWorkerV2.__init__ lost '{name}' in this SGLang"
    from ddtree.sglang.worker import make_worker_class

    worker = make_worker_class()
    overridden = [n for n, v in vars(worker).items() if callable(v) and not n.startswith("__")]
    for name in overridden:  # every override must exist upstream with the same parameters
        assert hasattr(DFlashWorkerV2, name)
        assert inspect.signature(getattr(worker, name)).parameters.keys() == \
            inspect.signature(getattr(DFlashWorkerV2, name)).parameters.keys()


def test_the_worker_refuses_to_serve_until_its_decode_path_exists():
    from ddtree.sglang.worker import DDTreeNotReady, make_worker_class

    with pytest.raises(DDTreeNotReady, match="--speculative-algorithm DFLASH"):
        make_worker_class()(server_args=None, gpu_id=0, nccl_port=0, target_worker=None)


def test_target_verify_width_is_budget_plus_one_and_the_draft_keeps_its_block():
    r = fresh("from sglang.srt.plugins import load_plugins; load_plugins()\n"
              "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as S\n"
              "a = S.from_string('DDTREE')\n"
              "print(a.get_num_tokens_per_req_for_target_verify(8, False),"
              " a.get_num_tokens_per_req_for_target_verify(8, True))\n",
              env={"SGLANG_DDTREE_BUDGET": "48"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["49", "8"]


def test_the_commit_plan_of_a_chain_matches_dflash_accept_in_sglang():
    """Budget = L, cap 1 is the DFlash chain: our commit (tokens, lengths, bonus) equals SGLang's own
    greedy DFlash accept + _commit_accept on the same candidates and target predictions."""
    import torch
    from sglang.kernels.ops.speculative.dflash import compute_dflash_correct_drafts_and_bonus
    from sglang.srt.speculative.dflash_worker_v2 import _commit_accept

    from ddtree import build_tree
    from ddtree.sglang.glue import commit_plan
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

    from ddtree.sglang.glue import sampling_params_from_sglang

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

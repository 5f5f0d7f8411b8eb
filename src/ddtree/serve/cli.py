"""ddtree-serve: command line (flags mirror `sglang serve` where they overlap) and shutdown.

SIGTERM (and SIGINT): stop accepting connections, answer 503 on /health and /ready, finish the
in-flight requests, stop the batch worker, exit 0.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch
import uvicorn

from ddtree.reference.engine import Decoder
from ddtree.reference.pair import Pair, load_draft, load_target
from ddtree.serve.app import ServerSettings, create_app
from ddtree.settings import (DEFAULT_BUDGET, DEFAULT_TOPK_CAP, MAX_BUDGET, SERVER_FLAGS, DDTreeConfigError, Schedule,
                             parse_schedule, schedule_problems)

ALGORITHMS = {"DDTREE": "ddtree", "DFLASH": "dflash", "NONE": "ar"}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ddtree-serve", description="OpenAI-compatible server over the reference engine")
    ap.add_argument("--model-path", required=True, help="target directory (config.json, model.safetensors)")
    ap.add_argument("--speculative-draft-model-path", help="DFlash draft directory (needed unless NONE)")
    ap.add_argument("--speculative-algorithm", type=str.upper, choices=sorted(ALGORITHMS), default="DDTREE")
    ap.add_argument("--speculative-ddtree-budget", default=DEFAULT_BUDGET,
                    help=f"draft-tree nodes verified per step (1..{MAX_BUDGET}), or a schedule by running batch "
                         "size such as 1:64,8:32,32:8 (eager decoding only)")
    ap.add_argument("--speculative-ddtree-topk-cap", default=DEFAULT_TOPK_CAP,
                    help="candidate tokens per depth (1..budget), or a schedule by running batch size")
    ap.add_argument("--speculative-dflash-block-size", type=int, default=None,
                    help="must equal the draft's block size (read from its config.json when omitted)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--api-key", default=None,
                    help="prefer --config FILE with `api_key: ...`: a flag is visible in the process list")
    ap.add_argument("--previous-api-key", default=None,
                    help="a second key accepted beside --api-key while clients move to a new one (a key "
                         "rotation); only in --config FILE, like the key itself")
    ap.add_argument("--config", default=None,
                    help="YAML file of flags (keys = flag names, `-` or `_`), as `sglang serve --config`; "
                         "flags on the command line win. The deployment keeps the API key there.")
    ap.add_argument("--enable-metrics", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--max-running-requests", type=int, default=16)
    ap.add_argument("--max-queued-requests", type=int, default=256,
                    help="requests waiting for a batch slot; beyond it the server answers 503 with Retry-After")
    ap.add_argument("--max-request-bytes", type=int, default=1 << 20,
                    help="largest request body accepted; a larger one gets 400 before it is parsed")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--cuda-graph-max-bs-decode", type=int, default=None,
                    help="largest decode batch captured in a CUDA graph (buckets 1, 2, 4, ... up to it; "
                         "default 32); on the CPU decoding is eager")
    ap.add_argument("--cuda-graph-backend-decode", choices=["full", "breakable", "disabled"], default=None,
                    help="'disabled' turns decode CUDA graphs off (full and breakable both replay one "
                         "captured step per batch bucket in the reference engine)")
    ap.add_argument("--graceful-timeout", type=float, default=600.0,
                    help="seconds to wait for in-flight requests after SIGTERM")
    ap.add_argument("--log-level", default="info")
    # TEST ONLY (hidden): corrupt the emitted accepted path every N verify steps, so validation
    # tooling can be shown to catch a broken speculative path. The production server (sglang) has no such flag.
    ap.add_argument("--test-corrupt-accepted-path", type=int, default=0, help=argparse.SUPPRESS)
    return ap


def config_defaults(ap: argparse.ArgumentParser, path: str) -> dict:
    """The flags in a YAML config file as parser defaults: {dest: value}; an unknown key, a file that
    cannot be read or a non-mapping is an error naming the file and the key."""
    import yaml

    try:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as err:
        ap.error(f"--config {path}: cannot be read as YAML ({err})")
    if not isinstance(data, dict):
        ap.error(f"--config {path}: expected a mapping of flag names to values, got {type(data).__name__}")
    dests = {a.dest for a in ap._actions}
    out = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in dests or dest in ("config", "help"):
            ap.error(f"--config {path}: unknown key {key!r}; expected flag names of ddtree-serve such as api_key")
        out[dest] = value
    return out


def parse_args(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Command line over --config over defaults."""
    args = ap.parse_args(argv)
    if args.config:
        ap.set_defaults(**config_defaults(ap, args.config))
        args = ap.parse_args(argv)
    return args


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject settings that cannot work, naming the flag, the value and the fix (exit 2)."""
    if args.speculative_algorithm != "NONE" and not args.speculative_draft_model_path:
        ap.error(f"--speculative-algorithm {args.speculative_algorithm} needs --speculative-draft-model-path DIR "
                 "(or use --speculative-algorithm NONE)")
    read_schedules(ap, args)
    shape = schedule_problems(args.speculative_ddtree_budget, args.speculative_ddtree_topk_cap, None, SERVER_FLAGS)
    if shape:
        ap.error(shape[0])
    for flag in ("max_running_requests",
                 "cuda_graph_max_bs_decode", "max_queued_requests", "max_request_bytes"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            ap.error(f"--{flag.replace('_', '-')} {value} is invalid: expected an integer >= 1")
    if not 0 < args.port < 65536:
        ap.error(f"--port {args.port} is invalid: expected 1..65535")
    if args.previous_api_key and not args.api_key:
        ap.error("--previous-api-key is set without --api-key: a rotation keeps the new key as api-key and the old "
                 "one as previous-api-key")
    if args.previous_api_key and args.previous_api_key == args.api_key:
        ap.error("--previous-api-key equals --api-key: set previous-api-key to the key being retired, or remove it")


def read_schedules(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The budget and cap flags (a number, `1:64,8:32`, or already read) as Schedules, in place."""
    try:
        args.speculative_ddtree_budget = parse_schedule(args.speculative_ddtree_budget, SERVER_FLAGS.budget)
        args.speculative_ddtree_topk_cap = parse_schedule(args.speculative_ddtree_topk_cap, SERVER_FLAGS.topk_cap)
    except DDTreeConfigError as err:
        ap.error(str(err))


def shown(schedule: Schedule) -> int | str:
    """What /server_info says: the one value as a number, a schedule as it is written."""
    return schedule.steps[0][1] if len(schedule.steps) == 1 else str(schedule)


def graph_buckets(max_bs: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to max_bs (max_bs itself included)."""
    out, b = [], 1
    while b < max_bs:
        out.append(b)
        b *= 2
    return tuple(out + [max_bs])


def load(args: argparse.Namespace, ap: argparse.ArgumentParser) -> tuple[Decoder, ServerSettings]:
    read_schedules(ap, args)
    dtype = DTYPES[args.dtype]
    try:
        target, tokenizer = load_target(args.model_path, device=args.device, dtype=dtype)
        if args.speculative_algorithm == "NONE":
            # the decoder needs a draft object only for the speculative methods
            draft = None
        else:
            draft = load_draft(args.speculative_draft_model_path, target, device=args.device, dtype=dtype)
    except (FileNotFoundError, ValueError) as err:
        ap.error(str(err))
    block = draft.config.block_size if draft is not None else 1
    if args.speculative_dflash_block_size not in (None, block):
        ap.error(f"--speculative-dflash-block-size {args.speculative_dflash_block_size} does not match the "
                 f"draft's block_size {block}: omit the flag or use {block}")
    if args.speculative_algorithm == "DDTREE":
        fit = schedule_problems(args.speculative_ddtree_budget, args.speculative_ddtree_topk_cap, block, SERVER_FLAGS)
        if fit:
            ap.error(fit[0])
    pair = Pair(target=target, draft=draft, tokenizer=tokenizer)
    graphs = args.cuda_graph_backend_decode != "disabled" and args.device.startswith("cuda")
    try:
        decoder = Decoder(pair, ALGORITHMS[args.speculative_algorithm], args.speculative_ddtree_budget,
                          args.speculative_ddtree_topk_cap, corrupt_every=args.test_corrupt_accepted_path,
                          cuda_graphs=graphs, graph_buckets=graph_buckets(args.cuda_graph_max_bs_decode or 32))
    except ValueError as err:                  # a schedule under graphs
        ap.error(f"--speculative-ddtree-budget {args.speculative_ddtree_budget}: {err}")
    if args.cuda_graph_max_bs_decode and not graphs:
        logging.getLogger("ddtree.serve").info("CUDA graphs requested but device=%s: decoding eagerly", args.device)
    settings = ServerSettings(
        model_path=args.model_path, draft_model_path=args.speculative_draft_model_path,
        speculative_algorithm=args.speculative_algorithm, budget=shown(decoder.schedule.budget),
        topk_cap=shown(decoder.schedule.topk_cap),
        block_size=block, host=args.host, port=args.port, api_key=args.api_key,
        previous_api_key=args.previous_api_key,
        enable_metrics=args.enable_metrics, device=args.device, dtype=args.dtype,
        max_running_requests=args.max_running_requests, max_queued_requests=args.max_queued_requests,
        max_request_bytes=args.max_request_bytes, served_model_name=args.served_model_name or args.model_path,
        context_length=target.config.max_position_embeddings, cuda_graph=graphs)
    return decoder, settings


class DrainingServer(uvicorn.Server):
    """Marks the app as draining as soon as a shutdown signal arrives; exits 0 after draining.

    uvicorn (>= 0.29) re-raises the captured signal after its graceful shutdown, which would end
    the process with -SIGTERM; a drained shutdown is an orderly stop, so the list is cleared.
    """

    def handle_exit(self, sig, frame):
        self.config.app.state.draining = True
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = parse_args(ap, argv)
    check_args(ap, args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    decoder, settings = load(args, ap)
    app = create_app(settings, decoder, decoder.pair.tokenizer)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.graceful_timeout)
    DrainingServer(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real `sglang serve` processes on the GPU test bed, one per configuration, and a small client
(used by tests/gpu_sglang and bench/sglang_e2e.py).

Servers are started in parallel (one port each, on 127.0.0.1), share the GPU through a fixed KV
pool (--max-total-tokens) and are stopped by their PID. Requests send token ids
(--skip-tokenizer-init): the pair's tokenizer is the project's byte tokenizer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

GRAPH_MAX_BS = 8
FORWARD_SECONDS = re.compile(r'^sglang:forward_execution_seconds_total\{[^}]*category="([a-z_]+)"[^}]*\} ([0-9.e+-]+)$',
                             re.MULTILINE)
PREFILL_CATEGORIES = {"extend", "split_prefill"}
# SGLang's forward device timer (forward_seconds); Python's traceback of every thread if a kernel crashes the process
SERVER_ENV = {"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1", "PYTHONFAULTHANDLER": "1"}
# the radix cache on the test bed: the Python tree core (the Rust one's binding misreads torch 2.11's int64),
# and SGLang's idle-time pool check raising instead of warning, so a leaked KV slot stops the server
RADIX_ENV = (("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python"), ("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE", "1"))
MAX_NEW_TOKENS = 128
# DDTREE's step dump (ddtree.sglang.diagnostics.step_dump): "auto" = the server's own folder beside its log, dumps/<name>
DUMP_ENV, DUMP_AUTO = "SGLANG_DDTREE_DUMP", "auto"
# a made-up step cost table under which the width policy speculates at one running request (every width 1 ms) and not
# at two or more (a verify of width w > 1 costs 1 + 2 x batch x w ms, of width 1 1 + 0.1 x batch; the draft 0.1 ms):
# its steps without speculation then run, beside a speculative one every 16 (issue 70)
STEEP_COSTS = Path(__file__).resolve().parent / "costs-steep.json"


@dataclass(frozen=True)
class ServerConfig:
    name: str
    algorithm: str                       # NONE, DFLASH or DDTREE
    budget: int | str | None = None          # one value, or a schedule by running batch size ("1:64,3:32")
    cap: int | str | None = None
    graphs: bool = True
    extra: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()    # added to the server's environment
    tp: int = 1                              # tensor-parallel ranks (GPUs 0 .. tp-1)
    draft: str = "draft"                     # the draft's folder in the pair (draft16: the block-16 draft)
    target: str = "target"                   # the target's folder (target-wrapper: the Kimi wrapper; target-int4)
    radix: bool = False                      # the radix cache on (SGLang's default; the matrix runs without it)
    attention: str = "triton"                # --attention-backend
    tokenizer: bool = False                  # the server tokenizes (its grammar backend needs the tokenizer)
    overlap: bool = False                    # SGLang's overlap scheduler on (its default; off in the matrix)
    max_bs: int = GRAPH_MAX_BS               # running requests and decode graphs up to this batch
    max_total_tokens: int = 16384            # the KV pool

    def args(self, pair: Path, port: int) -> list[str]:
        # --sleep-on-idle: an idle scheduler otherwise spins a core, and servers started together
        # would take CPU from the one being measured (seen on the H200 machine's 16 cores)
        a = ["--model-path", str(pair / self.target), *([] if self.tokenizer else ["--skip-tokenizer-init"]),
             "--attention-backend", self.attention,
             "--host", "127.0.0.1", "--port", str(port), "--mem-fraction-static", "0.88",
             "--max-total-tokens", str(self.max_total_tokens), "--context-length", "1024",
             "--max-running-requests", str(self.max_bs), *([] if self.radix else ["--disable-radix-cache"]),
             "--enable-metrics", *([] if self.overlap else ["--disable-overlap-schedule"]),
             "--cuda-graph-backend-prefill", "disabled", "--sleep-on-idle",
             # SGLang 0.5.23 otherwise picks a free port for its process group at start-up, which a server started
             # later in the same job then finds taken (H200 2026-12-04: "address already in use" on a fleet port)
             "--nccl-port", str(port + NCCL_PORT_OFFSET)]
        a += (["--cuda-graph-max-bs-decode", str(self.max_bs)] if self.graphs
              else ["--cuda-graph-backend-decode", "disabled"])
        if self.tp > 1:   # all-reduce through NCCL (the test bed's kernel build carries no custom all-reduce)
            a += ["--tp-size", str(self.tp), "--disable-custom-all-reduce"]
        if self.algorithm == "DFLASH":
            a += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(pair / self.draft)]
        elif self.algorithm == "DDTREE":
            a += ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", str(pair / self.draft),
                  "--speculative-ddtree-budget", str(self.budget), "--speculative-ddtree-topk-cap", str(self.cap)]
        return a + list(self.extra)


NCCL_PORT_OFFSET = 50     # a fleet's servers take base + 0, 2, ... 48; their process groups base + 50 ... 98
# SGLang 0.5.23 picks the ports it is not given from 22000-29999 (get_free_port_below_ephemeral); the kernel hands the
# ports from ip_local_port_range's low end up to outgoing connections (every health poll, NCCL store and ZMQ socket of
# 20-30 servers): a listener there finds its port taken now and then (H200 2026-12-05: 7 of 29 servers, ports
# 42002-43062, "address already in use"). A test bed's servers listen below both.
SGLANG_OWN_PORTS = range(22000, 30000)


def ephemeral_ports() -> range:
    """The kernel's ephemeral port range on this machine (Linux's default 32768-60999 where it cannot be read)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def check_port(port: int, what: str = "port") -> None:
    """Refuse a listener port that another process may take first: SGLang's own picks or the ephemeral range."""
    ephemeral = ephemeral_ports()
    if not 1024 <= port < 65536:
        raise ValueError(f"{what} {port} is not a port a test server can listen on (1024-65535 without root's "
                         "privileged ports): take a port base between 10000 and 21900")
    if port in SGLANG_OWN_PORTS:
        raise ValueError(f"{what} {port} is in {SGLANG_OWN_PORTS.start}-{SGLANG_OWN_PORTS.stop - 1}, where SGLang "
                         "picks its own free ports: take a port base below 21900 (or 30000 up to the ephemeral range)")
    if port in ephemeral:
        raise ValueError(f"{what} {port} is in this machine's ephemeral range {ephemeral.start}-{ephemeral.stop - 1} "
                         "(/proc/sys/net/ipv4/ip_local_port_range), which outgoing connections take at random: take a "
                         "port base between 10000 and 21900")


def auto_budget(word: str) -> str:
    """A name's width-policy word as the budget flag takes it: auto -> auto, auto_8_16 -> auto:8,16."""
    budgets = word.split("_")[1:]
    return "auto" + (":" + ",".join(budgets) if budgets else "")


def ddtree(budget: int, cap: int, graphs: bool = True) -> ServerConfig:
    return ServerConfig(f"ddtree-b{budget}-c{cap}-{'graphs' if graphs else 'eager'}", "DDTREE", budget, cap, graphs)


PROFILE_SUFFIX = "-profile"
PROFILE_STEPS = 40      # decode steps per logged line of a profiled server (ddtree.sglang.diagnostics.profile)
# constrained decoding servers: at most 2 white-space characters in a row in JSON output, so that a greedy
# answer ends inside max_new_tokens (xgrammar's default lets JSON white space run on)
# and Kimi K2's tool-call parser, as production serves it (without a parser SGLang 0.5.23 returns no tool_calls)
GRAMMAR_ARGS = ("--constrained-json-max-whitespace-cnt", "2", "--tool-call-parser", "kimi_k2")
# name suffixes, in this order after the base name: the block-16 draft, the Kimi wrapper's target (its
# text-only processor stand-in is remote code), the INT4-expert target, SGLang's Triton MoE runner instead
# of its default (Marlin for INT4 on Hopper and sm_120), FlashInfer attention, the radix cache, SGLang's
# deterministic (batch-invariant) kernels, custom logit processors, constrained decoding,
# the overlap scheduler, the sync check, 48 running requests, TP 2, the step profiler
SUFFIXES = {
    "-k16": lambda c: replace(c, draft="draft16"),
    "-wrapper": lambda c: replace(c, target="target-wrapper", extra=c.extra + ("--trust-remote-code",)),
    "-int4": lambda c: replace(c, target="target-int4"),
    "-moetriton": lambda c: replace(c, extra=c.extra + ("--moe-runner-backend", "triton")),
    "-flashinfer": lambda c: replace(c, attention="flashinfer"),
    "-radix": lambda c: replace(c, radix=True, env=c.env + RADIX_ENV),
    "-det": lambda c: replace(c, extra=c.extra + ("--enable-deterministic-inference",)),
    "-clp": lambda c: replace(c, extra=c.extra + ("--enable-custom-logit-processor",)),
    "-grammar": lambda c: replace(c, tokenizer=True, extra=c.extra + GRAMMAR_ARGS),
    "-overlap": lambda c: replace(c, overlap=True),
    "-synccheck": lambda c: replace(c, env=c.env + (("SGLANG_DDTREE_SYNC_CHECK", "warn"),)),
    "-bs48": lambda c: replace(c, max_bs=48, max_total_tokens=65536),
    "-tp2": lambda c: replace(c, tp=2),
    "-dump": lambda c: replace(c, env=c.env + ((DUMP_ENV, DUMP_AUTO),)),
    "-tok": lambda c: replace(c, tokenizer=True),
    "-fault": lambda c: replace(c, env=c.env + (("SGLANG_DDTREE_FAULT", "sibling"),)),
    "-stalepen": lambda c: replace(c, env=c.env + (("SGLANG_DDTREE_FAULT", "stale-penalties"),)),
    "-dropleaf": lambda c: replace(c, env=c.env + (("SGLANG_DDTREE_FAULT", "drop-leaf"),)),
    "-steepcost": lambda c: replace(c, env=c.env + (("SGLANG_DDTREE_COST_TABLE", str(STEEP_COSTS)),
                                                    ("SGLANG_DDTREE_COST_LEARN", "0"))),
    PROFILE_SUFFIX: lambda c: replace(c, env=c.env + (("SGLANG_DDTREE_PROFILE_STEPS", str(PROFILE_STEPS)),)),
}


def config(name: str) -> ServerConfig:
    """A configuration by name: none, dflash, ddtree-b<budget>-c<cap>-<graphs|eager> or the width policy
    ddtree-auto[_B1_B2..]-c<cap>-<graphs|eager> (budget auto[:B1,B2,..]), then any of
    -k16 (the pair's block-16 draft), -wrapper (the KimiK25 wrapper's target), -int4 (INT4 routed experts),
    -moetriton (SGLang's Triton MoE runner), -flashinfer (FlashInfer attention), -radix (the radix cache), -det
    (--enable-deterministic-inference), -clp (custom logit processors enabled), -overlap (SGLang's overlap
    scheduler on), -synccheck (DDTREE's steps under torch's sync debug mode, warn),
    -bs48 (48 running requests, decode graphs up to 48, a KV pool of 65,536 tokens), -grammar (the server tokenizes, JSON white space bounded, Kimi K2's tool-call parser),
    -tp2 (tensor parallel on 2 GPUs), -dump (DDTREE writes every step's tree, verify logits and prefix KV to
    Server.dump_dir), -fault (a deliberate tree-mask fault: nodes see their earlier siblings), -stalepen (a deliberate
    penalty fault: every node penalised with the step start's counts), -steepcost (the width policy priced by
    STEEP_COSTS alone, nothing learnt from its measured steps, so that its steps without speculation run at 2+
    requests), -tok (the server loads
    the pair's tokenizer: SGLang refuses min_new_tokens, stop strings and grammars without one), -profile (DDTREE's step profiler on), in that order: e.g.
    ddtree-b64-c8-graphs-k16-tp2, none-int4-moetriton."""
    for suffix, change in reversed(SUFFIXES.items()):
        if name.endswith(suffix):
            base = config(name[: -len(suffix)])
            if suffix == PROFILE_SUFFIX and base.algorithm != "DDTREE":
                raise ValueError(f"configuration {name!r} is invalid: only DDTREE servers have the step profiler")
            return replace(change(base), name=name)
    if name in CONFIGS:
        return CONFIGS[name]
    parts = name.split("-")
    if len(parts) == 4 and parts[0] == "ddtree" and parts[3] in ("graphs", "eager") and parts[1].startswith("auto"):
        return replace(ddtree(0, int(parts[2][1:]), parts[3] == "graphs"), name=name, budget=auto_budget(parts[1]))
    if len(parts) == 4 and parts[0] == "ddtree" and parts[3] in ("graphs", "eager"):
        return ddtree(int(parts[1][1:]), int(parts[2][1:]), parts[3] == "graphs")
    raise ValueError(f"configuration {name!r} is invalid: expected none, dflash or ddtree-b<budget>-c<cap>-graphs|eager"
                     f", then any of {', '.join(SUFFIXES)}")


# The matrix of issue 18: NONE and DFLASH references, DDTREE at budgets 8/32/64 x caps 1/4/8 with
# graphs on and off, and the chain (budget = block - 1, cap 1), which must equal DFLASH.
NONE = ServerConfig("none", "NONE")
DFLASH = ServerConfig("dflash", "DFLASH")
CHAIN = ddtree(7, 1)
MATRIX = [ddtree(b, c, g) for g in (True, False) for b in (8, 32, 64) for c in (1, 4, 8)]
# a budget / cap schedule that changes width three times inside the test bed's 1..8 running requests (issue 32)
SCHEDULE_BUDGET, SCHEDULE_CAP = "1:64,3:32,5:16,7:8", "1:8,5:4"
SCHEDULED = [ServerConfig(f"ddtree-sched-{'graphs' if g else 'eager'}", "DDTREE", SCHEDULE_BUDGET, SCHEDULE_CAP, g)
             for g in (True, False)]
CONFIGS = {c.name: c for c in [NONE, DFLASH, CHAIN, *MATRIX, *SCHEDULED]}
# started first on a fresh machine: they build the JIT caches the others then reuse
WARM = ("none", "dflash", "ddtree-b32-c8-graphs", "ddtree-b32-c8-eager", CHAIN.name)


def stop_group(proc: subprocess.Popen | None, timeout: float) -> None:
    """End a server started in a session of its own: SIGTERM to the group whose leader is our child
    (scheduler and detokenizer included), SIGKILL after `timeout` seconds. By PID, never by name."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class Server:
    config: ServerConfig
    port: int
    log: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    ready_after: float | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        check_port(self.port, f"{self.config.name}'s port")
        check_port(self.port + NCCL_PORT_OFFSET, f"{self.config.name}'s process-group port (its port + {NCCL_PORT_OFFSET})")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def dump_dir(self) -> Path:
        """Where a -dump server writes its steps (step_dump.py)."""
        return self.log.parent / "dumps" / self.config.name

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **SERVER_ENV, **dict(self.config.env)}
        if env.get(DUMP_ENV) == DUMP_AUTO:
            env[DUMP_ENV] = str(self.dump_dir)
        return env

    def start(self, pair: Path) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "sglang.launch_server", *self.config.args(pair, self.port)]
        self.started = time.monotonic()
        with open(self.log, "w") as out:
            # a session of its own: stop() ends the server's process group (scheduler, detokenizer) by PID
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=self.environment())

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        self.ready_after = time.monotonic() - self.started
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        return False

    def stop(self) -> None:
        stop_group(self.proc, 30)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def exit_message(self) -> str:
        lines = [ln for ln in self.log_text().splitlines() if "Error" in ln or "error" in ln]
        return lines[-1] if lines else self.log_text()[-400:]

    # --- requests -----------------------------------------------------------------------------

    def generate(self, input_ids, sampling: dict, timeout: float = 600, **extra):
        body = {"input_ids": input_ids, "sampling_params": sampling, **extra}
        req = urllib.request.Request(f"{self.url}/generate", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:
            return {"http_status": err.code, "error": err.read().decode(errors="replace")}

    def next_top(self, context: list[int], k: int = 5) -> dict[int, float]:
        """The k best next tokens after `context` at temperature 0 and their log-probs (token -> log-prob)."""
        r = self.generate(context, greedy(1), return_logprob=True, top_logprobs_num=k)
        return top_dict(r["meta_info"]["output_top_logprobs"][0])

    def complete_all(self, prompts: list[list[int]], sampling: dict, concurrency: int) -> list[dict]:
        """One request per prompt, `concurrency` in flight at a time (1 = one after another)."""
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(lambda p: self.generate(p, sampling), prompts))

    def torch_trace(self, outdir: Path, prompt: list[int], sampling: dict, steps: int,
                    decoding_after: float | None = None) -> list[Path]:
        """SGLang's own torch-profiler trace (/start_profile, CPU + GPU) of the next `steps` forward steps,
        driven by one request; returns the trace files written under outdir. With `decoding_after` (seconds) the
        request is sent first and the profile started that long after, so that its steps are decode steps only (the
        request must still be decoding then: give it tokens enough)."""
        outdir.mkdir(parents=True, exist_ok=True)
        body = {"output_dir": str(outdir), "num_steps": steps, "activities": ["CPU", "GPU"]}
        req = urllib.request.Request(f"{self.url}/start_profile", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})

        def start_profile() -> None:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()

        if decoding_after is None:
            start_profile()
            self.generate(prompt, sampling)
        else:
            with ThreadPoolExecutor(max_workers=1) as pool:
                answer = pool.submit(self.generate, prompt, sampling)
                time.sleep(decoding_after)
                start_profile()
                answer.result()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(outdir.rglob("*.json*")):
            time.sleep(1)
        return sorted(outdir.rglob("*.json*"))

    def forward_seconds(self) -> float | None:
        """SGLang's own device time of the decode-side forward passes so far (graph replays of decode,
        target verify and the DFlash draft; prefill left out): sglang:forward_execution_seconds_total,
        which 0.5.23 keeps when SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 (set for every server here)."""
        total, seen = 0.0, False
        for m in FORWARD_SECONDS.finditer(self.metrics()):
            seen = True
            if m.group(1) not in PREFILL_CATEGORIES:
                total += float(m.group(2))
        return total if seen else None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as r:
            return r.read().decode()


def top_dict(entries: list) -> dict[int, float]:
    """One position of SGLang's output_top_logprobs ([logprob, token, text?] each) as token -> log-prob."""
    return {int(token): float(logprob) for logprob, token, *_ in entries}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Where two token lists first differ: None when they are equal, else the first differing index, or the
    shorter one's length when it is a prefix of the other."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def greedy(max_new_tokens: int = MAX_NEW_TOKENS) -> dict:
    return {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}


class Fleet:
    """Servers by configuration name, started in parallel on consecutive ports."""

    def __init__(self, pair: Path, logdir: Path, base_port: int = 31000):
        self.pair, self.logdir, self.base_port = pair, logdir, base_port
        self.servers: dict[str, Server] = {}

    def start(self, names, timeout: float) -> dict[str, bool]:
        """Start the servers named (configuration names, or ServerConfig for one no name describes, e.g. a
        schedule found by a sweep) that are not running yet; wait for them; ready or not, by name."""
        fresh = [n if isinstance(n, ServerConfig) else config(n) for n in names
                 if (n.name if isinstance(n, ServerConfig) else n) not in self.servers]   # a caller's own kept
        if 2 * (len(self.servers) + len(fresh)) > NCCL_PORT_OFFSET:
            raise ValueError(f"{len(self.servers) + len(fresh)} servers are too many for one fleet: its ports would "
                             f"reach its process-group ports (base + {NCCL_PORT_OFFSET}); split them over two fleets")
        for c in fresh:
            port = self.base_port + 2 * len(self.servers)
            self.servers[c.name] = Server(c, port, self.logdir / f"sglang-{c.name}.log")
            self.servers[c.name].start(self.pair)
        fresh = [c.name for c in fresh]
        with ThreadPoolExecutor(max_workers=max(1, len(fresh))) as pool:
            ready = dict(zip(fresh, pool.map(lambda n: self.servers[n].wait_ready(timeout), fresh)))
        return ready

    def get(self, name: str, timeout: float = 600) -> Server:
        if name not in self.servers:
            self.start([name], timeout)
        return self.servers[name]

    def stop(self, name: str) -> None:
        """Stop one server; its entry (and so its ports) stays taken, so a later server never reuses them."""
        self.servers[name].stop()

    def stop_all(self) -> None:
        for s in self.servers.values():
            s.stop()


def probe_servers(servers: dict[str, "Server"], timeout: float, ask) -> list[dict]:
    """A probe's rows (bench/mla_probe.py, bench/kimi_probe.py): wait for each started server within
    one shared deadline, then ask(name, server, row) fills its row; a server that did not start, or an
    ask that raises, is an error in its row and the probe goes on; every server is stopped at the end."""
    t0, rows = time.monotonic(), []
    try:
        for name, s in servers.items():
            ok = s.wait_ready(max(1.0, timeout - (time.monotonic() - t0)))
            row = {"server": name, "healthy_after_s": round(s.ready_after, 1) if ok else None, "errors": []}
            if not ok:
                row["errors"].append(s.exit_message()[-600:])
            else:
                try:
                    ask(name, s, row)
                except Exception as err:       # a probe: report what broke and go on
                    row["errors"].append(f"{type(err).__name__}: {str(err)[:300]}")
            rows.append(row)
    finally:
        for s in servers.values():
            s.stop()
    return rows

"""Client of the local k26-ddtree service for the verify role and the sweep (standard library only).

  python3 k26_client.py smoke URL MODEL MAX_TOKENS PROMPT
      temperature 0 twice (must match), then 0.7 (must answer); prints one JSON line. An answer's
      text is its reasoning (a server with a reasoning parser returns it apart) and its content.
      No request carries a seed: a DDTREE server refuses a seed above temperature 0.
  python3 k26_client.py load URL MODEL MAX_TOKENS CONCURRENCY TEMPERATURE
      a fixed prompt set with CONCURRENCY parallel requests; prints tokens/s and accept length as
      the client sees them and as the server's own /metrics counters say (generated tokens and
      verify steps over the load), latency p50/p95 and errors as one JSON line
  python3 k26_client.py validate URL PROMPTS_JSON MAX_TOKENS CONCURRENCY [TOP_LOGPROBS]
      every prompt at temperature 0 through the native /generate route with token ids (one at a
      time; with TOP_LOGPROBS > 0, default 0, also the top log-probs of each step: validate.yml
      asks the NONE reference only, whose log-probs decide near ties, since a DDTREE server does
      not serve log-probs), then again with CONCURRENCY in parallel for tokens/s, and the
      time to first token of a streamed completion; prints one JSON document
  python3 k26_client.py get URL PATH
      one authenticated GET (e.g. /model_info); prints the JSON body
The API key is read from the server's config file named by K26_CONFIG_FILE (its `api-key:` line,
a JSON string), never from the command line or the environment.
"""

import json
import os
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PROMPTS = [
    "Write a Python function that reverses a linked list.",
    "What is 17 times 23? Show the steps.",
    "Summarise the plot of Hamlet in two sentences.",
    "Explain speculative decoding to a new engineer.",
    "List three uses of a hash map.",
    "Translate 'good morning, how are you?' into French.",
    "def fibonacci(n):",
    "Write a haiku about GPUs.",
]


def api_key() -> str:
    """The key in the config file K26_CONFIG_FILE (`api-key: "..."`); empty without one."""
    path = os.environ.get("K26_CONFIG_FILE")
    if not path:
        return ""
    with open(path) as fh:
        for line in fh:
            if line.startswith("api-key:"):
                return json.loads(line.split(":", 1)[1].strip())
    return ""


def headers() -> dict:
    return {"content-type": "application/json", "authorization": "Bearer " + api_key()}


def request(url: str, path: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST", headers=headers())


def get(url: str, path: str) -> None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers()), timeout=60) as resp:
            print(json.dumps(json.load(resp)))
    except urllib.error.HTTPError as err:
        sys.exit(f"GET {path}: HTTP {err.code}: {err.read().decode(errors='replace')[:500]}")


def post_json(url: str, path: str, body: dict, timeout: float) -> dict:
    """POST a JSON body; the response plus its wall time, or {'error': ...} (never raises)."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request(url, path, body), timeout=timeout) as resp:
            out = json.load(resp)
    except urllib.error.HTTPError as err:
        return {"error": f"HTTP {err.code}: {err.read().decode(errors='replace')[:1500]}",
                "seconds": time.perf_counter() - t0}
    except (urllib.error.URLError, OSError, ValueError) as err:
        return {"error": str(err)[:300], "seconds": time.perf_counter() - t0}
    out["seconds"] = time.perf_counter() - t0
    return out


def chat(url: str, model: str, max_tokens: int, prompt: str, temperature: float) -> dict:
    """One chat completion; returns the response plus its wall time, or {'error': ...}."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": temperature, "return_spec_tokens_details": True}
    return post_json(url, "/v1/chat/completions", body, 600)


def answer_text(out: dict) -> str:
    """The whole generated text of a chat answer: a server started with a reasoning parser (Kimi
    K2.6's kimi_k2) returns the reasoning apart from the content, and a short answer of a thinking
    model may be reasoning only (content null)."""
    message = out["choices"][0]["message"]
    return (message.get("reasoning_content") or "") + (message.get("content") or "")


def accept_length(out: dict):
    return out.get("sglext", {}).get("spec_tokens_details", {}).get("spec_accept_length")


def smoke(url: str, model: str, max_tokens: int, prompt: str) -> None:
    answers = [chat(url, model, max_tokens, prompt, t) for t in (0.0, 0.0, 0.7)]
    failed = [a["error"] for a in answers if "error" in a]
    if failed:
        sys.exit(f"smoke request failed: {failed[0]}")
    texts = [answer_text(a) for a in answers]
    tokens = [a["usage"]["completion_tokens"] for a in answers]
    print(json.dumps({"texts": texts, "tokens": tokens, "tokens_per_s": round(tokens[0] / answers[0]["seconds"], 1),
                      "accept_length": accept_length(answers[0])}))
    if min(tokens) == 0:
        sys.exit(f"an answer was empty: {texts}")
    if texts[0] != texts[1]:
        sys.exit(f"temperature 0 is not deterministic: {texts[0]!r} then {texts[1]!r}")


COUNTERS = ("sglang:generation_tokens_total", "sglang:spec_verify_calls_total")
# SGLang's latency histograms: the sweep measures the alerts' TTFT and inter-token bounds from them (issue 49)
HISTOGRAMS = {"ttft": "sglang:time_to_first_token_seconds_bucket", "itl": "sglang:inter_token_latency_seconds_bucket"}
LE = re.compile(r'le="([^"]+)"')


def counters(url: str) -> dict:
    """The server's own token and verify-step counters and its latency histograms' buckets from /metrics,
    summed over their label sets (SGLang labels them by model, rank and streaming): {name: total} and
    {(histogram, upper bound): count}; {} when /metrics does not answer."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    totals: dict = dict.fromkeys(COUNTERS, 0.0)
    buckets = {name: short for short, name in HISTOGRAMS.items()}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS:
            totals[name] += float(line.rsplit(" ", 1)[1])
        elif name in buckets and LE.search(line):
            key = (buckets[name], float(LE.search(line).group(1)))
            totals[key] = totals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def quantile(q: float, counts: dict[float, float]) -> float | None:
    """Prometheus's histogram_quantile over cumulative bucket counts {upper bound: count}: linear inside the
    bucket the rank falls in (the lowest bucket from 0; a rank in +Inf gives the highest finite bound)."""
    bounds = sorted(counts)
    if not bounds or counts[bounds[-1]] <= 0:
        return None
    rank, lower, below = q * counts[bounds[-1]], 0.0, 0.0
    for bound in bounds:
        if counts[bound] >= rank:
            if bound == float("inf"):
                return lower
            inside = counts[bound] - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, counts[bound]
    return lower


def latency_p95(before: dict, after: dict, short: str) -> float | None:
    """The 95th percentile of one histogram over the load (the difference of its buckets)."""
    grown = {key[1]: after[key] - before.get(key, 0.0) for key in after if isinstance(key, tuple) and key[0] == short}
    value = quantile(0.95, grown)
    return round(value, 4) if value is not None else None


def server_side(before: dict, after: dict, wall: float) -> dict:
    """Tokens/s and accept length (generated tokens per verify step, SGLang's definition) from the
    server's counters over the load; accept length None without verify steps (no speculation); the
    95th-percentile TTFT and inter-token latency from its histograms (None where it exports none)."""
    if not before or not after:
        return {"server_tokens_per_s": None, "server_accept_length": None, "ttft_p95_s": None, "itl_p95_s": None}
    tokens = after[COUNTERS[0]] - before[COUNTERS[0]]
    steps = after[COUNTERS[1]] - before[COUNTERS[1]]
    return {"server_tokens_per_s": round(tokens / wall, 1),
            "server_accept_length": round(tokens / steps, 3) if steps > 0 else None,
            "ttft_p95_s": latency_p95(before, after, "ttft"), "itl_p95_s": latency_p95(before, after, "itl")}


def load(url: str, model: str, max_tokens: int, concurrency: int, temperature: float) -> None:
    chat(url, model, 4, PROMPTS[0], temperature)  # warm-up
    before = counters(url)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        # every worker gets a request: the prompt set repeated up to the concurrency
        prompts = PROMPTS * -(-concurrency // len(PROMPTS))
        results = list(pool.map(lambda p: chat(url, model, max_tokens, p, temperature), prompts))
    wall = time.perf_counter() - t0
    after = counters(url)
    ok = [r for r in results if "error" not in r]
    lat = sorted(r["seconds"] for r in ok) or [0.0]
    accept = [a for a in map(accept_length, ok) if a is not None]
    print(json.dumps({
        "temperature": temperature, "concurrency": concurrency, "requests": len(results),
        "errors": len(results) - len(ok),
        "tokens_per_s": round(sum(r["usage"]["completion_tokens"] for r in ok) / wall, 1),
        "accept_length": round(statistics.mean(accept), 3) if accept else None,
        **server_side(before, after, wall),
        "latency_p50_s": round(lat[len(lat) // 2], 3),
        "latency_p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 3),
    }))


def native(url: str, text: str, max_tokens: int, top: int) -> dict:
    """SGLang's native /generate at temperature 0, with token ids and top-k log-probs."""
    body = {"text": text, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0},
            "return_logprob": top > 0, "top_logprobs_num": top}
    return post_json(url, "/generate", body, 1800)


def first_token_seconds(url: str, text: str) -> float | None:
    body = {"prompt": text, "max_tokens": 8, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request(url, "/v1/completions", body), timeout=600) as resp:
            for line in resp:
                if line.startswith(b"data: ") and b'"text"' in line:
                    return time.perf_counter() - t0
    except (urllib.error.URLError, OSError):
        return None
    return None


def validate(url: str, prompts_file: str, max_tokens: int, concurrency: int, top_logprobs: int = 0) -> None:
    prompts = json.load(open(prompts_file))
    per_prompt = []
    t0 = time.perf_counter()
    for p in prompts:  # concurrency 1: the token ids compared across configurations (and the reference's log-probs)
        out = native(url, p["text"], max_tokens, top_logprobs)
        meta = out.get("meta_info", {})
        per_prompt.append({"id": p["id"], "error": out.get("error"), "output_ids": out.get("output_ids", []),
                           "top": [[[i, lp] for lp, i, _ in top] for top in meta.get("output_top_logprobs") or []],
                           "accept_length": meta.get("spec_accept_length"), "verify_ct": meta.get("spec_verify_ct")})
    wall1 = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        burst = list(pool.map(lambda p: native(url, p["text"], max_tokens, 0), prompts))
    wall_n = time.perf_counter() - t0
    ttft = [t for t in (first_token_seconds(url, p["text"]) for p in prompts[:5]) if t is not None]
    ok = [p for p in per_prompt if not p["error"]]
    print(json.dumps({
        "prompts": per_prompt,
        "errors": sum(1 for p in per_prompt if p["error"]) + sum(1 for b in burst if "error" in b),
        "tokens_per_s_c1": round(sum(len(p["output_ids"]) for p in ok) / wall1, 1),
        "tokens_per_s_cn": round(sum(len(b.get("output_ids", [])) for b in burst) / wall_n, 1),
        "concurrency": concurrency,
        "ttft_p50_s": round(statistics.median(ttft), 4) if ttft else None,
    }))


def main(argv: list[str]) -> None:
    if len(argv) == 6 and argv[1] == "smoke":
        smoke(argv[2], argv[3], int(argv[4]), argv[5])
    elif len(argv) == 7 and argv[1] == "load":
        load(argv[2], argv[3], int(argv[4]), int(argv[5]), float(argv[6]))
    elif len(argv) == 4 and argv[1] == "get":
        get(argv[2], argv[3])
    elif len(argv) in (6, 7) and argv[1] == "validate":
        validate(argv[2], argv[3], int(argv[4]), int(argv[5]), int(argv[6]) if len(argv) == 7 else 0)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)

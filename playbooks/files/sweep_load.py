"""Fixed prompt set against the local service at one temperature and concurrency; prints one JSON line.

Usage: python3 sweep_load.py URL MODEL MAX_TOKENS CONCURRENCY TEMPERATURE   (K26_API_KEY in the environment)
Standard library only (runs on the host). Records aggregate tokens/s, mean tokens per verify step
(accept length), latency p50/p95 and errors.
"""

import json
import os
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


def one(url: str, model: str, max_tokens: int, temperature: float, prompt: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": temperature, "return_spec_tokens_details": True}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + os.environ.get("K26_API_KEY", "")})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            out = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as err:
        return {"error": str(err)[:200], "seconds": time.perf_counter() - t0}
    details = out.get("sglext", {}).get("spec_tokens_details", {})
    return {"tokens": out["usage"]["completion_tokens"], "seconds": time.perf_counter() - t0,
            "accept_length": details.get("spec_accept_length")}


def main() -> None:
    url, model, max_tokens, conc, temperature = (sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                                                 float(sys.argv[5]))
    one(url, model, 4, temperature, PROMPTS[0])  # warm-up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        results = list(pool.map(lambda p: one(url, model, max_tokens, temperature, p), PROMPTS))
    wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    lat = sorted(r["seconds"] for r in ok) or [0.0]
    accept = [r["accept_length"] for r in ok if r.get("accept_length") is not None]
    print(json.dumps({
        "temperature": temperature, "concurrency": conc, "requests": len(results),
        "errors": len(results) - len(ok), "tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 1),
        "accept_length": round(statistics.mean(accept), 3) if accept else None,
        "latency_p50_s": round(lat[len(lat) // 2], 3), "latency_p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 3),
    }))


if __name__ == "__main__":
    main()

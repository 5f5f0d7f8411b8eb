"""Smoke requests against the local service: temperature 0 twice, then 0.7; prints one JSON line.

Usage: python3 smoke.py URL MODEL MAX_TOKENS PROMPT   (API key in the K26_API_KEY environment variable)
Runs on the host with the standard library only.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request


def ask(url: str, model: str, max_tokens: int, prompt: str, temperature: float) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": temperature, "seed": 0, "return_spec_tokens_details": True}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + os.environ.get("K26_API_KEY", "")})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            out = json.load(resp)
    except urllib.error.HTTPError as err:
        sys.exit(f"HTTP {err.code} at temperature {temperature}: {err.read().decode(errors='replace')[:1500]}")
    out["_seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    url, model, max_tokens, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    answers = [ask(url, model, max_tokens, prompt, t) for t in (0.0, 0.0, 0.7)]
    texts = [a["choices"][0]["message"]["content"] for a in answers]
    tokens = [a["usage"]["completion_tokens"] for a in answers]
    first = answers[0]
    details = first.get("sglext", {}).get("spec_tokens_details", {})
    print(json.dumps({"texts": texts, "tokens": tokens, "tokens_per_s": round(tokens[0] / first["_seconds"], 1),
                      "accept_length": details.get("spec_accept_length")}))
    if min(tokens) == 0:
        sys.exit(f"an answer was empty: {texts}")
    if texts[0] != texts[1]:
        sys.exit(f"temperature 0 is not deterministic: {texts[0]!r} then {texts[1]!r}")


if __name__ == "__main__":
    main()

"""Compare each configuration's temperature-0 token ids with the NONE run; write the report.

Usage: python tools/validate_report.py RESULTS_DIR NEAR_TIE_MARGIN
Reads RESULTS_DIR/<config>.json (k26_client.py validate output, one per configuration, NONE
included). Writes report.md (verdict line first), results.json and plot.png; exits 1 on FAIL.

A divergence is a near-tie when the configuration's token at the first differing step is among
the NONE run's top log-probs there (validate.yml asks NONE alone for them) and within
NEAR_TIE_MARGIN of NONE's best: bf16 logits tie exactly or within a step, and which of the tied
tokens wins can flip between a tree verify pass and plain decoding (seen on the GPU test bed,
2026-12-01: six prompts whose NONE top-2 log-probs were equal, where DFLASH and DDTREE took a third
token of the tie). Anything else is a bug.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def reference_top(base: dict, i: int) -> list[tuple[int, float]]:
    """NONE's top (token, log-prob) pairs at step i, best first ("top2" in results written before
    the reference asked for more than two)."""
    steps = base.get("top") or base.get("top2") or []
    return [(int(t), float(lp)) for t, lp in steps[i]] if i < len(steps) else []


def compare(base: dict, other: dict, margin: float) -> dict:
    """One prompt: identical, near-tie or mismatch; at the first differing step, `margin` is how far
    the configuration's token is below NONE's best there (None: not among NONE's top log-probs)."""
    a, b = base["output_ids"], other["output_ids"]
    if base.get("error") or other.get("error"):
        return {"status": "error", "detail": base.get("error") or other.get("error")}
    if a == b:
        return {"status": "identical"}
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    top = reference_top(base, i)
    got = b[i] if i < len(b) else None
    below = next((top[0][1] - lp for token, lp in top if token == got), None) if top else None
    near = below is not None and below <= margin
    return {"status": "near-tie" if near else "mismatch", "index": i, "margin": below,
            "expected": a[i] if i < len(a) else None, "got": got}


def summarise(name: str, run: dict, base: dict | None, margin: float) -> dict:
    accepts = [p["accept_length"] for p in run["prompts"] if p.get("accept_length") is not None]
    rows = {"config": name, "tokens_per_s_c1": run["tokens_per_s_c1"], "tokens_per_s_cn": run["tokens_per_s_cn"],
            "concurrency": run["concurrency"], "ttft_p50_s": run["ttft_p50_s"], "errors": run["errors"],
            "accept_length_mean": round(statistics.mean(accepts), 3) if accepts else None,
            "accept_length_hist": histogram(accepts)}
    if base is not None:
        rows["prompts"] = {p["id"]: compare(bp, p, margin) for bp, p in zip(base["prompts"], run["prompts"])}
    return rows


def histogram(values: list[float]) -> dict[str, int]:
    """Requests by mean accept length (tokens per verify step), in bins of 0.5."""
    out: dict[str, int] = {}
    for v in values:
        lo = int(v * 2) / 2
        key = f"{lo:.1f}-{lo + 0.5:.1f}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    out, margin = Path(argv[1]), float(argv[2])
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "results"}
    if "NONE" not in runs:
        print("no NONE run to compare with", file=sys.stderr)
        return 2
    base = runs["NONE"]
    order = ["NONE"] + [k for k in runs if k != "NONE"]
    summary = [summarise(k, runs[k], None if k == "NONE" else base, margin) for k in order]
    bad = [(s["config"], pid, c) for s in summary for pid, c in s.get("prompts", {}).items()
           if c["status"] in ("mismatch", "error")]
    verdict = "PASS" if not bad and all(s["errors"] == 0 for s in summary) else "FAIL"
    lines = [f"VERDICT: {verdict} — {len(base['prompts'])} prompts at temperature 0, compared with NONE "
             f"(near-tie margin {margin} nats)", "",
             "| configuration | identical | near-ties | mismatches | accept length (mean) | tokens/s c=1 "
             "| tokens/s c=N | TTFT p50 (s) | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        st = [c["status"] for c in s.get("prompts", {}).values()]
        ident = st.count("identical") if st else len(base["prompts"])
        lines.append(f"| {s['config']} | {ident} | {st.count('near-tie')} | {st.count('mismatch') + st.count('error')} "
                     f"| {s['accept_length_mean']} | {s['tokens_per_s_c1']} | {s['tokens_per_s_cn']} (c={s['concurrency']}) "
                     f"| {s['ttft_p50_s']} | {s['errors']} |")
    details = [(s["config"], pid, c) for s in summary for pid, c in s.get("prompts", {}).items()
               if c["status"] != "identical"]
    if details:
        lines += ["", "Divergences (first differing step; margin = NONE's best log-prob there minus NONE's log-prob "
                  "of the token the configuration took; None: not among NONE's top log-probs):", ""]
        lines += [f"- {cfg} / {pid}: {c['status']} at token {c.get('index')}: expected {c.get('expected')}, "
                  f"got {c.get('got')}, margin {c.get('margin')}" + (f" ({c['detail']})" if c.get("detail") else "")
                  for cfg, pid, c in details]
    lines += ["", "Accept-length histograms (requests by mean tokens per verify step):", ""]
    lines += [f"- {s['config']}: {s['accept_length_hist']}" for s in summary]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"verdict": verdict, "configurations": summary}, indent=1) + "\n")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [s["config"] for s in summary]
    ax1.bar(names, [s["tokens_per_s_c1"] for s in summary])
    ax1.set_title("tokens/s, one request at a time")
    ax2.bar(names, [s["accept_length_mean"] or 1.0 for s in summary])
    ax2.set_title("accept length (tokens / verify step)")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(f"validation: {verdict}")
    fig.tight_layout()
    fig.savefig(out / "plot.png", dpi=110)
    print(lines[0])
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

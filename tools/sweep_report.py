"""Write results.csv, results.md and plot.png for a sweep and print the best configuration.

Usage: python tools/sweep_report.py RESULTS_DIR   (reads RESULTS_DIR/rows.json written by sweep.yml)
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIELDS = ["budget", "topk_cap", "cuda_graph", "temperature", "concurrency", "tokens_per_s", "accept_length",
          "latency_p50_s", "latency_p95_s", "requests", "errors", "status"]


def write_csv(rows: list[dict], out: Path) -> None:
    with (out / "results.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def write_table(rows: list[dict], out: Path, best: dict | None) -> None:
    lines = ["| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    lines += ["| " + " | ".join(str(r.get(f, "")) for f in FIELDS) + " |" for r in rows]
    if best:
        lines += ["", f"Best at temperature 0: budget {best['budget']}, top-k cap {best['topk_cap']}, "
                      f"CUDA graphs {best['cuda_graph']}: {best['tokens_per_s']} tokens/s, "
                      f"accept length {best['accept_length']}"]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def write_plot(rows: list[dict], out: Path) -> None:
    ok = [r for r in rows if r.get("status") == "ok" and float(r["temperature"]) == 0.0]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for cap in sorted({r["topk_cap"] for r in ok}):
        for graphs in sorted({str(r["cuda_graph"]) for r in ok}):
            pts = sorted((int(r["budget"]), r) for r in ok if r["topk_cap"] == cap and str(r["cuda_graph"]) == graphs)
            label = f"cap {cap}" + ("" if len({str(r['cuda_graph']) for r in ok}) == 1 else f", graphs {graphs}")
            ax1.plot([b for b, _ in pts], [r["accept_length"] or 0 for _, r in pts], marker="o", label=label)
            ax2.plot([b for b, _ in pts], [r["tokens_per_s"] for _, r in pts], marker="o", label=label)
    for ax, title in ((ax1, "accept length (tokens / verify step)"), (ax2, "tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("DDTree budget")
        ax.set_title(title + ", temperature 0")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "plot.png", dpi=110)


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    rows = json.loads((out / "rows.json").read_text())
    ok = [r for r in rows if r.get("status") == "ok" and float(r["temperature"]) == 0.0]
    best = max(ok, key=lambda r: r["tokens_per_s"]) if ok else None
    write_csv(rows, out)
    write_table(rows, out, best)
    write_plot(rows, out)
    print(json.dumps({"best": best, "results": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

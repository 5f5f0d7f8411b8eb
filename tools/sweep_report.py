"""Write results.csv, results.md, plot.png and thresholds.json for a sweep and print the best DDTree
configuration with its speed against DFLASH and NONE (same CUDA-graph setting, temperature 0; each
reference at its fastest overlap-scheduler setting, the bar a DDTREE configuration has to clear).

thresholds.json holds the monitoring role's thresholds this sweep measured (k26_alert_sweep_results):
the accept length under which K26AcceptLengthLow fires (ACCEPT_FLOOR_SHARE of the best configuration's),
the tokens/s per request under which K26SlowerThanBaseline fires (NONE's, same graph setting), and the
time-to-first-token and inter-token bounds of K26TimeToFirstTokenHigh / K26InterTokenLatencyHigh: the
highest 95th percentile of the server's own histograms the best configuration showed at any load this
sweep ran, times LATENCY_MARGIN.

schedule.json holds the DDTree width by running batch size this sweep measured (issue 32): at each
concurrency it ran, the fastest DDTREE configuration at temperature 0 (same CUDA-graph setting as the
best overall), the value measured at concurrency C applying from a running batch of C (the lowest from
1), the overlap-scheduler setting (overlap_schedule) the best one's; with the best reference at that
load beside it, and where DDTREE loses, by how much.

Usage: python tools/sweep_report.py RESULTS_DIR   (reads RESULTS_DIR/rows.json written by sweep.yml)
"""

from __future__ import annotations

import csv
import itertools
import json
import sys
from pathlib import Path

import matplotlib

from ddtree.settings import WidthSchedule  # plain Python, no torch (sweep.yml puts src/ on PYTHONPATH)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIELDS = ["algorithm", "budget", "topk_cap", "cuda_graph", "overlap_schedule", "temperature", "concurrency", "tokens_per_s",
          "server_tokens_per_s", "accept_length", "server_accept_length", "latency_p50_s", "latency_p95_s",
          "ttft_p95_s", "itl_p95_s", "requests", "errors", "status"]


def speed(row: dict) -> float:
    """The server's own tokens/s where its /metrics answered, else the client's."""
    value = row.get("server_tokens_per_s")
    return float(value if value is not None else row.get("tokens_per_s") or 0)


def overlap(row: dict) -> str:
    """The row's k26_overlap_schedule (auto, true or false); rows of sweeps before the setting: auto."""
    return str(row.get("overlap_schedule", "auto")).lower()


POLICY_TOLERANCE = 0.03     # the width policy "keeps up" within 3% of the fastest setting (issue 70 item 4's margin)


def is_policy(row: dict) -> bool:
    """A row of the width policy (budget auto or auto:W,...), not of one width."""
    return str(row.get("budget", "")).startswith("auto")


def fixed_trees(rows: list[dict]) -> list[dict]:
    """The DDTREE rows at temperature 0 that passed, of one width each (the width policy's left out)."""
    return [r for r in greedy_ok(rows, "DDTREE") if not is_policy(r)]


def policy_rows(rows: list[dict]) -> list[dict]:
    """The width policy's DDTREE rows at temperature 0 that passed."""
    return [r for r in greedy_ok(rows, "DDTREE") if is_policy(r)]


def greedy_ok(rows: list[dict], algorithm: str) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok" and float(r["temperature"]) == 0.0
            and r.get("algorithm", "DDTREE") == algorithm]


def alike(row: dict, other: dict) -> bool:
    """The same CUDA-graph setting and load (concurrency)."""
    return str(row["cuda_graph"]) == str(other["cuda_graph"]) and row.get("concurrency") == other.get("concurrency")


def fastest_alike(rows: list[dict], algorithm: str, row: dict) -> dict | None:
    """The fastest `algorithm` row at temperature 0 with `row`'s graph setting and load (any overlap setting)."""
    return max((r for r in greedy_ok(rows, algorithm) if alike(r, row)), key=speed, default=None)


def comparison(rows: list[dict]) -> dict | None:
    """The best DDTREE configuration at temperature 0 and how it compares with DFLASH and NONE at
    the same graph setting and load (each at its fastest overlap setting)."""
    trees = greedy_ok(rows, "DDTREE")
    if not trees:
        return None
    best = max(trees, key=speed)
    out = {"best": best}
    for ref in ("DFLASH", "NONE"):
        same = fastest_alike(rows, ref, best)
        if same and speed(same) > 0:
            out[f"vs_{ref.lower()}"] = round(speed(best) / speed(same), 3)
    return out


ACCEPT_FLOOR_SHARE = 0.8
LATENCY_MARGIN = 1.5


def accept_length(row: dict) -> float:
    value = row.get("server_accept_length")
    return float(value if value is not None else row.get("accept_length") or 0)


def thresholds(summary: dict | None, rows: list[dict]) -> dict:
    """The alert floors this sweep measured; {} when it has no DDTREE row at temperature 0."""
    if not summary:
        return {}
    best = summary["best"]
    out = {"accept_length_floor": round(ACCEPT_FLOOR_SHARE * accept_length(best), 3),
           "from": {"budget": best["budget"], "topk_cap": best["topk_cap"], "cuda_graph": best["cuda_graph"],
                    "accept_length": accept_length(best)}}
    none = fastest_alike(rows, "NONE", best)
    if none and int(none.get("concurrency") or 0) > 0:
        out["tokens_per_s_per_request_floor"] = round(speed(none) / int(none["concurrency"]), 3)
        out["from"]["none_tokens_per_s"] = speed(none)
    out.update(latency_bounds(rows, best))
    return out


def same_configuration(row: dict, best: dict) -> bool:
    keys = ("budget", "topk_cap", "cuda_graph")
    return all(str(row.get(k)) == str(best.get(k)) for k in keys) and overlap(row) == overlap(best)


def latency_bounds(rows: list[dict], best: dict) -> dict:
    """The alerts' TTFT and inter-token bounds: LATENCY_MARGIN x the highest 95th percentile the best
    configuration's rows at temperature 0 measured (every load the sweep ran); none where the server
    exported no histogram."""
    mine = [r for r in greedy_ok(rows, "DDTREE") if same_configuration(r, best)]
    out = {}
    for key, name in (("ttft_p95_s", "ttft_p95_seconds_max"), ("itl_p95_s", "itl_p95_seconds_max")):
        measured = [float(r[key]) for r in mine if r.get(key) is not None]
        if measured:
            out[name] = round(LATENCY_MARGIN * max(measured), 4)
    return out


def schedule_picks(rows: list[dict], graphs, overlap_setting: str = "auto") -> list[dict]:
    """At each concurrency measured: the fastest DDTREE row at temperature 0 with CUDA graphs `graphs` and
    the overlap setting `overlap_setting` (one deploy renders one), and the fastest reference (NONE or
    DFLASH, any overlap setting) at the same load and graph setting."""
    same = [r for r in rows if str(r.get("cuda_graph")) == str(graphs)]
    all_trees = [r for r in fixed_trees(same) if overlap(r) == overlap_setting]
    all_refs = greedy_ok(same, "NONE") + greedy_ok(same, "DFLASH")
    picks = []
    for level in sorted({int(r.get("concurrency") or 0) for r in all_trees}):
        trees = [r for r in all_trees if int(r.get("concurrency") or 0) == level]
        refs = [r for r in all_refs if int(r.get("concurrency") or 0) == level]
        best, ref = max(trees, key=speed), max(refs, key=speed, default=None)
        picks.append({"concurrency": level, "budget": int(best["budget"]), "topk_cap": int(best["topk_cap"]),
                      "tokens_per_s": speed(best), "accept_length": accept_length(best),
                      "reference": ref["algorithm"] if ref else None, "reference_tokens_per_s": speed(ref) if ref else None,
                      "vs_reference": round(speed(best) / speed(ref), 3) if ref and speed(ref) > 0 else None})
    return picks


def found_schedule(picks: list[dict]) -> WidthSchedule:
    """The picks' (budget, cap) by load, by the one finder (ddtree.settings.WidthSchedule.found: each from its
    measured load on, the lowest from 1; equal neighbours merged)."""
    return WidthSchedule.found({p["concurrency"]: (p["budget"], p["topk_cap"]) for p in picks})


def schedule(summary: dict | None, rows: list[dict]) -> dict:
    """schedule.json: the budget and cap schedules in the inventory's variable names, and the picks
    they came from; {} when the sweep has no DDTREE row at temperature 0."""
    if not summary:
        return {}
    graphs, overlap_setting = summary["best"]["cuda_graph"], overlap(summary["best"])
    picks = schedule_picks(rows, graphs, overlap_setting)
    if not picks:                 # only the width policy ran under the best one's settings
        return {"width_policy": policy_comparison(rows)}
    found = found_schedule(picks)
    return {"k26_ddtree_budget": str(found.budget), "k26_ddtree_topk_cap": str(found.topk_cap),
            "cuda_graph": graphs, "overlap_schedule": overlap_setting, "temperature": 0.0, "picks": picks,
            "loses_at": [p["concurrency"] for p in picks if p["vs_reference"] is not None and p["vs_reference"] < 1],
            "width_policy": policy_comparison(rows)}


def setting_name(row: dict) -> str:
    """How results.md names a row's setting: NONE, DFLASH, b16 c4, or auto c8; with its overlap setting."""
    if row.get("algorithm", "DDTREE") != "DDTREE":
        what = row["algorithm"]
    else:
        what = f"{'auto' if is_policy(row) else 'b' + str(row['budget'])} c{row['topk_cap']}"
    return f"{what} (overlap {overlap(row)})"


def policy_comparison(rows: list[dict]) -> list[dict]:
    """At each load and overlap setting the width policy ran (temperature 0): its tokens/s against the fastest of
    every other setting at that load with its graph setting (fixed budgets, DFLASH, NONE; any overlap setting), and
    whether it keeps up (ratio >= 1 - POLICY_TOLERANCE)."""
    out = []
    others = fixed_trees(rows) + greedy_ok(rows, "DFLASH") + greedy_ok(rows, "NONE")
    for row in sorted(policy_rows(rows), key=lambda r: (int(r.get("concurrency") or 0), overlap(r))):
        rivals = [r for r in others if alike(r, row)]
        best = max(rivals, key=speed, default=None)
        ratio = round(speed(row) / speed(best), 3) if best and speed(best) > 0 else None
        out.append({"concurrency": int(row.get("concurrency") or 0), "overlap_schedule": overlap(row),
                    "budget": str(row["budget"]), "topk_cap": int(row["topk_cap"]), "tokens_per_s": speed(row),
                    "accept_length": accept_length(row), "fastest_other": setting_name(best) if best else None,
                    "fastest_other_tokens_per_s": speed(best) if best else None, "vs_fastest_other": ratio,
                    "keeps_up": ratio is not None and ratio >= 1 - POLICY_TOLERANCE})
    return out


def policy_lines(compared: list[dict]) -> list[str]:
    """The width policy's section of results.md."""
    if not compared:
        return []
    lines = ["", f"Width policy (budget auto) against the fastest other setting at each load (temperature 0; keeps up: "
                 f"within {POLICY_TOLERANCE:.0%}):", "",
             "| concurrency | overlap | policy tokens/s | accept length | fastest other | its tokens/s | policy / it |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {c['concurrency']} | {c['overlap_schedule']} | {c['tokens_per_s']} | {c['accept_length']} | "
              f"{c['fastest_other'] or '-'} | {c['fastest_other_tokens_per_s'] or '-'} | {c['vs_fastest_other'] or '-'} |"
              for c in compared]
    behind = [c for c in compared if not c["keeps_up"]]
    if behind:
        lines += ["", "The width policy falls behind at " + ", ".join(
            f"concurrency {c['concurrency']} (overlap {c['overlap_schedule']}, x{c['vs_fastest_other']})" for c in behind)
            + ": keep the fixed setting or the schedule."]
    else:
        lines += ["", f"The width policy keeps up at every load measured: `k26_ddtree_budget: auto` with "
                      f"`k26_ddtree_topk_cap: {compared[0]['topk_cap']}` may serve this host (not written by the sweep)."]
    return lines


def schedule_lines(plan: dict) -> list[str]:
    """The schedule section of results.md."""
    if not plan.get("picks"):
        return policy_lines(plan.get("width_policy", []))
    lines = ["", f"Schedule by running batch size (temperature 0, CUDA graphs {plan['cuda_graph']}, "
                 f"overlap scheduler {plan.get('overlap_schedule', 'auto')}): "
                 f"budget `{plan['k26_ddtree_budget']}`, top-k cap `{plan['k26_ddtree_topk_cap']}`", "",
             "| concurrency | budget | top-k cap | tokens/s | accept length | best reference | its tokens/s | DDTREE / reference |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {p['concurrency']} | {p['budget']} | {p['topk_cap']} | {p['tokens_per_s']} | {p['accept_length']} | "
              f"{p['reference'] or '-'} | {p['reference_tokens_per_s'] or '-'} | {p['vs_reference'] or '-'} |"
              for p in plan["picks"]]
    if plan["loses_at"]:
        lines += ["", "DDTREE is slower than the best reference at concurrency "
                      + ", ".join(str(c) for c in plan["loses_at"]) + ": no width wins there."]
    return lines + policy_lines(plan.get("width_policy", []))


def write_csv(rows: list[dict], out: Path) -> None:
    with (out / "results.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def write_table(rows: list[dict], out: Path, summary: dict | None, plan: dict | None = None) -> None:
    lines = ["| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    lines += ["| " + " | ".join("" if r.get(f) is None else str(r.get(f)) for f in FIELDS) + " |" for r in rows]
    if summary:
        best = summary["best"]
        ratios = ", ".join(f"{k.split('_')[1].upper()} x{v}" for k, v in summary.items() if k.startswith("vs_"))
        lines += ["", f"Best at temperature 0: budget {best['budget']}, top-k cap {best['topk_cap']}, "
                      f"CUDA graphs {best['cuda_graph']}, overlap scheduler {overlap(best)}: {speed(best)} tokens/s, "
                      f"accept length {best.get('server_accept_length') or best['accept_length']}"
                      + (f" ({ratios})" if ratios else "")]
    lines += schedule_lines(plan or {})
    (out / "results.md").write_text("\n".join(lines) + "\n")


def write_plot(rows: list[dict], out: Path) -> None:
    ok = fixed_trees(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    graph_settings = sorted({(str(r["cuda_graph"]), overlap(r)) for r in ok})
    levels = sorted({int(r.get("concurrency") or 0) for r in ok})
    for cap, graphs, level in itertools.product(sorted({r["topk_cap"] for r in ok}), graph_settings, levels):
        pts = sorted(((int(r["budget"]), r) for r in ok if r["topk_cap"] == cap
                      and (str(r["cuda_graph"]), overlap(r)) == graphs and int(r.get("concurrency") or 0) == level),
                     key=lambda p: p[0])
        if pts:
            label = (f"cap {cap}" + ("" if len(graph_settings) == 1 else f", graphs {graphs[0]}, overlap {graphs[1]}")
                     + ("" if len(levels) == 1 else f", {level} at once"))
            ax1.plot([b for b, _ in pts], [r.get("server_accept_length") or r["accept_length"] or 0 for _, r in pts],
                     marker="o", label=label)
            ax2.plot([b for b, _ in pts], [speed(r) for _, r in pts], marker="o", label=label)
    for ref, style in (("DFLASH", "--"), ("NONE", ":"), ("width policy", "-.")):
        for r in policy_rows(rows) if ref == "width policy" else greedy_ok(rows, ref):
            label = (ref + ("" if len(graph_settings) <= 1 else f", graphs {r['cuda_graph']}, overlap {overlap(r)}")
                     + ("" if len(levels) <= 1 else f", {r.get('concurrency')} at once"))
            ax2.axhline(speed(r), linestyle=style, color="black", label=label)
            if ref == "DFLASH" and (r.get("server_accept_length") or r.get("accept_length")):
                ax1.axhline(r.get("server_accept_length") or r["accept_length"], linestyle=style, color="black",
                            label=label)
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
    summary = comparison(rows)
    plan = schedule(summary, rows)
    write_csv(rows, out)
    write_table(rows, out, summary, plan)
    write_plot(rows, out)
    (out / "thresholds.json").write_text(json.dumps(thresholds(summary, rows), indent=2) + "\n")
    (out / "schedule.json").write_text(json.dumps(plan, indent=2) + "\n")
    print(json.dumps({**(summary or {"best": None}), "results": str(out),
                      "schedule": {k: plan[k] for k in ("k26_ddtree_budget", "k26_ddtree_topk_cap", "loses_at")}
                      if plan.get("picks") else None,
                      "width_policy_behind_at": [c["concurrency"] for c in plan.get("width_policy", []) if not c["keeps_up"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

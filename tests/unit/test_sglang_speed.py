"""bench/sglang_speed.py's decisions, on rows made up here (the GPU run measures the real ones): the mixed prompt
set, the schedule it finds from the fixed trees' rows (the chain as its fallback), whether the schedule won, the
issue's targets, the jobs the sweep is split into, the twins measured in turn, the plot."""

from __future__ import annotations

import json

import pytest


from bench import sglang_speed as speed


def row(config, algorithm, load, tps, budget=None, overlap=False, accept=None):
    return speed.SpeedRow(config=config, algorithm=algorithm, budget=budget, overlap=overlap, load=load,
                          tokens_per_s=tps, accept_length=accept, tokens_per_step=None, step_ms=None,
                          equal_to_none=None, walls=[1.0, 1.1])


def test_mixed_prompts_alternate_seen_and_heldout_vary_in_length_and_reuse_each_file_in_turn():
    seen = [[1000 + i] * 300 for i in range(3)]
    held = [[2000 + i] * 300 for i in range(10)]
    prompts = speed.mixed_prompts(held, seen, 12)
    assert [p[0] // 1000 for p in prompts] == [1, 2] * 6
    assert [len(p) for p in prompts] == [17 + 15 * i for i in range(12)]
    assert [p[0] % 1000 for p in prompts[::2]] == [0, 1, 2, 0, 1, 2]          # 3 seen prompts, reused in turn
    assert speed.prompts_per_load(1) == 24 and speed.prompts_per_load(48) == 384
    with pytest.raises(ValueError, match="need both kinds.*3 seen and 0 held-out"):
        speed.mixed_prompts([], seen, 4)


def fixed_rows(best_by_load: dict[int, int], overlap=False):
    """Phase-1 rows of the four cap-8 budgets and the chain (budget 7, cap 1) at each load, `best` the fastest."""
    rows = []
    for load, best in best_by_load.items():
        for b in (7, 8, 16, 32, 64):
            c = 1 if b == 7 else 8
            name = f"ddtree-b{b}-c{c}-graphs{'-overlap' if overlap else ''}-bs48"
            rows.append(row(name, "DDTREE", load, 1000 + (500 if b == best else b), budget=b, overlap=overlap))
            rows[-1].cap = c
    return rows


def test_found_schedule_takes_each_loads_fastest_budget_and_merges_equal_neighbours():
    rows = fixed_rows({1: 64, 8: 32, 16: 32, 32: 8, 48: 8}) + fixed_rows({1: 16, 8: 16, 16: 16, 32: 16, 48: 16}, True)
    found = speed.found_schedule(rows, (1, 8, 16, 32, 48), overlap=False)
    assert speed.schedule_label(found) == "1:64,8:32,32:8" and str(found.topk_cap) == "8"
    assert found.at(7) == (64, 8) and found.at(20) == (32, 8) and found.at(48) == (8, 8)
    assert speed.schedule_label(speed.found_schedule(rows, (1, 8, 16, 32, 48), overlap=True)) == "16"


def test_where_every_tree_loses_the_schedule_falls_back_to_the_chain_with_its_cap():
    rows = fixed_rows({1: 32, 8: 32, 16: 7, 32: 7, 48: 64})
    found = speed.found_schedule(rows, (1, 8, 16, 32, 48), overlap=False)
    assert speed.schedule_label(found) == "1:32,16:7,48:64/1:8,16:1,48:8"
    assert found.steps == [(1, (32, 8)), (16, (7, 1)), (48, (64, 8))] and found.trees == [(7, 1), (32, 8), (64, 8)]
    cfg = speed.scheduled_config(found, overlap=False)
    args = cfg.args(__import__("pathlib").Path("/pair"), 40000)
    assert args[args.index("--speculative-ddtree-budget") + 1] == "1:32,16:7,48:64"
    assert args[args.index("--speculative-ddtree-topk-cap") + 1] == "1:8,16:1,48:8"
    from ddtree.settings import SERVER_FLAGS, schedule_problems
    assert schedule_problems(found.budget, found.topk_cap, 8, SERVER_FLAGS) == []      # the plugin's rules hold
    assert speed.twin_at(found, 16, False) == "twin-ddtree-b7-c1-graphs-bs48"
    old = [r for r in rows]
    for r in old:
        r.cap = None                                 # rows written before the cap was kept: every tree cap 8
    assert speed.found_schedule([r for r in old if r.budget != 7], (1, 8), False).at(1) == (32, 8)


def test_found_schedule_names_the_missing_rows():
    with pytest.raises(ValueError, match="no fixed-budget DDTREE row at load 8"):
        speed.found_schedule(fixed_rows({1: 64}), (1, 8), overlap=False)


def test_the_schedule_wins_only_where_it_is_at_least_the_best_fixed_budget():
    rows = fixed_rows({1: 64, 8: 32})                # best 1500 at both loads
    rows += [row("ddtree-found", "DDTREE", 1, 1500, budget="1:64,3:32"),
             row("ddtree-found", "DDTREE", 8, 1499, budget="1:64,3:32")]
    assert speed.schedule_wins(rows, "ddtree-found", (1, 8), overlap=False) == {1: True, 8: False}


def test_scheduled_config_serves_the_schedule():
    cfg = speed.scheduled_config(speed.parse_tree_schedule("1:64,12:16", "s"), overlap=True)
    assert cfg.name == "ddtree-found-overlap" and cfg.overlap and cfg.max_bs == 48
    assert cfg.env == ()           # neither a schedule nor the overlap scheduler needs a switch of its own
    from pathlib import Path
    args = cfg.args(Path("/pair"), 40000)
    assert args[args.index("--speculative-ddtree-budget") + 1] == "1:64,12:16"
    assert "--disable-overlap-schedule" not in args


def test_targets_hold_the_candidate_to_every_load_and_compute_step_efficiency():
    rows = [row("none-bs48", "NONE", 1, 300), row("none-overlap-bs48", "NONE", 1, 320, overlap=True),
            row("dflash-overlap-bs48", "DFLASH", 1, 800, overlap=True, accept=4.2),
            row("ddtree-found-overlap", "DDTREE", 1, 1300, budget="1:64,3:32", overlap=True, accept=5.5),
            row("none-overlap-bs48", "NONE", 8, 2500, overlap=True),
            row("dflash-overlap-bs48", "DFLASH", 8, 2400, overlap=True, accept=4.2),
            row("ddtree-found-overlap", "DDTREE", 8, 2450, budget="1:64,3:32", overlap=True, accept=5.1)]
    found = {t.what: t for t in speed.targets(rows, (1, 8), "ddtree-found-overlap")}
    ratio = found["DDTREE >= 1.5 x DFLASH at 1 request, overlap scheduler on both"]
    assert ratio.met and "1.62x" in ratio.measured and "tokens per verify step" not in ratio.measured
    rows[2].tokens_per_step, rows[2].step_ms, rows[3].tokens_per_step, rows[3].step_ms = 3.81, 3.66, 5.42, 4.42
    split = {t.what: t for t in speed.targets(rows, (1,), "ddtree-found-overlap")}[ratio.what]
    assert "(tokens per verify step 5.42 / 3.81 = 1.42x, step ms 4.42 / 3.66 = 1.21x)" in split.measured
    assert found["ddtree-found-overlap >= max(NONE, DFLASH) at 1 running requests"].met
    at8 = found["ddtree-found-overlap >= max(NONE, DFLASH) at 8 running requests"]
    assert not at8.met and "none-overlap-bs48 2500" in at8.measured
    eff = found["step efficiency tokens/s / (accept length x NONE tokens/s) >= 0.7 at 1 request"]
    assert eff.met is True and "= 0.74" in eff.measured          # 1300 / (5.5 x 320)
    assert "**no**" in speed.target_table(list(found.values()))


# --- the sweep split into jobs, and the schedule measured beside its twins ------------------------------------------

def test_modes_parse_and_a_bad_one_is_named():
    assert speed.parse_modes("off,on") == (False, True) and speed.parse_modes("on") == (True,)
    assert speed.parse_modes("on,on") == (True,)
    with pytest.raises(ValueError, match=r"--modes 'of' is invalid: expected off, on or off,on"):
        speed.parse_modes("of")
    names = [c.name for c in speed.fixed_configs((16, 32), (True,))]
    assert names == ["none-overlap-bs48", "dflash-overlap-bs48", "ddtree-b16-c8-graphs-overlap-bs48",
                     "ddtree-b32-c8-graphs-overlap-bs48", "ddtree-b7-c1-graphs-overlap-bs48"]
    assert len(speed.fixed_configs((16, 32), (False, True), chain=None)) == 8


def test_caps_cross_every_budget_and_named_configurations_replace_the_matrix():
    """Issue 69 item 4: budgets 8/16 x caps 1/4/8 (a cap above its budget left out), or exactly the settings named."""
    names = [c.name for c in speed.fixed_configs((8, 16), (False,), None, caps=(1, 4, 8))]
    trees = [n for n in names if n.startswith("ddtree")]
    assert trees == [f"ddtree-b{b}-c{c}-graphs-bs48" for b in (8, 16) for c in (1, 4, 8)]
    assert [c.name for c in speed.fixed_configs((4,), (False,), None, caps=(1, 8))][2:] == ["ddtree-b4-c1-graphs-bs48"]
    named = speed.fixed_configs(modes=(False, True), bases=("none", "ddtree-b8-c4-graphs"))
    assert [c.name for c in named] == ["none-bs48", "none-overlap-bs48", "ddtree-b8-c4-graphs-bs48",
                                       "ddtree-b8-c4-graphs-overlap-bs48"]
    assert named[3].overlap and named[3].max_bs == 48 and (named[3].budget, named[3].cap) == (8, 4)
    with pytest.raises(ValueError, match="configuration 'ddtree-b8-graphs' is invalid"):
        speed.fixed_configs(modes=(False,), bases=("ddtree-b8-graphs",))


def test_the_chain_is_the_pairs_own_block(tmp_path):
    """A block-16 draft's chain is budget 15 (DFLASH's own block); a pair without an exported draft is named."""
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft/config.json").write_text(json.dumps({"block_size": 16, "dflash_config": {"block_size": 16}}))
    assert speed.chain_of(tmp_path) == (15, 1)
    names = [c.name for c in speed.fixed_configs((32,), (False,), speed.chain_of(tmp_path))]
    assert names[-1] == "ddtree-b15-c1-graphs-bs48"
    with pytest.raises(ValueError, match=r"nowhere/draft/config.json gives no block_size .*exported by"):
        speed.chain_of(tmp_path / "nowhere")


def test_twins_are_the_fixed_servers_of_the_schedules_budgets_under_names_of_their_own():
    sched = speed.parse_tree_schedule("1:32,3:16,40:32", "s")
    twins = speed.twin_configs(sched, overlap=False)
    assert [t.name for t in twins] == ["twin-ddtree-b16-c8-graphs-bs48", "twin-ddtree-b32-c8-graphs-bs48"]
    assert [t.budget for t in twins] == [16, 32] and all(not t.overlap and t.max_bs == 48 for t in twins)
    assert [t.cap for t in twins] == [8, 8]
    assert speed.twin_at(sched, 1, False) == "twin-ddtree-b32-c8-graphs-bs48"
    assert speed.twin_at(sched, 3, False) == "twin-ddtree-b16-c8-graphs-bs48"
    assert speed.twin_at(sched, 48, False) == "twin-ddtree-b32-c8-graphs-bs48"
    on = speed.twin_configs(speed.parse_tree_schedule("1:32,3:64", "s"), overlap=True)
    assert [t.name for t in on] == ["twin-ddtree-b32-c8-graphs-overlap-bs48", "twin-ddtree-b64-c8-graphs-overlap-bs48"]
    assert all(t.overlap and t.env == () for t in on)
    prof = speed.profiled(speed.scheduled_config(sched, overlap=False))
    assert prof.name == "ddtree-found-profile" and prof.budget == "1:32,3:16,40:32"
    assert prof.env == (("SGLANG_DDTREE_PROFILE_STEPS", "40"),)
    given = speed.parse_tree_schedule("1:32,40:7/1:8,40:1", "--schedule-off")
    assert given.at(1) == (32, 8) and given.at(40) == (7, 1)
    with pytest.raises(speed.DDTreeConfigError, match=r"--schedule-off=1:32/x is invalid \(--schedule-off's cap=x"):
        speed.parse_tree_schedule("1:32/x", "--schedule-off")


class Recorder:
    """Stands in for e2e.measure (a real SGLang server needs the GPU): records which server ran when."""

    def __init__(self):
        self.calls = []

    def __call__(self, server, prompts, load, temperature, max_new_tokens):
        self.calls.append((server.config.name, load))
        wall = 1.0 + 0.5 * len(self.calls)
        answers = [{"output_ids": [1, 2, 3], "meta_info": {"spec_verify_ct": 1, "spec_accept_length": 2.0}}]
        return speed.e2e.Measurement(answers, wall, [wall], None)


def test_passes_are_taken_in_turn_and_each_server_keeps_its_slower_one(monkeypatch):
    from types import SimpleNamespace

    rec = Recorder()
    monkeypatch.setattr(speed.e2e, "measure", rec)
    a = SimpleNamespace(config=speed.servers.config("ddtree-b32-c8-graphs-bs48"))
    b = SimpleNamespace(config=speed.scheduled_config(speed.parse_tree_schedule("1:32,3:16", "s"), False))
    runs = speed.in_turn([a, b], [[1, 2]], 1, 8)
    assert rec.calls == [("ddtree-b32-c8-graphs-bs48", 1), ("ddtree-found", 1)] * 2
    assert [[m.wall for m in r] for r in runs] == [[1.5, 2.5], [2.0, 3.0]]
    row, outputs = speed.slower_row(b, runs[1], 1, None, phase="schedule")
    assert row.walls == [2.0, 3.0] and row.tokens_per_s == round(3 / 3.0, 1) and row.phase == "schedule"
    assert row.budget == "1:32,3:16" and row.cap == "8" and outputs == [[1, 2, 3]]


def test_rows_of_earlier_jobs_load_the_first_runs_file_included(tmp_path):
    from pathlib import Path

    first = Path(__file__).resolve().parents[2] / "docs/data/h200-2026-12-04-speed1.json"
    (tmp_path / "results.json").write_text(__import__("json").dumps(__import__("json").loads(first.read_text())["rows"]))
    rows = speed.rows_from([tmp_path / "results.json"])
    assert len(rows) == 70 and all(r.phase == "fixed" for r in rows)        # rows written before phases existed
    assert speed.best_fixed(rows, 1, False).config == "ddtree-b32-c8-graphs-bs48"
    (tmp_path / "none_outputs.json").write_text('{"off-1": [[5, 6]]}')
    assert speed.references_from([tmp_path / "results.json"]) == {"off-1": [[5, 6]]}
    with pytest.raises(FileNotFoundError, match=r"--rows .*nowhere.json does not exist: name the results.json"):
        speed.rows_from([tmp_path / "nowhere.json"])


def schedule_rows():
    rows = fixed_rows({1: 32, 8: 16})                                       # phase 1: best 1500 at both loads
    rows += [row("ddtree-found", "DDTREE", 1, 1200, budget="1:32,3:16"),
             row("twin-ddtree-b32-c8-graphs-bs48", "DDTREE", 1, 1600, budget=32),
             row("ddtree-found", "DDTREE", 8, 1510, budget="1:32,3:16"),
             row("twin-ddtree-b16-c8-graphs-bs48", "DDTREE", 8, 1490, budget=16),
             row("twin-ddtree-b16-c8-graphs-overlap-bs48", "DDTREE", 8, 100, budget=16, overlap=True)]
    for r in rows[-5:]:
        r.phase = "schedule"
    return rows


def test_the_schedule_is_set_against_the_twin_it_ran_in_turn_with_and_found_from_phase_one_only():
    rows = schedule_rows()
    costs = speed.schedule_cost(rows, "ddtree-found", (1, 8))
    assert [(c.load, c.twin, round(c.ratio, 3)) for c in costs] == [
        (1, "twin-ddtree-b32-c8-graphs-bs48", 0.75), (8, "twin-ddtree-b16-c8-graphs-bs48", round(1510 / 1490, 3))]
    assert speed.best_fixed(rows, 1, False).tokens_per_s == 1500             # the twin's 1600 is not phase 1's
    assert speed.schedule_label(speed.found_schedule(rows, (1, 8), False)) == "1:32,8:16"
    table = speed.cost_table(costs)
    assert "| 1 | ddtree-b32-c8-graphs-bs48 | 1600 ([1.0, 1.1]) | 1200 ([1.0, 1.1]) | 0.750 |" in table
    report = speed.schedule_report({False: speed.parse_tree_schedule("1:32,3:16", "s"),
                                    True: speed.parse_tree_schedule("1:16,3:32", "s")}, rows, (1, 8))
    assert report["no overlap"]["wins at"] == {"1": False, "8": True} and report["no overlap"]["measured"]
    assert report["no overlap"]["schedule / twin"] == {"1": 0.75, "8": round(1510 / 1490, 3)}
    assert report["overlap"] == {"schedule": "1:16,3:32", "server": "ddtree-found-overlap", "one width": False,
                                 "measured": False, "wins at": {}, "schedule / twin": {}}


def test_a_schedule_job_without_rows_or_schedules_is_refused_by_name(tmp_path, capsys):
    base = ["--pair", "p", "--prompts", "h.json", "--train-prompts", "t.json", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit):
        speed.main(base + ["--phase", "schedule"])
    assert "--phase schedule without --rows needs --schedule-off / --schedule-on for every mode" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        speed.main(base + ["--phase", "schedule", "--modes", "on", "--schedule-on", "1:32,3:x"])
    assert "--schedule-on=1:32,3:x is invalid" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        speed.main(base + ["--modes", "both"])
    assert "--modes 'both' is invalid" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()                                     # refused before anything was written


def job_args(tmp_path, job: str):
    import re
    import subprocess
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "testbed/speed_sweep.sh").read_text()
    fn = re.search(r"^job_args\(\) \{.*?^\}$", script, re.S | re.M)
    assert fn, "testbed/speed_sweep.sh no longer defines job_args"
    return subprocess.run(["bash", "-c", f"set -u\n{fn.group(0)}\njob_args {job}"], capture_output=True, text=True,
                          env={"RESULTS": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=30)


def test_the_sweeps_jobs_map_to_phases_and_the_schedule_job_reads_the_fixed_jobs_rows_on_its_machine(tmp_path):
    assert job_args(tmp_path, "fixed-off").stdout.split() == ["--phase", "fixed", "--modes", "off"]
    assert job_args(tmp_path, "all").stdout == ""
    r = job_args(tmp_path, "schedule")
    assert r.returncode == 2 and "run the fixed-off and fixed-on jobs first" in r.stderr
    (tmp_path / "fixed-on").mkdir()
    (tmp_path / "fixed-on/results.json").write_text("[]")
    assert job_args(tmp_path, "schedule").stdout.split() == [
        "--phase", "schedule", "--modes", "on", "--rows", f"{tmp_path}/fixed-on/results.json"]
    (tmp_path / "fixed-off").mkdir()
    (tmp_path / "fixed-off/results.json").write_text("[]")
    assert job_args(tmp_path, "schedule").stdout.split()[3:] == [
        "off,on", "--rows", f"{tmp_path}/fixed-off/results.json,{tmp_path}/fixed-on/results.json"]
    r = job_args(tmp_path, "fixed")
    assert r.returncode == 2 and "run fixed is not a job: expected fixed-off, fixed-on, schedule or all" in r.stderr


def test_the_plot_draws_each_setting_by_load_per_overlap_mode_without_the_twins(tmp_path):
    rows = schedule_rows() + [row("none-bs48", "NONE", 1, 600), row("none-bs48", "NONE", 8, 4000),
                              row("dflash-overlap-bs48", "DFLASH", 1, 700, overlap=True)]
    fig = speed.load_plot(rows, (1, 8), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
    off, on = fig.axes
    lines = {ln.get_label(): list(zip(ln.get_xdata(), ln.get_ydata())) for ln in off.get_lines()}
    assert lines["none"] == [(1, 600), (8, 4000)] and lines["ddtree-found"] == [(1, 1200), (8, 1510)]
    assert not any(k.startswith("twin-") for k in lines)
    assert [ln.get_label() for ln in on.get_lines()] == ["dflash-overlap"]


def test_answers_are_saved_per_setting_and_load_where_the_partings_judge_reads_them(tmp_path):
    from testbed import speed_partings

    speed.save_answers(tmp_path, "dflash-bs48", 1, [[1, 2]])
    speed.save_answers(tmp_path, "dflash-bs48", 8, [[3, 4], [5, 6]])
    speed.save_answers(tmp_path, "ddtree-b64-c8-graphs-overlap-bs48", 1, [[7, 8]])
    speed.save_answers(tmp_path, "dflash-bs48", 1, [[9, 9]])                  # the later row of a load wins
    (tmp_path / "none_outputs.json").write_text('{"off-1": [[1, 2]], "on-1": [[7, 8]]}')
    found = speed_partings.read_jobs([tmp_path])
    assert found.settings == {"dflash-bs48": {1: [[9, 9]], 8: [[3, 4], [5, 6]]},
                              "ddtree-b64-c8-graphs-overlap-bs48": {1: [[7, 8]]}}
    # the judge pairs each setting with NONE's answers of its own overlap mode, as the sweep's equality count does
    for cfg in speed.fixed_configs((16, 64), (False, True), None):
        if cfg.algorithm != "NONE":
            assert speed_partings.none_key(cfg.name, 8) == speed.reference_key(cfg.overlap, 8), cfg.name


def test_the_width_policy_is_held_to_the_best_of_every_fixed_setting_within_the_spread():
    rows = [row("none-bs48", "NONE", 1, 300), row("dflash-bs48", "DFLASH", 1, 800, accept=4.2),
            row("ddtree-b8-c8-graphs-bs48", "DDTREE", 1, 900, budget=8),
            row("ddtree-b32-c8-graphs-bs48", "DDTREE", 1, 1000, budget=32),
            row("ddtree-auto_8_32-c8-graphs-bs48", "DDTREE", 1, 960, budget="auto:8,32"),
            row("none-bs48", "NONE", 8, 2500), row("dflash-bs48", "DFLASH", 8, 2400),
            row("ddtree-b32-c8-graphs-bs48", "DDTREE", 8, 2000, budget=32),
            row("ddtree-auto_8_32-c8-graphs-bs48", "DDTREE", 8, 2600, budget="auto:8,32")]
    for r in rows:
        r.walls = [1.0, 1.01]
    rows[4].walls = [1.0, 1.02]                    # 2% spread: 960 is 4% under 1000
    found = {t.what: t for t in speed.auto_targets(rows, (1, 8))}
    at1 = found["ddtree-auto_8_32-c8-graphs-bs48 >= max(NONE, DFLASH, best fixed tree) at 1 running requests"]
    assert not at1.met and "ddtree-b32-c8-graphs-bs48 1000" in at1.measured and "0.960x" in at1.measured
    rows[3].walls = [1.0, 1.05]                    # the rival's own spread 4.8%: within it
    assert {t.what: t for t in speed.auto_targets(rows, (1, 8))}[at1.what].met
    assert found["ddtree-auto_8_32-c8-graphs-bs48 >= max(NONE, DFLASH, best fixed tree) at 8 running requests"].met
    names = [c.name for c in speed.fixed_configs((8, 32), (False,), (7, 1), auto=(8, 32))]
    assert names[-1] == "ddtree-auto_8_32-c8-graphs-bs48"
    assert speed.servers.config(names[-1]).budget == "auto:8,32"


def test_a_rows_ddtree_metrics_are_kept_from_real_http_and_a_failed_scrape_is_skipped(tmp_path, capsys):
    """After each row the bench keeps the server's sglang:ddtree_* lines (which widths the policy ran) and SGLang's
    forward device seconds by category (the prefill's among them); here from a /metrics file served over loopback
    HTTP, then from the same server stopped."""
    import urllib.request

    from tests.file_source import Source

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "metrics").write_text(
        "# HELP sglang:ddtree_policy_steps_total steps\n"
        'sglang:ddtree_policy_steps_total{option="none"} 12.0\n'
        "sglang:num_running_reqs 3.0\n"
        'sglang:forward_execution_seconds_total{category="extend",model_name="m"} 1.5\n'
        'sglang:ddtree_cost_correction{option="b32",band="1"} 3.1\n')
    source = Source(tmp_path / "site").start()

    def scrape() -> str:
        with urllib.request.urlopen(f"{source.url}/metrics", timeout=5) as r:
            return r.read().decode()

    kept = tmp_path / "out" / "metrics" / "auto-8.prom"
    speed.save_row_metrics(scrape, kept)
    assert kept.read_text().splitlines() == ['sglang:ddtree_policy_steps_total{option="none"} 12.0',
                                             'sglang:forward_execution_seconds_total{category="extend",model_name="m"} 1.5',
                                             'sglang:ddtree_cost_correction{option="b32",band="1"} 3.1']
    source.stop()
    gone = tmp_path / "out" / "metrics" / "auto-16.prom"
    speed.save_row_metrics(scrape, gone)
    assert not gone.exists() and "metrics of auto-16 not read" in capsys.readouterr().out


def test_a_trace_that_fails_is_said_and_leaves_no_table(tmp_path, capsys, monkeypatch):
    """--trace is a diagnostic: a server that cannot be profiled (here nothing listens on its port) costs its trace,
    not the bench's later servers."""
    import tempfile

    from testbed import servers

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))              # where the profiler's raw trace would go

    server = servers.Server(servers.config("dflash-overlap-bs48"), 18517, tmp_path / "dflash.log")
    speed.trace_config(server, [256, 1, 2], tmp_path / "traces")
    assert "dflash-overlap-bs48: no trace (URLError" in capsys.readouterr().out
    assert not (tmp_path / "traces").exists()


def test_the_slower_pass_keeps_its_first_token_and_decode_step_split_and_the_report_prints_it(tmp_path):
    """A row keeps the ms before the first token and per decode step of its slower pass (SGLang's meta_info), so a
    per-request cost (the prefill) is told from the steps; the table shows them by load and is left out when no row
    has them."""
    from types import SimpleNamespace

    def answers(first: float, e2e_s: float) -> list[dict]:
        return [{"output_ids": [1, 2, 3, 4, 5],
                 "meta_info": {"spec_verify_ct": 2, "spec_accept_length": 2.0, "first_token_latency": first,
                               "e2e_latency": e2e_s}}]

    server = SimpleNamespace(config=speed.servers.config("dflash-bs48"))
    fast = speed.e2e.Measurement(answers(0.010, 0.030), 1.0, [0.03], None)
    slow = speed.e2e.Measurement(answers(0.100, 0.140), 2.0, [0.14], 0.004)
    got, _ = speed.slower_row(server, [fast, slow], 1, None)
    assert (got.first_token_ms, got.decode_step_ms) == (100.0, 20.0)          # the slower pass: (140 - 100) / 2
    assert (got.forward_ms, got.device_tokens_per_s) == (2.0, 1000.0)         # 4 ms of forwards / 2 steps; 4 / 4 ms
    older = row("none-bs48", "NONE", 1, 300)                                   # a row from before: no split
    text = speed.split_table([older, got], (1, 8))
    assert "| dflash-bs48 | 100.0 / 20.0 |  |" in text and "| none-bs48 |  |  |" in text
    assert speed.split_table([older], (1, 8)) == ""
    assert speed.SpeedRow(**json.loads(json.dumps(speed.asdict(got)))) == got  # results.json reads back

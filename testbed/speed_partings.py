"""The speed sweep's temperature-0 answers judged where they first part from NONE's, by the float32 referee.

The sweep (bench/sglang_speed.py) counts how many of a setting's greedy answers equal NONE's; on a bf16 target
that count says little by itself (2026-12-06, H100: SGLang's DFLASH equal on 12 of 24 answers, DDTREE on 14-16).
This tool reads the answers a sweep job saved (answers.json beside none_outputs.json), finds each answer's first
parting from NONE's answer to the same prompt, and asks the float32 model (weights rounded to bf16 as the export
serves them, referee.bf16_served_pair) about it: the token taken is its own argmax ("exact"), within a near tie of
NONE's token ("float32 tie", referee.NEAR_TIE), or neither ("real difference"). A lossless setting parts only at
ties, as SGLang's DFLASH (the control, judged the same way in the same job) does; a tree-mask fault parts where
the float32 model disagrees by far more. Only the first parting of an answer is judged: past it the contexts differ
and NONE's answer no longer says what plain decoding would do.

    PYTHONPATH=src:. python3 -m testbed.speed_partings --pair SPEED_DIR/pair/b16 JOB_OUT... [--loads 1,8]
        [--census]

--pair: the reference pair the sweep exported (bN with target/ and draft/; the prompt files two folders up, as
speed_sweep.sh train leaves them, or --prompt-files). JOB_OUT: the sweep's output folders (`fixed-off`,
`fixed-on`, `schedule`), NONE's answers read from whichever holds them. Prints a table per setting and load;
exits 1 when any answer parts at a real difference, 2 on bad input. --census also reads NONE's own answers with the
float32 model (teacher-forced): how many pass a step within NEAR_TIE of a tie, and how many float32's own greedy choice
parts from - what an equality count on this target can be expected to lose to rounding.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from testbed.referee import Parting, Referee, float32_parting

KINDS = ("exact", "float32 tie", "real difference")


@dataclass(frozen=True)
class SweepAnswers:
    """What the jobs saved: each speculative setting's answers by load, NONE's by overlap mode and load."""

    settings: dict[str, dict[int, list[list[int]]]]     # config -> load -> answers
    none: dict[str, list[list[int]]]                    # "on-1" / "off-8" ... -> NONE's answers


@dataclass
class SettingTally:
    """One setting at one load: its answers against NONE's."""

    config: str
    load: int
    answers: int = 0
    equal: int = 0
    kinds: Counter = field(default_factory=Counter)
    worst: Parting | None = None                        # the parting the float32 model disagrees with most

    def add(self, parting: Parting | None) -> None:
        self.answers += 1
        if parting is None:
            self.equal += 1
            return
        self.kinds[parting.kind] += 1
        if self.worst is None or parting.float32_gap > self.worst.float32_gap:
            self.worst = parting

    @property
    def real(self) -> int:
        return self.kinds["real difference"]


def first_parting(want: list[int], have: list[int]) -> int | None:
    """The first position where `have` leaves `want` (a shorter answer parts where it ends); None when equal."""
    for i, (w, h) in enumerate(zip(want, have)):
        if w != h:
            return i
    return None if len(want) == len(have) else min(len(want), len(have))


def judge_answer(referee: Referee, prompt: list[int], want: list[int], have: list[int]) -> Parting | None:
    at = first_parting(want, have)
    if at is None:
        return None
    if at >= min(len(want), len(have)):
        raise ValueError(f"an answer of {len(have)} tokens against NONE's {len(want)}: the sweep asks every request "
                         "for the same number with ignore_eos, so the files are not one job's")
    # the float32 verdict on the shared prefix; bf16_gap NaN: the sweep asks NONE for no log-probs
    return float32_parting(at, want[at], have[at], float("nan"), referee.logprobs(prompt + want[:at]))


def judge_setting(referee: Referee, config: str, load: int, prompts: list[list[int]], none: list[list[int]],
                  answers: list[list[int]]) -> SettingTally:
    if not (len(prompts) == len(none) == len(answers)):
        raise ValueError(f"{config} at load {load}: {len(answers)} answers, {len(none)} of NONE's, {len(prompts)} "
                         "prompts - the prompt files are not the ones the sweep used (--prompt-files)")
    tally = SettingTally(config, load)
    for prompt, want, have in zip(prompts, none, answers):
        tally.add(judge_answer(referee, prompt, want, have))
    return tally


def none_key(config: str, load: int) -> str:
    """NONE's answers of the setting's own overlap mode, as the sweep keys them."""
    from bench.sglang_speed import is_overlap, reference_key      # the sweep's own keys

    return reference_key(is_overlap(config), load)


def read_jobs(folders: list[Path]) -> SweepAnswers:
    from bench.sglang_speed import ANSWERS, NONE_ANSWERS

    settings: dict[str, dict[int, list[list[int]]]] = {}
    none: dict[str, list[list[int]]] = {}
    for folder in folders:
        if not (folder / ANSWERS).is_file() and not (folder / NONE_ANSWERS).is_file():
            raise FileNotFoundError(f"{folder} holds neither {ANSWERS} nor {NONE_ANSWERS}: name a sweep job's output "
                                    "folder (speed.tgz's ddtree-speed-out/fixed-off, fixed-on or schedule; jobs "
                                    "before 2026-12-06 saved no answers of their own)")
        if (folder / NONE_ANSWERS).is_file():
            none.update(json.loads((folder / NONE_ANSWERS).read_text()))
        if (folder / ANSWERS).is_file():
            for config, by_load in json.loads((folder / ANSWERS).read_text()).items():
                settings.setdefault(config, {}).update({int(k): v for k, v in by_load.items()})
    return SweepAnswers(settings, none)


def sweep_prompts(prompt_files: tuple[Path, Path], load: int) -> list[list[int]]:
    """The sweep's prompts at `load` (bench/sglang_speed.mixed_prompts over the pair's prompt files)."""
    from bench.sglang_speed import mixed_prompts, prompts_per_load

    heldout, seen = (json.loads(p.read_text()) for p in prompt_files)
    return mixed_prompts(heldout, seen, prompts_per_load(load))


def judge_sweep(referee: Referee, found: SweepAnswers, prompts: dict[int, list[list[int]]]) -> list[SettingTally]:
    """Every setting at every load of `prompts` (the sweep's prompts by load) that has answers beside NONE's."""
    out = []
    for config in sorted(found.settings):
        for load, on in prompts.items():
            answers = found.settings[config].get(load)
            none = found.none.get(none_key(config, load))
            if answers is None or none is None:
                continue
            out.append(judge_setting(referee, config, load, on, none, answers))
    return out


def table(tallies: list[SettingTally]) -> str:
    lines = ["| setting | load | equal to NONE | " + " | ".join(KINDS) + " | largest float32 gap at a parting |",
             "|---|---|---|---|---|---|---|"]
    for t in tallies:
        worst = f"{t.worst.float32_gap:.4f} (position {t.worst.position})" if t.worst else "-"
        lines.append(f"| {t.config} | {t.load} | {t.equal}/{t.answers} | "
                     + " | ".join(str(t.kinds[k]) for k in KINDS) + f" | {worst} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class AnswerTies:
    """NONE's answer read by the float32 model: how close to a tie its steps come, and where float32's own greedy
    choice first differs from it."""

    min_gap: float                  # the smallest float32 top-2 log-prob gap over the answer's tokens
    near_ties: int                  # steps whose top-2 gap is within referee.NEAR_TIE
    float32_parts_at: int | None    # the first step where float32's argmax is not NONE's token (None: never)


def answer_ties(target, prompt: list[int], answer: list[int]) -> AnswerTies:
    """One teacher-forced float32 pass over prompt + answer: the top-2 gap at each of the answer's steps."""
    import torch

    from testbed.referee import NEAR_TIE

    with torch.no_grad():
        logits = target.forward_sequence(torch.tensor([prompt + answer])).logits[0].float()   # [P + A, V]
    steps = torch.log_softmax(logits[len(prompt) - 1: len(prompt) - 1 + len(answer)], -1)     # [A, V]
    top = steps.topk(2, dim=-1)
    gaps = top.values[:, 0] - top.values[:, 1]                                                  # [A]
    differs = (top.indices[:, 0] != torch.tensor(answer)).nonzero()
    return AnswerTies(min_gap=float(gaps.min()), near_ties=int((gaps <= NEAR_TIE).sum()),
                      float32_parts_at=int(differs[0, 0]) if len(differs) else None)


def census(target, found: SweepAnswers, prompts: dict[int, list[list[int]]]) -> str:
    """How many of NONE's answers pass a near tie (what a temperature-0 equality count on this target can expect
    to part at), per overlap mode and load."""
    lines = ["| NONE's answers | answers | with a step within NEAR_TIE of a tie | float32's greedy parts from it |",
             "|---|---|---|---|"]
    for key in sorted(found.none):
        load = int(key.split("-")[1])
        if load not in prompts:
            continue
        ties = [answer_ties(target, p, a) for p, a in zip(prompts[load], found.none[key])]
        lines.append(f"| {key} | {len(ties)} | {sum(t.near_ties > 0 for t in ties)} | "
                     f"{sum(t.float32_parts_at is not None for t in ties)} |")
    return "\n".join(lines)


def loads_arg(text: str) -> tuple[int, ...]:
    try:
        loads = tuple(int(x) for x in text.split(","))
    except ValueError:
        loads = ()
    if not loads or min(loads) < 1:
        raise argparse.ArgumentTypeError(f"--loads {text!r}: give running-request counts the sweep measured, "
                                         "comma-separated, e.g. 1,8")
    return loads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jobs", nargs="+", type=Path, help="the sweep's job output folders")
    ap.add_argument("--pair", required=True, type=Path, help="the reference pair folder (bN: target/, draft/)")
    ap.add_argument("--prompt-files", nargs=2, type=Path, metavar=("HELDOUT", "TRAIN"),
                    help="the sweep's prompt files (default: heldout_prompts.json, train_prompts.json beside bN)")
    ap.add_argument("--loads", type=loads_arg, default=(1,), help="loads to judge (default 1)")
    ap.add_argument("--census", action="store_true",
                    help="also count the near ties along NONE's own answers (float32, teacher-forced)")
    args = ap.parse_args(argv)
    prompt_files = tuple(args.prompt_files or (args.pair.parent / "heldout_prompts.json",
                                               args.pair.parent / "train_prompts.json"))
    missing = [str(p) for p in (args.pair / "target" / "config.json", *prompt_files) if not p.is_file()]
    if missing:
        print(f"speed_partings: --pair {args.pair}: {', '.join(missing)} missing (give the pair's bN folder as "
              "speed_sweep.sh train leaves it, or --prompt-files)", file=sys.stderr)
        return 2
    try:
        found = read_jobs(args.jobs)
    except FileNotFoundError as err:
        print(f"speed_partings: {err}", file=sys.stderr)
        return 2
    from testbed.referee import bf16_served_pair, target_referee

    prompts = {load: sweep_prompts(prompt_files, load) for load in args.loads}
    target = bf16_served_pair(args.pair, "cpu").target.eval()
    referee = target_referee(target, "cpu")
    try:
        tallies = judge_sweep(referee, found, prompts)
    except ValueError as err:
        print(f"speed_partings: {err}", file=sys.stderr)
        return 2
    if args.census:
        print(census(target, found, prompts) + "\n")
    if not tallies and not args.census:
        print(f"speed_partings: no setting's answers at loads {args.loads} beside NONE's in {args.jobs}",
              file=sys.stderr)
        return 2
    if tallies:
        print(table(tallies))
    return 1 if any(t.real for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())

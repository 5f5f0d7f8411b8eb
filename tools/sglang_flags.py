"""Write SGLang's own command-line option table for preflight (issue 48): every option of `sglang serve`'s parser
(ServerArgs.add_cli_args), with its option strings, its dest and how many values it takes, so that the controller,
which has no SGLang, reads `k26_extra_args` as SGLang's parser would (prefixes, `=` forms, a flag inside a value).

    make sglang-flags      # runs this with the SGLang contract venv (the pinned sglang)

tests/sglang/test_extra_args.py keeps the table equal to the installed SGLang's parser and the controller's reading
equal to SGLang's own on a set of argument lists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "roles/k26_defaults/files/sglang-flags.json"


def table() -> dict:
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    options = [{"strings": list(a.option_strings), "dest": a.dest, "nargs": a.nargs}
               for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]  # noqa: SLF001
    return {"sglang": sglang.__version__, "allow_abbrev": parser.allow_abbrev,
            "options": sorted(options, key=lambda o: o["strings"][0])}


def text(t: dict) -> str:
    """One option a line (a diff after an SGLang bump shows each option that changed)."""
    rows = ",\n".join(json.dumps(o, sort_keys=True) for o in t["options"])
    return (f'{{"sglang": {json.dumps(t["sglang"])}, "allow_abbrev": {json.dumps(t["allow_abbrev"])}, '
            f'"options": [\n{rows}\n]}}\n')


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    t = table()
    out.write_text(text(t))
    print(f"{out}: {len(t['options'])} options of sglang {t['sglang']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

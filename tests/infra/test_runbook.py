"""docs/runbook.md's host commands, run as written on the sandbox host with its server running: every line of every
block marked `<!-- commands tested: tests/infra/test_runbook.py -->` must exit 0 and print something. The runbook's
other blocks name their own tests, which tests/serve/test_readme_commands.py holds to existing files."""

from __future__ import annotations

import re

from .conftest import ROOT, guest

RUNBOOK = (ROOT / "docs/runbook.md").read_text()
MARK = "<!-- commands tested: tests/infra/test_runbook.py -->\n```bash\n"


def host_commands() -> list[str]:
    blocks = [block.split("```", 1)[0] for block in RUNBOOK.split(MARK)[1:]]
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_runbook_has_each_incident():
    for incident in ("does not start", "Out of memory", "NCCL hangs", "Slow", "Wrong output"):
        assert re.search(rf"^#+ .*{incident}", RUNBOOK, flags=re.M), incident
    assert len(host_commands()) >= 5


def test_every_host_command_of_the_runbook_runs_on_the_sandbox(converged):
    for command in host_commands():
        r = guest(command, check=False)
        assert r.returncode == 0 and r.stdout.strip(), (command, r.stdout[-500:], r.stderr[-500:])

"""Test-only callback: SIGKILL this ansible-playbook at the start of task number K26_CRASH_AT
(1-based, counted over the whole run) or of the first task whose name contains K26_CRASH_AT_NAME,
the way an operator's Ctrl-C twice, an OOM kill or a lost
controller ends a run between two tasks. With K26_CRASH_NAMES=FILE it writes the name
of every task started, one per line, when the run ends.
Enabled by tests/infra/crash/run.py through ANSIBLE_CALLBACK_PLUGINS / ANSIBLE_CALLBACKS_ENABLED."""

from __future__ import annotations

import os
import signal
import sys

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: k26_crash
type: aggregate
short_description: kill the run at the start of task number K26_CRASH_AT (tests only)
description: Counts task starts; kills its own process group at the chosen one; writes their names.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "k26_crash"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.started = 0
        self.names: list[str] = []
        at = os.environ.get("K26_CRASH_AT", "")
        self.at = int(at) if at.isdigit() else 0
        self.at_name = os.environ.get("K26_CRASH_AT_NAME", "")

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.started += 1
        self.names.append(f"{task.get_name()}".replace("\n", " "))
        if (self.at and self.started == self.at) or (self.at_name and self.at_name in task.get_name()):
            self._display.display(f"k26_crash: killed at task start {self.started}: {task.get_name()}")
            sys.stdout.flush()
            os.killpg(os.getpgrp(), signal.SIGKILL)

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("K26_CRASH_NAMES")
        if path:
            with open(path, "w") as fh:
                fh.write("".join(f"{name}\n" for name in self.names))

"""Test-only callback: interrupt this ansible-playbook at the start of task number K26_CRASH_AT
(1-based, counted over the whole run) or of the K26_CRASH_AT_NAME_NTH-th (default first) task whose
name contains K26_CRASH_AT_NAME.

K26_CRASH_MODE chooses how:
- kill (default): SIGKILL of the run's whole process group, the way an operator's Ctrl-C twice, an
  OOM kill or a lost controller ends a run between two tasks;
- ssh-drop: K26_CRASH_DROP_DELAY seconds after the task started (its module running on the host),
  run K26_CRASH_DROP_CMD (the harness passes a command that kills the hosts' sshd sessions): the
  controller's connections die mid-task, Ansible calls the host unreachable and the run goes on
  without it, as when the network between controller and host fails.
With K26_CRASH_AT_ITEM=N (kill mode) the chosen task is not interrupted at its start but after the result of its
N-th loop item, in the middle of a looped task (the items before it done, the rest not).
With K26_CRASH_NAMES=FILE it writes the name of every task started, one per line, when the run ends.
Enabled by tests/infra/crash/harness.py through ANSIBLE_CALLBACK_PLUGINS / ANSIBLE_CALLBACKS_ENABLED."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: k26_crash
type: aggregate
short_description: interrupt the run at the start of task number K26_CRASH_AT (tests only)
description: Counts task starts; kills its own process group or drops the hosts' SSH sessions at the chosen one.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "k26_crash"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.started = 0
        self.fired = False
        self.names: list[str] = []
        at = os.environ.get("K26_CRASH_AT", "")
        self.at = int(at) if at.isdigit() else 0
        self.at_name = os.environ.get("K26_CRASH_AT_NAME", "")
        self.nth = int(os.environ.get("K26_CRASH_AT_NAME_NTH", "1"))   # the nth task of that name (a later host's)
        self.seen = 0
        self.mode = os.environ.get("K26_CRASH_MODE", "kill")
        self.drop_cmd = shlex.split(os.environ.get("K26_CRASH_DROP_CMD", ""))
        self.drop_delay = float(os.environ.get("K26_CRASH_DROP_DELAY", "1.0"))
        item = os.environ.get("K26_CRASH_AT_ITEM", "")
        self.at_item = int(item) if item.isdigit() else 0
        self.armed = ""          # the chosen looped task's name while its items are counted
        self.items = 0

    def _chosen(self, name: str) -> bool:
        if self.fired:
            return False
        if self.at_name and self.at_name in name:
            self.seen += 1
            return self.seen == self.nth
        return bool(self.at and self.started == self.at)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.armed = ""          # a looped task that ended before its chosen item: nothing killed
        self.started += 1
        name = f"{task.get_name()}".replace("\n", " ")
        self.names.append(name)
        if not self._chosen(name):
            return
        self.fired = True
        if self.at_item and self.mode == "kill":
            self.armed, self.items = name, 0
            self._display.display(f"k26_crash: task start {self.started} ({name}): killing after its item {self.at_item}")
            return
        if self.mode == "ssh-drop":
            self._display.display(f"k26_crash: dropping the SSH sessions {self.drop_delay:g} s into task start {self.started}: {name}")
            threading.Timer(self.drop_delay, self._drop).start()
            return
        self._display.display(f"k26_crash: killed at task start {self.started}: {name}")
        sys.stdout.flush()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    def _item_done(self, result) -> None:
        if not self.armed:
            return
        self.items += 1
        if self.items == self.at_item:
            self._display.display(f"k26_crash: killed after item {self.items} of task start {self.started}: {self.armed}")
            sys.stdout.flush()
            os.killpg(os.getpgrp(), signal.SIGKILL)

    def v2_runner_item_on_ok(self, result):
        self._item_done(result)

    def v2_runner_item_on_failed(self, result):
        self._item_done(result)

    def v2_runner_item_on_skipped(self, result):
        self._item_done(result)

    def _drop(self) -> None:
        done = subprocess.run(self.drop_cmd, capture_output=True, text=True, check=False)
        self._display.display(f"k26_crash: dropped (rc {done.returncode})")

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("K26_CRASH_NAMES")
        if path:
            with open(path, "w") as fh:
                fh.write("".join(f"{name}\n" for name in self.names))

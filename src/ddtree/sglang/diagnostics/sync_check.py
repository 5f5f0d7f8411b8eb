"""SGLANG_DDTREE_SYNC_CHECK=warn|error: each DDTREE decode step under torch.cuda.set_sync_debug_mode (issue 35).

Under the overlap scheduler the host prepares step n + 1 while the device runs step n; an operation in the step
that waits for the device (`.item()`, `.tolist()`, `.cpu()`, a data-dependent shape) stalls that. With this
variable set, a decode step runs with torch's CUDA sync debug mode:
  warn   each synchronising operation is logged once per call site, as
         "DDTREE sync check: a synchronizing CUDA operation at FILE:LINE" (the Python line that called it,
         this project's or SGLang's), and the step goes on;
  error  the first one raises (the request fails, the server logs the stack).
A diagnostics mode, off by default. Steps of a batch with a grammar or a custom logit processor wait for the
device by design (the host builds or reads the tree); they are not checked.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch

from ddtree import switches

ENV = switches.NAME["sync_check"]
MODES = ("warn", "error")
MARK = "DDTREE sync check: a synchronizing CUDA operation at"
logger = logging.getLogger(__name__)


class SyncCheck:
    def __init__(self, mode: str):
        if mode not in MODES:
            raise ValueError(f"{ENV}={mode!r} is invalid: expected one of {', '.join(MODES)} (or unset)")
        self.mode = mode
        self.seen: set[tuple[str, int]] = set()

    @classmethod
    def from_switches(cls, read: switches.Switches) -> SyncCheck | None:
        return cls(read.sync_check) if read.sync_check else None

    @contextlib.contextmanager
    def step(self):
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(self.mode)
        try:
            if self.mode == "error":
                yield
                return
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield
            self.report(caught)
        finally:
            torch.cuda.set_sync_debug_mode(previous)

    def report(self, caught) -> None:
        for w in caught:
            if "synchroniz" not in str(w.message):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)    # not ours: pass it on
                continue
            site = (w.filename, w.lineno)
            if site not in self.seen:
                self.seen.add(site)
                logger.warning("%s %s:%d", MARK, w.filename, w.lineno)

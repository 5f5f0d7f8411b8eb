"""DDTree speculative decoding: exact draft trees and lossless verification.

Public API (stable): build_tree, verify_tree, DraftTree, Verdict, loaded on first use (PEP 562), so that
`import ddtree.settings` - plain Python - imports no torch (the sweep report reads the schedule type on a
controller without it). The SGLang plugin lives in ddtree.sglang and imports SGLang only when SGLang's plugin
loader calls it.
"""

from __future__ import annotations

import importlib

_PUBLIC = {"build_tree": "ddtree.tree", "DraftTree": "ddtree.types", "Verdict": "ddtree.types",
           "verify_tree": "ddtree.verify"}

__all__ = ["DraftTree", "Verdict", "build_tree", "verify_tree"]
__version__ = "0.3.0"


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'ddtree' has no attribute {name!r}")

"""DDTree speculative decoding: exact draft trees and lossless verification.

Public API (stable): build_tree, verify_tree, DraftTree, Verdict. Importing this package has no
side effects beyond importing torch; the SGLang plugin lives in ddtree.sglang and imports SGLang
only when SGLang's plugin loader calls it.
"""

from ddtree.tree import build_tree
from ddtree.types import DraftTree, Verdict
from ddtree.verify import verify_tree

__all__ = ["DraftTree", "Verdict", "build_tree", "verify_tree"]
__version__ = "0.3.0"

"""Build, once, the SGLang JIT kernels the DDTREE plugin calls, so the first start does not.

    python -m ddtree.tools.jit_warmup

Run as the service user with the service's cache variables (the gpu_host role does): it calls
SGLang 0.5.23's tree kernels (verify_tree_greedy; tree_speculative_sampling_target_only) once on
a tiny two-request tree, which compiles them into the caches (TVM_FFI_CACHE_DIR / SGLANG_CACHE_DIR,
FlashInfer's headers). Prints 'built ...' with the seconds it took; exits 2 without a CUDA GPU or
without SGLang, naming what is missing.
"""

from __future__ import annotations

import sys
import time


def tiny_tree(device):
    """Two requests, width 3: a root with two children (EAGLE layout, flat b*N + i indices)."""
    import torch

    bs, n = 2, 3
    i64 = dict(dtype=torch.int64, device=device)
    candidates = torch.tensor([[5, 6, 7], [5, 6, 7]], **i64)
    retrive_index = torch.arange(bs * n, **i64).view(bs, n)
    retrive_next_token = torch.tensor([[1, -1, -1], [1, -1, -1]], **i64)
    retrive_next_sibling = torch.tensor([[-1, 2, -1], [-1, 2, -1]], **i64)
    return bs, n, candidates, retrive_index, retrive_next_token, retrive_next_sibling


def main(argv=None) -> int:
    try:
        import torch
        from sglang.kernels.ops.speculative.tree import verify_tree_greedy
    except ImportError as err:
        print(f"jit_warmup: SGLang's tree kernels are not importable ({err}): run it in the service venv",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("jit_warmup: no CUDA GPU visible: nothing to build here", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    start = time.perf_counter()
    bs, n, cand, index, next_token, next_sibling = tiny_tree(dev)
    predicts = torch.zeros(bs * n, dtype=torch.int32, device=dev)
    accept_index = torch.full((bs, 2), -1, dtype=torch.int32, device=dev)   # depth 1 + the root
    accept_num = torch.zeros(bs, dtype=torch.int32, device=dev)
    target = torch.tensor([[6, 9, 9], [7, 9, 9]], dtype=torch.int64, device=dev)
    # positional, as tests/gpu/test_sglang_kernels.py calls it against the pinned wheels
    verify_tree_greedy(predicts, accept_index, accept_num, cand, index, next_token, next_sibling, target)
    torch.cuda.synchronize()
    built = ["verify_tree_greedy"]
    try:
        from sglang.kernels.ops.speculative.sampling import tree_speculative_sampling_target_only
    except ImportError:
        tree_speculative_sampling_target_only = None
    if tree_speculative_sampling_target_only is not None:
        vocab = 16
        probs = torch.softmax(torch.randn(bs, n, vocab, device=dev), -1)
        tree_speculative_sampling_target_only(
            predicts, accept_index, accept_num, cand, index, next_token, next_sibling,
            torch.rand(bs, n, device=dev), torch.rand(bs, device=dev), probs, torch.zeros_like(probs),
            threshold_single=1.0, threshold_acc=1.0, deterministic=True)
        torch.cuda.synchronize()
        built.append("tree_speculative_sampling_target_only")
    print(f"built {', '.join(built)} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

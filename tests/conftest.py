"""Shared pytest configuration.

Without CUDA, GPU tests are skipped and Triton kernels run in Triton's CPU interpreter (the
variable must be set before Triton is first imported, hence here).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the lent H200 through the device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

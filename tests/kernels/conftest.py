"""Kernel tests: CPU tests check each torch reference against an independent naive formulation;
`gpu` tests check each Triton kernel against its reference on random odd-shaped input.

`gpu` tests run on CUDA; without a GPU they are skipped, unless TRITON_INTERPRET=1 is set and
triton is installed, in which case the kernels run in Triton's interpreter on CPU tensors (slow,
but it catches indexing bugs without a GPU).
"""

from __future__ import annotations

import pytest
import torch

from shardline.kernels import _dispatch


@pytest.fixture
def device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if _dispatch.TRITON_INTERPRET and _dispatch.triton_available():
        return "cpu"
    pytest.skip("needs a CUDA GPU: the Triton kernel is compared with its reference there "
                "(or set TRITON_INTERPRET=1 with triton installed to run it interpreted)")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)

"""Where the Triton kernel tests run: a CUDA GPU (bf16, `-m gpu`), or the CPU under
TRITON_INTERPRET=1 (float32: the interpreter loads masked bf16 lanes as their raw bits)."""

import os
from typing import TypedDict

import pytest
import torch


class Tolerance(TypedDict, total=False):
    """Keyword arguments of torch.testing.assert_close (none: its defaults for the dtype)."""

    atol: float
    rtol: float


def kernel_device() -> str | None:
    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else None


KERNEL_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(kernel_device() is None, reason="needs a CUDA GPU (or TRITON_INTERPRET=1)"),
]

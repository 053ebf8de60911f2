"""Checks every kernel launcher runs before a launch: a wrong shape, stride or dtype is a clear
ValueError here instead of silent garbage (or a hang) inside a kernel that reads peers' memory.
"""

import torch
from torch import Tensor

__all__ = ["check_message"]


def check_message(x: Tensor, device: torch.device, dtype: torch.dtype, max_bytes: int) -> None:
    """A message for a collective kernel: on `device`, of `dtype`, contiguous, within the
    symmetric buffer, and 16-byte aligned (the kernels move 16 bytes per access)."""
    if x.device != device:
        raise ValueError(f"the message is on {x.device}, the kernel's buffers on {device}")
    if x.dtype != dtype:
        raise ValueError(f"the message is {x.dtype}; this kernel was built for {dtype}")
    if not x.is_contiguous():
        raise ValueError(f"the message must be contiguous (strides {x.stride()})")
    size = x.numel() * x.element_size()
    if size > max_bytes:
        raise ValueError(f"the message ({size} bytes) exceeds the buffer ({max_bytes} bytes)")
    if x.data_ptr() % 16:
        raise ValueError("the message must start on a 16-byte boundary")

"""Every rank's buffer mapped into this process through torch symmetric memory: what the peer
kernels (Triton) and the overlapped GEMMs (copy engines) both build on."""

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["rendezvous_buffers"]


def rendezvous_buffers(
    group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype, elements: int
) -> tuple[Tensor, tuple[Tensor, ...], Any]:
    """Our buffer of `elements` in symmetric memory, every rank's buffer as seen from here (in
    rank order), and the rendezvous handle (signal pads, barrier). Collective: every rank of
    `group` calls it alike."""
    import torch.distributed._symmetric_memory as symmetric_memory  # GPU builds only need it

    if hasattr(symmetric_memory, "enable_symm_mem_for_group"):  # needed before torch 2.10
        symmetric_memory.enable_symm_mem_for_group(group.group_name)
    own = symmetric_memory.empty(elements, dtype=dtype, device=device)
    handle = symmetric_memory.rendezvous(own, group.group_name)
    every_rank = tuple(
        handle.get_buffer(peer, (elements,), dtype) for peer in range(dist.get_world_size(group))
    )
    return own, every_rank, handle

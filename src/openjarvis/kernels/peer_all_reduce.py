"""A one-shot all-reduce for decode-sized messages: every GPU reads every peer's copy straight
from its memory (torch symmetric memory, over NVLink) and sums; no NCCL, no multicast.

Needs CUDA and Triton; all_reduce.py imports this module only where both exist.
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symmetric_memory
import triton
import triton.language as tl
from torch import Tensor

from openjarvis.kernels.checks import check_message

__all__ = ["PeerAllReduce"]

MAX_WORLD_SIZE = 8  # one NVLink domain of a typical server
_OLD_PAD_BYTES = 2048  # torch's signal pad before its size became configurable
_BLOCK = 2048  # elements per program per iteration: 16 bytes per thread with 4 warps of bf16

# One thread per program signals and waits; the rest of the program waits at a bar.sync.
# The signal protocol flips a peer's slot 0 -> 1 (send) and our own slot 1 -> 0 (wait), so
# every slot is back to 0 after each barrier: nothing to reset, and CUDA graphs replay it.
# Release on send publishes this program's earlier writes (ordered by the bar.sync before it)
# system-wide; acquire on wait makes the peer's writes visible to the reads that follow.
_SEND = tl.constexpr("""
{
    .reg .u32 %thread, %old;
    .reg .pred %skip, %done;
    mov.u32 %thread, %tid.x;
    setp.ne.u32 %skip, %thread, 0;
    @%skip bra SEND_END;
SEND_AGAIN:
    atom.release.sys.global.cas.b32 %old, [$1], 0, 1;
    setp.eq.u32 %done, %old, 0;
    @!%done bra SEND_AGAIN;
SEND_END:
    mov.u32 $0, 0;
}
""")
_WAIT = tl.constexpr("""
{
    .reg .u32 %thread, %old;
    .reg .pred %skip, %done;
    mov.u32 %thread, %tid.x;
    setp.ne.u32 %skip, %thread, 0;
    @%skip bra WAIT_END;
WAIT_AGAIN:
    atom.acquire.sys.global.cas.b32 %old, [$1], 1, 0;
    setp.eq.u32 %done, %old, 1;
    @!%done bra WAIT_AGAIN;
WAIT_END:
    mov.u32 $0, 0;
}
""")


@triton.jit
def _send(address):
    tl.inline_asm_elementwise(_SEND, "=r,l", [address], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait(address):
    tl.inline_asm_elementwise(_WAIT, "=r,l", [address], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _barrier(pads, program, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Program `program` of every rank meets here; slot (program, peer) of each rank's pad."""
    tl.debug_barrier()
    own = tl.load(pads + RANK).to(tl.pointer_type(tl.uint32))
    for peer in tl.static_range(WORLD):
        peer_pad = tl.load(pads + peer).to(tl.pointer_type(tl.uint32))
        _send(peer_pad + program * WORLD + RANK)
    for peer in tl.static_range(WORLD):
        _wait(own + program * WORLD + peer)
    tl.debug_barrier()


@triton.jit
def _one_shot_all_reduce(
    data,  # [numel], in place: our input, then the sum
    # Each rank's symmetric buffer [>= numel], as pointer arguments rather than addresses read
    # from memory: Triton then knows their alignment and issues 16-byte loads.
    buffers,
    pads,  # [WORLD] int64 addresses of each rank's signal pad (uint32 slots)
    numel,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    own = buffers[RANK]
    # 1. Publish our input in our own buffer (the chunks this program will sum on every rank).
    for start in range(program * BLOCK, numel, programs * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < numel
        tl.store(own + offsets, tl.load(data + offsets, mask=mask), mask=mask)
    _barrier(pads, program, RANK, WORLD)
    # 2. Sum every rank's copy in rank order, so that all ranks get bit-identical results.
    for start in range(program * BLOCK, numel, programs * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < numel
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for peer in tl.static_range(WORLD):
            buffer = buffers[peer]
            # .cg: skip L1, so no line cached by an earlier call is read back stale.
            total += tl.load(buffer + offsets, mask=mask, cache_modifier=".cg").to(tl.float32)
        tl.store(data + offsets, total.to(data.dtype.element_ty), mask=mask)
    # 3. No rank may overwrite its buffer (next call) before every peer has read it.
    _barrier(pads, program, RANK, WORLD)


class PeerAllReduce:
    """In-place sum over the group, for messages up to `max_bytes`, launched after checks."""

    def __init__(
        self, group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype, max_bytes: int
    ) -> None:
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if self.world_size > MAX_WORLD_SIZE:
            raise ValueError(f"the peer all-reduce supports up to {MAX_WORLD_SIZE} GPUs")
        self.device = device
        self.dtype = dtype
        self.max_bytes = max_bytes
        element = torch.finfo(dtype).bits // 8
        if hasattr(symmetric_memory, "enable_symm_mem_for_group"):  # needed before torch 2.10
            symmetric_memory.enable_symm_mem_for_group(group.group_name)
        self.buffer = symmetric_memory.empty(max_bytes // element, dtype=dtype, device=device)
        handle = symmetric_memory.rendezvous(self.buffer, group.group_name)
        self.buffers = tuple(
            handle.get_buffer(peer, (max_bytes // element,), dtype)
            for peer in range(self.world_size)
        )
        self.pads = torch.tensor(handle.signal_pad_ptrs, dtype=torch.int64, device=device)
        pad_bytes = getattr(symmetric_memory, "get_signal_pad_size", lambda: _OLD_PAD_BYTES)()
        pad_slots = pad_bytes // 4
        # Two barriers per call share one slot per (program, peer).
        self.max_programs = min(132, pad_slots // self.world_size)

    def __call__(self, x: Tensor) -> Tensor:
        check_message(x, self.device, self.dtype, self.max_bytes)
        numel = x.numel()
        programs = min(triton.cdiv(numel, _BLOCK), self.max_programs)
        _one_shot_all_reduce[(programs,)](
            x, self.buffers, self.pads, numel,
            RANK=self.rank, WORLD=self.world_size, BLOCK=_BLOCK, num_warps=4,
        )  # fmt: skip
        return x

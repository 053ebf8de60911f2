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
from openjarvis.kernels.symmetric import rendezvous_buffers

__all__ = ["MAX_WORLD_SIZE", "PeerAllReduce", "signal_pad_bytes", "symmetric_buffers"]

MAX_WORLD_SIZE = 8  # one NVLink domain of a typical server
_OLD_PAD_BYTES = 2048  # torch's signal pad before its size became configurable
_BLOCK = 2048  # elements per program per iteration: 16 bytes per thread with 4 warps of bf16

# One barrier per call. Each program counts its calls (its epoch, kept in our own memory) and
# every rank's program p makes the same calls, so epochs agree across ranks without any reset,
# and CUDA graph replays just count on. Thread t < WORLD handles peer t: it stores our epoch
# into our column of the peer's pad (release: after the bar.sync before it, every thread's
# copy into our buffer is visible system-wide first), then waits until the peer's epoch in our
# pad has caught up (acquire: the peer's copy is visible to the reads after the next bar.sync).
# A peer may already be one call ahead, hence "at least", compared modulo 2**32.
_SEND = tl.constexpr("""
{
    .reg .u32 %thread;
    .reg .u64 %entry, %pad;
    .reg .pred %idle;
    mov.u32 %thread, %tid.x;
    setp.ge.u32 %idle, %thread, $3;
    @%idle bra SEND_END;
    mul.wide.u32 %entry, %thread, 8;
    add.u64 %entry, %entry, $1;
    ld.global.u64 %pad, [%entry];
    mul.wide.u32 %entry, $2, 4;
    add.u64 %pad, %pad, %entry;
    st.release.sys.global.u32 [%pad], $4;
SEND_END:
    mov.u32 $0, 0;
}
""")
_WAIT = tl.constexpr("""
{
    .reg .u32 %thread, %seen;
    .reg .s32 %behind;
    .reg .u64 %slot;
    .reg .pred %idle, %early;
    mov.u32 %thread, %tid.x;
    setp.ge.u32 %idle, %thread, $3;
    @%idle bra WAIT_END;
    add.u32 %thread, %thread, $2;
    mul.wide.u32 %slot, %thread, 4;
    add.u64 %slot, %slot, $1;
WAIT_AGAIN:
    ld.acquire.sys.global.u32 %seen, [%slot];
    sub.s32 %behind, %seen, $4;
    setp.lt.s32 %early, %behind, 0;
    @%early bra WAIT_AGAIN;
WAIT_END:
    mov.u32 $0, 0;
}
""")


@triton.jit
def _barrier(pads, program, epoch, RANK: tl.constexpr, WORLD: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    """Program `program` of every rank meets here, at call `epoch` of that program."""
    tl.debug_barrier()
    own = tl.load(pads + RANK)
    tl.inline_asm_elementwise(
        _SEND, "=r,l,r,r,r", [pads, program * WORLD + RANK, WORLD, epoch],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip
    tl.inline_asm_elementwise(
        _WAIT, "=r,l,r,r,r", [own, program * WORLD, WORLD, epoch],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip
    tl.debug_barrier()


@triton.jit
def _one_shot_all_reduce(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    data,  # [numel], in place: our input, then the sum
    # Each rank's symmetric buffer [2, capacity], as pointer arguments rather than addresses
    # read from memory: Triton then knows their alignment and issues 16-byte loads.
    buffers,
    pads,  # [WORLD] int64 addresses of each rank's signal pad (uint32 slots)
    epochs,  # [programs_max] int32 in our own memory: calls made so far by each program
    numel,
    capacity,  # elements per half of a buffer
    programs_max,  # chunk c always belongs to program c % programs_max, whatever the size
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    program = tl.program_id(0)
    epoch = tl.load(epochs + program) + 1
    # Calls alternate between the halves of the buffers. A rank can be at most one call ahead
    # of a peer (the barrier), so it never writes the half that the peer may still be reading.
    half = (epoch & 1) * capacity
    own = buffers[RANK] + half
    # 1. Publish our input in our own buffer (the chunks this program sums on every rank).
    for start in range(program * BLOCK, numel, programs_max * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < numel
        tl.store(own + offsets, tl.load(data + offsets, mask=mask), mask=mask)
    _barrier(pads, program, epoch, RANK, WORLD)
    # 2. Sum every rank's copy in rank order, so that all ranks get bit-identical results.
    for start in range(program * BLOCK, numel, programs_max * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < numel
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for peer in tl.static_range(WORLD):
            buffer = buffers[peer] + half
            # .cg: skip L1, so no line cached by an earlier call is read back stale.
            total += tl.load(buffer + offsets, mask=mask, cache_modifier=".cg").to(tl.float32)
        tl.store(data + offsets, total.to(data.dtype.element_ty), mask=mask)
    tl.store(epochs + program, epoch)


def signal_pad_bytes() -> int:
    """Bytes of each rank's signal pad in a symmetric-memory allocation."""
    return int(getattr(symmetric_memory, "get_signal_pad_size", lambda: _OLD_PAD_BYTES)())


def symmetric_buffers(
    group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype, elements: int
) -> tuple[Tensor, tuple[Tensor, ...], Tensor]:
    """Our buffer of `elements` in symmetric memory, every rank's buffer as seen from here (in
    rank order), and the addresses of every rank's signal pad ([WORLD] int64 on `device`)."""
    if dist.get_world_size(group) > MAX_WORLD_SIZE:
        raise ValueError(f"the peer kernels support up to {MAX_WORLD_SIZE} GPUs")
    own, buffers, handle = rendezvous_buffers(group, device, dtype, elements)
    pads = torch.tensor(handle.signal_pad_ptrs, dtype=torch.int64, device=device)
    return own, buffers, pads


class PeerAllReduce:
    """In-place sum over the group, for messages up to `max_bytes`, launched after checks."""

    def __init__(
        self, group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype, max_bytes: int
    ) -> None:
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = device
        self.dtype = dtype
        self.max_bytes = max_bytes
        self.capacity = max_bytes // (torch.finfo(dtype).bits // 8)
        self.buffer, self.buffers, self.pads = symmetric_buffers(
            group, device, dtype, 2 * self.capacity
        )
        # One uint32 slot per (program, peer) in each pad, zeroed by torch at allocation; at most
        # one program per SM of this GPU.
        sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        self.programs_max = min(sm_count, signal_pad_bytes() // 4 // self.world_size)
        self.epochs = torch.zeros(self.programs_max, dtype=torch.int32, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        check_message(x, self.device, self.dtype, self.max_bytes)
        numel = x.numel()
        programs = min(triton.cdiv(numel, _BLOCK), self.programs_max)
        _one_shot_all_reduce[(programs,)](
            x, self.buffers, self.pads, self.epochs, numel, self.capacity, self.programs_max,
            RANK=self.rank, WORLD=self.world_size, BLOCK=_BLOCK, num_warps=4,
        )  # fmt: skip
        return x

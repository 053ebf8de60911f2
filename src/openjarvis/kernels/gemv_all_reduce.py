"""A decode GEMV fused with its all-reduce: a row-parallel layer's y = sum over ranks of
W_r @ x_r, in one kernel. Each program computes a block of rows of its partial product, puts it
in its own symmetric buffer, meets the same program of every peer at one barrier, and sums
everyone's block in rank order: no separate all-reduce launch, and blocks that finish early
exchange while others still read weights.

Needs CUDA and Triton; the peer barrier is peer_all_reduce's (one per call, counted epochs,
two buffer halves). Partials travel in float32, so the sum rounds once, to the output dtype.

The engine calls it through one registered torch operator (torch.compile traces around it) and
only for the shapes where DecodeGemvs timed it faster than the GEMV followed by the all-reduce.
"""

from collections.abc import Callable
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from openjarvis.kernels.all_reduce import graph_call_us
from openjarvis.kernels.handles import Handles
from openjarvis.kernels.peer_all_reduce import _barrier, signal_pad_bytes, symmetric_buffers

__all__ = ["DecodeGemvs", "GemvAllReduce", "gemv_rows_per_program"]

_TILE = 8192  # weight elements a program loads per step: 64 per thread with 4 warps


@triton.jit
def _gemv_all_reduce(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    x,  # [K] this rank's slice of the input
    weight,  # [N, K], rows `stride_n` apart: this rank's columns of the layer's weight
    out,  # [N] the reduced result
    buffers,  # each rank's symmetric float32 buffer [2, capacity], as WORLD pointers
    pads,  # [WORLD] int64 addresses of each rank's signal pad
    epochs,  # [programs] int32 in our own memory: calls made so far by each program
    n,
    k,
    stride_n,
    capacity,  # elements per half of a buffer (>= n)
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    program = tl.program_id(0)
    rows = program * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    partial = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        columns = start + tl.arange(0, BLOCK_K)
        column_mask = columns < k
        w = tl.load(
            weight + rows[:, None] * stride_n + columns[None, :],
            mask=row_mask[:, None] & column_mask[None, :],
            other=0.0,
            eviction_policy="evict_first",  # read once per token: keep L2 for the rest
        )
        v = tl.load(x + columns, mask=column_mask, other=0.0)
        partial += tl.sum(w.to(tl.float32) * v.to(tl.float32)[None, :], axis=1)
    if WORLD == 1:
        total = partial
    else:
        # Row r always belongs to program r // BLOCK_N, whatever n is, so each program's
        # epochs and buffer halves cover the same rows on every call (peer_all_reduce.py).
        epoch = tl.load(epochs + program) + 1
        half = (epoch & 1) * capacity
        tl.store(buffers[RANK] + half + rows, partial, mask=row_mask)
        _barrier(pads, program, epoch, RANK, WORLD)
        total = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for peer in tl.static_range(WORLD):
            buffer = buffers[peer] + half
            total += tl.load(buffer + rows, mask=row_mask, cache_modifier=".cg")
        tl.store(epochs + program, epoch)
    tl.store(out + rows, total.to(out.dtype.element_ty), mask=row_mask)


def gemv_rows_per_program(n: int, programs_max: int) -> int:
    """The smallest power-of-two block of rows (at least 16) that needs at most programs_max
    programs for n rows: more programs read the weights with more SMs. Fixed per instance
    (from its largest n), so that a row always belongs to the same program."""
    rows = 16
    while triton.cdiv(n, rows) > programs_max:
        rows *= 2
    return rows


# The operator finds its GemvAllReduce from an integer; the caller owns the object (weakly listed).
_HANDLES: Handles["GemvAllReduce"] = Handles("GemvAllReduce")


@torch.library.custom_op("openjarvis::gemv_all_reduce", mutates_args=())
def _gemv_all_reduce_op(x: Tensor, weight: Tensor, instance: int) -> Tensor:
    return _HANDLES.get(instance)(x, weight)


@_gemv_all_reduce_op.register_fake
def _(x: Tensor, weight: Tensor, instance: int) -> Tensor:
    return weight.new_empty(weight.shape[0])


class GemvAllReduce:
    """out = sum over the group of weight_r @ x_r for one token (decode), built before graph
    capture on every rank alike, for outputs of up to `max_rows` elements. Calls that share an
    instance must share their number of rows (a row belongs to the same program every call)."""

    def __init__(
        self, group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype, max_rows: int
    ) -> None:
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = device
        self.dtype = dtype
        self.capacity = max_rows
        self.buffer, self.buffers, self.pads = symmetric_buffers(
            group, device, torch.float32, 2 * max_rows
        )
        programs_max = signal_pad_bytes() // 4 // self.world_size
        self.block_n = gemv_rows_per_program(max_rows, programs_max)
        self.epochs = torch.zeros(programs_max, dtype=torch.int32, device=device)
        self.instance = _HANDLES.add(self)

    def op(self, x: Tensor, weight: Tensor) -> Tensor:
        """The same product through the registered operator (what a compiled model calls)."""
        return torch.ops.openjarvis.gemv_all_reduce(x, weight, self.instance)

    def __call__(self, x: Tensor, weight: Tensor, out: Tensor | None = None) -> Tensor:
        """x of K elements (any shape), weight [N, K] with unit column stride -> out [N]."""
        x = x.reshape(-1).contiguous()
        n, k = weight.shape
        if x.numel() != k or weight.stride(1) != 1:
            raise ValueError(
                f"need x of {k} elements and a row-major weight; got x of {x.numel()}, "
                f"weight stride {weight.stride()}"
            )
        if n > self.capacity:
            raise ValueError(f"{n} output rows exceed this op's buffers ({self.capacity})")
        for name, tensor in (("x", x), ("weight", weight)):
            if tensor.device != self.device or tensor.dtype != self.dtype:
                raise ValueError(
                    f"{name} is {tensor.dtype} on {tensor.device}; "
                    f"this op was built for {self.dtype} on {self.device}"
                )
        out = torch.empty(n, dtype=self.dtype, device=self.device) if out is None else out
        _gemv_all_reduce[(triton.cdiv(n, self.block_n),)](
            x, weight, out, self.buffers, self.pads, self.epochs, n, k, weight.stride(0),
            self.capacity, RANK=self.rank, WORLD=self.world_size, BLOCK_N=self.block_n,
            BLOCK_K=max(64, _TILE // self.block_n), num_warps=4,
        )  # fmt: skip
        return out


class DecodeGemvs:
    """The fused decode product for each row-parallel shape where it pays: `for_shape(n, k)`
    times one token's product both ways in a CUDA graph (the GEMV then `all_reduce`, against
    the fused kernel), averaged over the ranks so that all choose alike, and returns the fused
    operator where it was faster ("auto"), always ("on"), or None. Every rank calls it with
    the same shapes in the same order (the timings and buffers are collective)."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        device: torch.device,
        dtype: torch.dtype,
        all_reduce: Callable[[Tensor], Tensor],
        choice: Literal["auto", "on"] = "auto",
    ) -> None:
        self.group = group
        self.device = device
        self.dtype = dtype
        self.all_reduce = all_reduce
        self.choice = choice
        self.fused: dict[int, GemvAllReduce] = {}  # one per row count
        self.timings_us: dict[tuple[int, int], tuple[float, float]] = {}  # (separate, fused)
        self.chosen: dict[tuple[int, int], bool] = {}

    def for_shape(self, n: int, k: int) -> Callable[[Tensor, Tensor], Tensor] | None:
        if (n, k) not in self.chosen:
            if n not in self.fused:
                self.fused[n] = GemvAllReduce(self.group, self.device, self.dtype, n)
            if self.choice == "on":
                self.chosen[n, k] = True
            else:
                separate_us, fused_us = self._time(self.fused[n], n, k)
                self.timings_us[n, k] = (separate_us, fused_us)
                self.chosen[n, k] = fused_us < separate_us
        return self.fused[n].op if self.chosen[n, k] else None

    def _time(self, fused: GemvAllReduce, n: int, k: int) -> tuple[float, float]:
        weight = torch.randn(n, k, device=self.device).div_(k**0.5).to(self.dtype)
        x = torch.randn(k, device=self.device).to(self.dtype)
        timings = torch.tensor(
            [
                graph_call_us(lambda v: self.all_reduce(F.linear(v, weight)), x),
                graph_call_us(lambda v: fused(v, weight), x),
            ],
            dtype=torch.float64,
            device=self.device,
        )
        dist.all_reduce(timings, group=self.group)
        separate_us, fused_us = (timings / dist.get_world_size(self.group)).tolist()
        return separate_us, fused_us

    def summary(self) -> dict[str, str]:
        """Per shape (rows x columns per process): what was chosen, and the timings."""
        lines = {}
        for (n, k), fused in self.chosen.items():
            text = "fused" if fused else "separate"
            if (n, k) in self.timings_us:
                separate_us, fused_us = self.timings_us[n, k]
                text += f" (separate {separate_us:.1f} µs, fused {fused_us:.1f} µs)"
            lines[f"{n}x{k}"] = text
        return lines

"""y = x @ w.T for a few rows of x (a decode step's batch, M <= 64) in one launch: each program
owns BLOCK_N output features over one of SPLIT_K slices of the reduction; with more than one
slice each program leaves its float32 partial in a workspace and the last of a tile's programs
to arrive (a counter per tile, reset by that program) sums the slices and writes the output.

What it is for: cuBLAS reaches 0.76-0.80 of the copy bandwidth on the 8B shape's q/k/v and down
products at 64 rows (split-K kernels plus a separate reduction kernel); a product at these
sizes reads its weight once, so one launch that keeps enough weight bytes in flight could do
better. The pattern of the last arriving program reducing the tile is stream-K's fix-up (as in
CUTLASS's and Triton's split-K tutorials); benchmarks/skinny_products.py times it against
cuBLAS. Experimental: the engine does not call it.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["SkinnyConfig", "skinny_mm", "workspace_for"]


@triton.jit
def _skinny_mm_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    x,  # [M, K], rows stride_x apart
    w,  # [N, K], rows stride_w apart
    out,  # [M, N] contiguous
    partials,  # [SPLIT_K, BLOCK_M, N] float32 (unused with one slice)
    counters,  # [tiles] int32, zero between calls
    m,
    n,
    k,
    stride_x,
    stride_w,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    tile = tl.program_id(0)
    part = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    features = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows < m
    feature_in = features < n
    # Each slice covers whole BLOCK_K steps; the last may be short or empty.
    steps = tl.cdiv(k, BLOCK_K)
    per_part = tl.cdiv(steps, SPLIT_K)
    first = part * per_part
    last = tl.minimum(first + per_part, steps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(first, last):
        columns = step * BLOCK_K + tl.arange(0, BLOCK_K)
        column_in = columns < k
        a = tl.load(
            x + rows[:, None] * stride_x + columns[None, :],
            mask=row_in[:, None] & column_in[None, :],
            other=0.0,
        )
        b = tl.load(
            w + features[:, None].to(tl.int64) * stride_w + columns[None, :],
            mask=feature_in[:, None] & column_in[None, :],
            other=0.0,
        )
        acc += tl.dot(a, tl.trans(b))
    mask = row_in[:, None] & feature_in[None, :]
    if SPLIT_K == 1:
        tl.store(out + rows[:, None] * n + features[None, :], acc.to(out.dtype.element_ty), mask)
    else:
        here = partials + (part * BLOCK_M + rows[:, None]) * n + features[None, :]
        tl.store(here, acc, mask)
        tl.debug_barrier()  # every thread's partial stored before the counter moves
        arrived = tl.atomic_add(counters + tile, 1)  # acq_rel: our stores before, theirs after
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for other in range(SPLIT_K):
                there = partials + (other * BLOCK_M + rows[:, None]) * n + features[None, :]
                total += tl.load(there, mask, other=0.0, cache_modifier=".cg")
            tl.store(
                out + rows[:, None] * n + features[None, :], total.to(out.dtype.element_ty), mask
            )
            tl.atomic_xchg(counters + tile, 0)


@dataclass(frozen=True, slots=True)
class SkinnyConfig:
    """One launch shape: features a program, reduction step, slices, warps, pipeline stages."""

    block_n: int
    block_k: int
    split_k: int
    warps: int
    stages: int

    def __str__(self) -> str:
        return f"n{self.block_n}/k{self.block_k}/split{self.split_k}/w{self.warps}/s{self.stages}"


def _block_m(m: int) -> int:
    """Rows a program's tile holds: tl.dot's least 16, else m to a power of two."""
    return max(16, triton.next_power_of_2(m))


def skinny_mm(
    x: Tensor, w: Tensor, config: SkinnyConfig, workspace: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """x [M, K] (M <= 64) @ w [N, K].T -> [M, N] in x's dtype. `workspace` (partials, counters)
    from `workspace_for`, needed with more than one slice; counters must be zero."""
    m, k = x.shape
    n = w.size(0)
    assert m <= 64 and w.size(1) == k and x.stride(1) == w.stride(1) == 1
    block_m = _block_m(m)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(n, config.block_n)
    if config.split_k > 1:
        assert workspace is not None, "more than one slice needs a workspace"
        partials, counters = workspace
        assert partials.numel() >= config.split_k * block_m * n and counters.numel() >= tiles
    else:
        partials = counters = out  # not read
    _skinny_mm_kernel[(tiles, config.split_k)](
        x, w, out, partials, counters, m, n, k, x.stride(0), w.stride(0),
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT_K=config.split_k, num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    return out


def workspace_for(
    m: int, n: int, config: SkinnyConfig, device: torch.device
) -> tuple[Tensor, Tensor]:
    """The float32 partials and the zeroed per-tile counters one product of this shape needs."""
    partials = torch.empty(config.split_k, _block_m(m), n, dtype=torch.float32, device=device)
    counters = torch.zeros(triton.cdiv(n, config.block_n), dtype=torch.int32, device=device)
    return partials, counters

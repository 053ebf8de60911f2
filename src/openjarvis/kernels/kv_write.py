"""A step's keys and values into the paged cache in one launch: one program per token copies its
row of keys and its row of values to the token's slot. Two index copies did it before, one
launch each per layer (36 of a decode step's ~330 launches on Gemma 3 270M, 1.6 us each at one
token on an H200; the kernel's 18 took 1.1 us each).
"""

import triton
import triton.language as tl
from torch import Tensor

__all__ = ["write_kv"]


@triton.jit
def _write_kv_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    k_cache_ptr,  # [slots, WIDTH]
    v_cache_ptr,
    slots_ptr,  # [N] long
    k_ptr,  # [N, WIDTH], rows k_stride apart
    v_ptr,
    k_stride,
    v_stride,
    WIDTH: tl.constexpr,
    WIDTH_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    columns = tl.arange(0, WIDTH_PAD)
    inside = columns < WIDTH
    k = tl.load(k_ptr + token * k_stride + columns, mask=inside)
    v = tl.load(v_ptr + token * v_stride + columns, mask=inside)
    tl.store(k_cache_ptr + slot * WIDTH + columns, k, mask=inside)
    tl.store(v_cache_ptr + slot * WIDTH + columns, v, mask=inside)


def write_kv(k_cache: Tensor, v_cache: Tensor, slots: Tensor, k: Tensor, v: Tensor) -> None:
    """Write k and v ([N, width] each, rows strided as they come, each row contiguous) into
    rows `slots` ([N]) of the caches ([slots, width], contiguous), on the GPU."""
    width = k_cache.size(1)
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape
    assert k.shape == v.shape == (slots.numel(), width) and k.stride(1) == v.stride(1) == 1
    if slots.numel() == 0:
        return
    _write_kv_kernel[(slots.numel(),)](
        k_cache, v_cache, slots, k, v, k.stride(0), v.stride(0),
        WIDTH=width, WIDTH_PAD=triton.next_power_of_2(width),
    )  # fmt: skip

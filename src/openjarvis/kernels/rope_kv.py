"""What happens between the q/k/v product and attention, in one launch: each head's RMSNorm of
q and k (Qwen 3, Gemma 3), RoPE on both, the rotated queries written out for attention and the
rotated keys and the values written to their cache slots. One program per token.

The engine's compiled step ran this as three kernels a layer (two of RoPE, and the cache
write): 96 of the 8B shape's decode step, 0.138 ms at 64 rows on an H200 against this kernel's
0.094 (docs/benchmarks.md). TensorRT-LLM's attention runs its bias, RoPE and KV-cache update
in one kernel the same way. The roundings are the torch path's (runtime/torch/qkv.py): a
normed value is rounded to the model's dtype before RoPE, which runs in float32 and rounds
once.
"""

import triton
import triton.language as tl
from torch import Tensor

__all__ = ["norm_weighted", "rope_write_kv"]


@triton.jit
def norm_weighted(normed, weight, OFFSET: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    """An RMSNorm's output from the normed values (float32) and its weight: normed * w, or
    normed + normed * w for a weight stored as w - 1 (Gemma), as the torch path's addcmul."""
    weight = weight.to(tl.float32)
    if OFFSET:
        return normed + normed * weight
    return normed * weight


@triton.jit
def _rope_write_kv_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    qkv_ptr,  # [N, (HEADS + 2 * KV_HEADS) * HEAD_DIM], rows qkv_stride apart
    positions_ptr,  # [N] long
    cos_ptr,  # [positions, HEAD_DIM] float32: the cosines twice over
    sin_ptr,  # [positions, HEAD_DIM] float32: the sines negated, then as they are
    q_weight_ptr,  # [HEAD_DIM] the q norm's weight (read with NORM only)
    k_weight_ptr,
    slots_ptr,  # [N] long: the slot each token's key and value go to
    q_out_ptr,  # [N, HEADS, HEAD_DIM]
    k_cache_ptr,  # [slots, KV_HEADS, HEAD_DIM]
    v_cache_ptr,
    qkv_stride,
    eps,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,  # HEAD_DIM to a power of two
    ROTATED_PAD: tl.constexpr,  # HEADS + KV_HEADS to a power of two
    KV_PAD: tl.constexpr,
    NORM: tl.constexpr,
    OFFSET: tl.constexpr,  # the norm's weight stored as w - 1 (Gemma)
):
    token = tl.program_id(0).to(tl.int64)
    row = qkv_ptr + token * qkv_stride
    position = tl.load(positions_ptr + token).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    head = tl.arange(0, ROTATED_PAD)[:, None]  # q heads, then k heads
    column = tl.arange(0, HEAD_PAD)[None, :]
    in_head = column < HEAD_DIM
    partner = (column + HEAD_DIM // 2) % HEAD_DIM  # the other half: RoPE's swapped halves
    rotated = (head < HEADS + KV_HEADS) & in_head
    x = tl.load(row + head * HEAD_DIM + column, mask=rotated, other=0.0).to(tl.float32)
    swapped = tl.load(row + head * HEAD_DIM + partner, mask=rotated, other=0.0).to(tl.float32)
    dtype = q_out_ptr.dtype.element_ty
    if NORM:
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
        is_q = head < HEADS
        q_weight = tl.load(q_weight_ptr + column, mask=in_head, other=0.0)
        k_weight = tl.load(k_weight_ptr + column, mask=in_head, other=0.0)
        q_swapped = tl.load(q_weight_ptr + partner, mask=in_head, other=0.0)
        k_swapped = tl.load(k_weight_ptr + partner, mask=in_head, other=0.0)
        weight = tl.where(is_q, q_weight, k_weight)
        weight_swapped = tl.where(is_q, q_swapped, k_swapped)
        x = norm_weighted(x * rstd, weight, OFFSET)
        swapped = norm_weighted(swapped * rstd, weight_swapped, OFFSET)
        x = x.to(dtype).to(tl.float32)  # the norm's output, kept in the model's dtype
        swapped = swapped.to(dtype).to(tl.float32)
    cos = tl.load(cos_ptr + position * HEAD_DIM + column, mask=in_head, other=0.0)
    sin = tl.load(sin_ptr + position * HEAD_DIM + column, mask=in_head, other=0.0)
    y = (x * cos + swapped * sin).to(dtype)
    q_place = q_out_ptr + (token * HEADS + head) * HEAD_DIM + column
    tl.store(q_place, y, mask=rotated & (head < HEADS))
    k_place = k_cache_ptr + (slot * KV_HEADS + head - HEADS) * HEAD_DIM + column
    tl.store(k_place, y, mask=rotated & (head >= HEADS))
    v_head = tl.arange(0, KV_PAD)[:, None]
    v_inside = (v_head < KV_HEADS) & in_head
    v = tl.load(row + (HEADS + KV_HEADS + v_head) * HEAD_DIM + column, mask=v_inside)
    tl.store(v_cache_ptr + (slot * KV_HEADS + v_head) * HEAD_DIM + column, v, mask=v_inside)


def rope_write_kv(
    qkv: Tensor,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    norms: tuple[Tensor, Tensor] | None,
    eps: float,
    weight_offset: float,
    slots: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    q_out: Tensor,
) -> None:
    """Norm (with `norms`, the q and k weights), rotate and place one step's q, k and v:
    qkv [N, (heads + 2 * kv_heads) * head_dim] (rows strided, each contiguous) -> q_out [N,
    heads, head_dim]; keys and values to rows `slots` of the caches [slots, kv_heads,
    head_dim]. cos and sin: [positions, head_dim] float32, indexed by `positions` [N]."""
    tokens, heads, head_dim = q_out.shape
    kv_heads = k_cache.size(-2)
    assert k_cache.shape[-1] == head_dim and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert qkv.shape == (tokens, (heads + 2 * kv_heads) * head_dim) and qkv.stride(1) == 1
    assert cos.is_contiguous() and sin.is_contiguous() and cos.size(1) == head_dim
    if tokens == 0:
        return
    q_weight, k_weight = norms if norms is not None else (cos, cos)  # not read without norms
    _rope_write_kv_kernel[(tokens,)](
        qkv, positions, cos, sin, q_weight, k_weight, slots, q_out, k_cache, v_cache,
        qkv.stride(0), eps,
        HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim,
        HEAD_PAD=triton.next_power_of_2(head_dim),
        ROTATED_PAD=triton.next_power_of_2(heads + kv_heads),
        KV_PAD=triton.next_power_of_2(kv_heads),
        NORM=norms is not None, OFFSET=weight_offset != 0,
    )  # fmt: skip

"""Decode attention over the paged KV cache: one query token per sequence, keys and values read
block by block through the sequence's block table, softmax kept online (flash-decoding's inner
loop without the split over the sequence).

One program per (sequence, KV head) computes all the query heads that share that KV head, so
each key and value is read once per step. A registered operator: torch.compile and CUDA graphs
see one opaque call.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["paged_decode_attention"]


@triton.jit
def _paged_decode_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    q_ptr,  # [B, heads, head_dim]
    k_ptr,  # [blocks, block_size, kv_heads, head_dim]
    v_ptr,
    table_ptr,  # [B, W] int32
    context_ptr,  # [B] long: keys 0..context-1 are visible
    out_ptr,  # [B, heads, head_dim]
    scale,
    window,  # 0: none; else a query at p sees keys p - window + 1 .. p
    table_stride,
    kv_block_stride,
    kv_token_stride,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    context = tl.load(context_ptr + row).to(tl.int32)
    heads = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    offsets = tl.arange(0, BLOCK)
    head_ok = heads < GROUP
    n_heads = tl.num_programs(1) * GROUP
    q_rows = row * n_heads + kv_head * GROUP + heads
    q = tl.load(q_ptr + q_rows[:, None] * HEAD_DIM + dims[None, :], mask=head_ok[:, None])
    q = (q.to(tl.float32) * scale).to(q.dtype)
    best = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    first_key = 0
    if window > 0:
        first_key = tl.maximum(context - window, 0)
    for start in range((first_key // BLOCK) * BLOCK, context, BLOCK):
        block = tl.load(table_ptr + row * table_stride + start // BLOCK)
        keys = start + offsets
        visible = (keys < context) & (keys >= first_key)
        base = block.to(tl.int64) * kv_block_stride + kv_head * HEAD_DIM
        where = base + offsets[:, None] * kv_token_stride + dims[None, :]
        k = tl.load(k_ptr + where, mask=visible[:, None], other=0.0)
        v = tl.load(v_ptr + where, mask=visible[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k))  # [GROUP_PAD, BLOCK], float32
        scores = tl.where(visible[None, :], scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        rescale = tl.exp(best - new_best)
        p = tl.exp(scores - new_best[:, None])
        total = total * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        best = new_best
    out = acc / total[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * HEAD_DIM + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=head_ok[:, None],
    )


@torch.library.custom_op("openjarvis::paged_decode_attention", mutates_args=())
def _paged_decode_op(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context: Tensor,
    scale: float,
    window: int,
) -> Tensor:
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    out = torch.empty_like(q)
    _paged_decode_kernel[(batch, kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context,
        out,
        scale,
        window,
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK=block_size,
    )
    return out


@_paged_decode_op.register_fake
def _(q: Tensor, *_: object) -> Tensor:
    return torch.empty_like(q)


def paged_decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context: Tensor,
    scale: float,
    window: int,
) -> Tensor:
    """q [B, heads, head_dim] against each row's first `context[b]` cached positions (the last
    `window` of them when window > 0) -> [B, heads, head_dim] in q's dtype."""
    assert q.dim() == 3 and k_cache.dim() == 4 and k_cache.shape == v_cache.shape
    assert q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert q.size(2) == k_cache.size(3) and q.size(1) % k_cache.size(2) == 0
    assert block_tables.dtype == torch.int32 and block_tables.size(0) == q.size(0)
    head_dim, block_size = q.size(2), k_cache.size(1)
    assert head_dim >= 16 and head_dim & (head_dim - 1) == 0, "head_dim: a power of two >= 16"
    assert block_size >= 16 and block_size & (block_size - 1) == 0, "block: a power of two >= 16"
    return torch.ops.openjarvis.paged_decode_attention(
        q, k_cache, v_cache, block_tables, context, scale, window
    )

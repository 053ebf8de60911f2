"""Decode attention over the paged KV cache: one query token per sequence, keys and values read
through the sequence's block table, softmax kept online, and the context split over several
programs when the batch alone cannot fill the GPU (flash-decoding), their parts combined after.
The number of splits is fixed by the batch and the table's width (a CUDA graph fixes the grid);
each row divides its own visible keys among them, so a row of a few hundred keys in a table
sized for thousands still spreads over every split.

One program per (sequence, KV head, split) computes all the query heads that share that KV head,
so each key and value is read once per step; it reads TILE positions per iteration (several
blocks at once). A registered operator: torch.compile and CUDA graphs see one opaque call.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["paged_decode_attention"]

TILE = 64  # key positions per iteration of a program
_TARGET_PROGRAMS = 264  # two per SM of an H100/H200: enough to hide memory latency


@triton.jit
def _paged_decode_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    q_ptr,  # [B, heads, head_dim]
    k_ptr,  # [blocks, block_size, kv_heads, head_dim]
    v_ptr,
    table_ptr,  # [B, W] int32
    context_ptr,  # [B] long: keys 0..context-1 are visible
    best_ptr,  # [B, heads, SPLITS] float32: each split's running max of the scores
    total_ptr,  # [B, heads, SPLITS] float32: its sum of exp(score - max)
    acc_ptr,  # [B, heads, SPLITS, head_dim] float32: its weighted sum of values
    scale,
    window,  # 0: none; else a query at p sees keys p - window + 1 .. p
    table_stride,
    kv_block_stride,
    kv_token_stride,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    TILE: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    splits = tl.num_programs(2)
    context = tl.load(context_ptr + row).to(tl.int32)
    heads = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    offsets = tl.arange(0, TILE)
    head_ok = heads < GROUP
    n_heads = tl.num_programs(1) * GROUP
    q_rows = row * n_heads + kv_head * GROUP + heads
    q = tl.load(q_ptr + q_rows[:, None] * HEAD_DIM + dims[None, :], mask=head_ok[:, None])
    q = (q.to(tl.float32) * scale).to(q.dtype)
    best = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    first = tl.where(window > 0, tl.maximum(context - window, 0), 0)  # its first visible key
    part = tl.cdiv(tl.cdiv(context - first, splits), TILE) * TILE  # whole tiles per split
    low = first + split * part
    high = tl.minimum(low + part, context)
    # Every tile starts at a visible key, so no row of scores is all -inf.
    for start in range(low, high, TILE):
        keys = start + offsets
        visible = keys < high
        block = tl.load(table_ptr + row * table_stride + keys // BLOCK, mask=visible, other=0)
        base = block.to(tl.int64) * kv_block_stride + (keys % BLOCK) * kv_token_stride
        where = base[:, None] + kv_head * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + where, mask=visible[:, None], other=0.0)
        v = tl.load(v_ptr + where, mask=visible[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k))  # [GROUP_PAD, TILE], float32
        scores = tl.where(visible[None, :], scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        rescale = tl.exp(best - new_best)
        p = tl.exp(scores - new_best[:, None])
        total = total * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        best = new_best
    part_rows = q_rows * splits + split
    tl.store(best_ptr + part_rows, best, mask=head_ok)
    tl.store(total_ptr + part_rows, total, mask=head_ok)
    tl.store(acc_ptr + part_rows[:, None] * HEAD_DIM + dims[None, :], acc, mask=head_ok[:, None])


@triton.jit
def _combine_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    best_ptr,  # [B * heads, SPLITS]
    total_ptr,
    acc_ptr,  # [B * heads, SPLITS, head_dim]
    out_ptr,  # [B * heads, head_dim]
    SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Each split's softmax part rescaled to the common max, summed, and normalised."""
    row = tl.program_id(0)
    parts = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    used = parts < SPLITS
    best = tl.load(best_ptr + row * SPLITS + parts, mask=used, other=float("-inf"))
    total = tl.load(total_ptr + row * SPLITS + parts, mask=used, other=0.0)
    where = (row * SPLITS + parts)[:, None] * HEAD_DIM + dims[None, :]
    acc = tl.load(acc_ptr + where, mask=used[:, None], other=0.0)
    top = tl.max(best, axis=0)
    weight = tl.where(best > float("-inf"), tl.exp(best - top), 0.0)  # empty splits weigh 0
    out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(total * weight, axis=0)
    tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))


@torch.library.custom_op("openjarvis::paged_decode_attention", mutates_args=())
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
    assert q.size(2) >= 16 and q.size(2) & (q.size(2) - 1) == 0, "head_dim: a power of two >= 16"
    block = k_cache.size(1)
    assert block >= 16 and block & (block - 1) == 0, "block: a power of two >= 16"
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    # Splits enough to fill the GPU, no more than the widest table has tiles. Each row divides
    # its own keys among them (in the kernel). Parts sized by the table's span instead held 512
    # keys each in a 4096-position table, so a row of a few hundred ran in one program while the
    # others idled: 32 sequences of the embedded model decoded at 28,600 tok/s there against
    # 33,500-33,600 now (one H200, docs/benchmarks.md).
    span = block_tables.size(1) * block_size
    splits = max(1, min(-(-_TARGET_PROGRAMS // (batch * kv_heads)), -(-span // TILE)))
    best = torch.empty(batch, heads, splits, device=q.device, dtype=torch.float32)
    total = torch.empty_like(best)
    acc = torch.empty(batch, heads, splits, head_dim, device=q.device, dtype=torch.float32)
    _paged_decode_kernel[(batch, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context,
        best,
        total,
        acc,
        scale,
        window,
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK=block_size,
        TILE=TILE,
    )
    out = torch.empty_like(q)
    _combine_kernel[(batch * heads,)](
        best, total, acc, out, SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits),
        HEAD_DIM=head_dim,
    )  # fmt: skip
    return out


@paged_decode_attention.register_fake
def _(q: Tensor, *_: object) -> Tensor:
    return torch.empty_like(q)

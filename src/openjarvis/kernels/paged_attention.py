"""Attention over the paged KV cache for steps of one query per row: each row reads its keys
and values through its block table, softmax kept online, and the context split over several
programs when the rows alone cannot fill the GPU (flash-decoding), their parts combined after.
The number of splits is fixed by the batch and the table's width (a CUDA graph fixes the grid);
each program divides its own visible keys among them, so a row of a few hundred keys in a table
sized for thousands still spreads over every split.

One program per (row, KV head, split) computes all the query heads that share that KV head, so
each key and value is read once per step; it reads `tile_for(head_dim)` positions per iteration
(several blocks at once). Rows that read the same blocks one after another (a prompt's tokens
joining a decode step, one row each, or a short prefill's new tokens) are computed together, up
to `rows_per_program` of them by the first (vLLM's unified attention groups a sequence's
queries the same way): their keys are read once for all of them, where one program per row
read a 512-token prompt's keys 512 times (19 of a mixed step's 66 ms on the 8B shape, H200).
`joins[i]` says that row i reads the same blocks as row i - 1 (runtime.torch.paged.row_joins);
the others of such a run leave at once. A registered operator: torch.compile and CUDA graphs
see one opaque call.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["paged_decode_attention", "rows_per_program"]

_TARGET_PROGRAMS = 264  # two per SM of an H100/H200: enough to hide memory latency
_MIN_QUERIES = 16  # tl.dot's least M: query heads x rows a program computes


@triton.jit
def _paged_attention_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    q_ptr,  # [B, heads, head_dim]
    k_ptr,  # [blocks, block_size, kv_heads, head_dim]
    v_ptr,
    table_ptr,  # [B, W] int32
    context_ptr,  # [B] long: keys 0..context-1 are visible
    joins_ptr,  # [B] bool: row i reads the same blocks as row i - 1
    best_ptr,  # [B, heads, splits] float32: each split's running max of the scores
    total_ptr,  # [B, heads, splits] float32: its sum of exp(score - max)
    acc_ptr,  # [B, heads, splits, head_dim] float32: its weighted sum of values
    out_ptr,  # [B, heads, head_dim]: written here directly when there is one split
    scale,
    window,  # 0: none; else a query at p sees keys p - window + 1 .. p
    batch,
    table_stride,
    kv_block_stride,
    kv_token_stride,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,
    ROWS: tl.constexpr,  # rows a program computes at most
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    TILE: tl.constexpr,
    ONE_SPLIT: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    splits = tl.num_programs(2)
    # A run of rows over the same blocks is cut at multiples of ROWS; each piece's first row
    # computes the piece.
    if (row % ROWS != 0) & (tl.load(joins_ptr + row) != 0):
        return
    members = tl.arange(0, ROWS)
    member_rows = row + members
    joined = tl.load(joins_ptr + member_rows, mask=(members > 0) & (member_rows < batch), other=0)
    stays = (members == 0) | ((joined != 0) & (member_rows % ROWS != 0))
    count = tl.min(tl.where(stays, ROWS, members))  # the first row that does not join
    # Query m is head m % GROUP_PAD of the KV head's group, of row `row + m // GROUP_PAD`.
    m = tl.arange(0, ROWS * GROUP_PAD)
    member = m // GROUP_PAD
    head = m % GROUP_PAD
    valid = (member < count) & (head < GROUP)
    q_row = row + member
    n_heads = tl.num_programs(1) * GROUP
    q_index = q_row * n_heads + kv_head * GROUP + head
    dims = tl.arange(0, HEAD_DIM)
    # Unused queries' lanes are left unloaded: a query's scores and output depend on its own
    # lane only, and none of them is stored.
    q = tl.load(q_ptr + q_index[:, None] * HEAD_DIM + dims[None, :], mask=valid[:, None])
    q = (q.to(tl.float32) * scale).to(q.dtype)
    context = tl.load(context_ptr + q_row, mask=valid, other=0).to(tl.int32)
    first = tl.where(window > 0, tl.maximum(context - window, 0), 0)  # each query's first key
    # The keys some query sees, divided among the splits in whole tiles.
    low_all = tl.min(tl.where(valid, first, 2147483647))
    high_all = tl.max(tl.where(valid, context, 0))
    part = tl.cdiv(tl.cdiv(high_all - low_all, splits), TILE) * TILE
    low = low_all + split * part
    high = tl.minimum(low + part, high_all)
    best = tl.full([ROWS * GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([ROWS * GROUP_PAD], tl.float32)
    acc = tl.zeros([ROWS * GROUP_PAD, HEAD_DIM], tl.float32)
    offsets = tl.arange(0, TILE)
    for start in range(low, high, TILE):
        keys = start + offsets
        inside = keys < high
        block = tl.load(table_ptr + row * table_stride + keys // BLOCK, mask=inside, other=0)
        base = block.to(tl.int64) * kv_block_stride + (keys % BLOCK) * kv_token_stride
        where = base[:, None] + kv_head * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + where, mask=inside[:, None], other=0.0)
        v = tl.load(v_ptr + where, mask=inside[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k))  # [ROWS * GROUP_PAD, TILE], float32
        seen = (keys[None, :] < context[:, None]) & (keys[None, :] >= first[:, None])
        scores = tl.where(seen & inside[None, :], scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        # A query may see none of a tile's keys (a later row's keys, or its window's past):
        # its scores are all -inf, and so is its max until a key it sees comes.
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)
        rescale = tl.exp(best - shift)
        p = tl.exp(scores - shift[:, None])
        total = total * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        best = new_best
    if ONE_SPLIT:  # every query saw its own key here: total > 0
        out = acc / total[:, None]
        where_out = q_index[:, None] * HEAD_DIM + dims[None, :]
        tl.store(out_ptr + where_out, out.to(out_ptr.dtype.element_ty), mask=valid[:, None])
    else:
        parts = q_index * splits + split
        tl.store(best_ptr + parts, best, mask=valid)
        tl.store(total_ptr + parts, total, mask=valid)
        tl.store(acc_ptr + parts[:, None] * HEAD_DIM + dims[None, :], acc, mask=valid[:, None])


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


def tile_for(head_dim: int) -> int:
    """Key positions a program reads per iteration: 64, or 32 for heads of 256 (fewer registers
    a program). On an H200, a decode step's 18 layers of Gemma 3 270M took 0.292 ms at 64 rows
    and 0.112 at one with 32 against 0.336 / 0.123 with 64; the 8B shape (heads of 128) 1.507
    ms at 64 rows with 64 against 1.646 with 32 (two pipeline stages each; three were no faster)."""
    return 32 if head_dim > 128 else 64


def rows_per_program(batch: int, group: int) -> int:
    """Rows one program computes: enough for tl.dot's 16 queries (heads x rows) at the least;
    32 queries in steps of more than 256 rows, which prompt rows widened. On an H200
    (benchmarks/attention_rows.py, 8B shape, 32 layers): 64 decode rows at 512 keys plus 2,048
    prompt rows took 5.19 / 4.56 / 4.67 ms at 16 / 32 / 64 queries (30.2 row by row); 64
    decode rows alone 1.28 / 1.90 / 1.99 (1.27 row by row). Only a concurrency above 256 makes
    decode steps that wide; they would run 32 queries a program too (not measured)."""
    group_pad = triton.next_power_of_2(group)
    queries = 32 if batch > 256 else _MIN_QUERIES
    return max(1, queries // group_pad)


@torch.library.custom_op("openjarvis::paged_decode_attention", mutates_args=())
def paged_decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context: Tensor,
    joins: Tensor,
    scale: float,
    window: int,
    rows: int = 0,
) -> Tensor:
    """q [B, heads, head_dim] against each row's first `context[b]` cached positions (the last
    `window` of them when window > 0) -> [B, heads, head_dim] in q's dtype. `joins`
    (paged.row_joins) says which rows read the same blocks as the row before; `rows` per
    program is open to a benchmark (0: rows_per_program)."""
    assert q.dim() == 3 and k_cache.dim() == 4 and k_cache.shape == v_cache.shape
    assert q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert q.size(2) == k_cache.size(3) and q.size(1) % k_cache.size(2) == 0
    assert block_tables.dtype == torch.int32 and block_tables.size(0) == q.size(0)
    assert joins.dtype == torch.bool and joins.shape == (q.size(0),)
    assert q.size(2) >= 16 and q.size(2) & (q.size(2) - 1) == 0, "head_dim: a power of two >= 16"
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    assert block_size >= 16 and block_size & (block_size - 1) == 0, "block: a power of two >= 16"
    group = heads // kv_heads
    group_pad = triton.next_power_of_2(group)
    rows = rows or rows_per_program(batch, group)
    fits = rows & (rows - 1) == 0 and rows * group_pad >= _MIN_QUERIES
    assert fits, "rows: a power of two; rows x the group (padded) at least 16"
    # Splits enough to fill the GPU, no more than the widest table has tiles. Each row divides
    # its own keys among them (in the kernel). Parts sized by the table's span instead held 512
    # keys each in a 4096-position table, so a row of a few hundred ran in one program while the
    # others idled: 32 sequences of the embedded model decoded at 28,600 tok/s there against
    # 33,500-33,600 now (one H200, docs/benchmarks.md).
    span = block_tables.size(1) * block_size
    tile = tile_for(head_dim)
    splits = max(1, min(-(-_TARGET_PROGRAMS // (batch * kv_heads)), -(-span // tile)))
    out = torch.empty_like(q)
    best = total = acc = out  # one split: the kernel writes `out` itself, no parts to keep
    if splits > 1:
        best = torch.empty(batch, heads, splits, device=q.device, dtype=torch.float32)
        total = torch.empty_like(best)
        acc = torch.empty(batch, heads, splits, head_dim, device=q.device, dtype=torch.float32)
    _paged_attention_kernel[(batch, kv_heads, splits)](
        q, k_cache, v_cache, block_tables, context, joins, best, total, acc, out, scale, window,
        batch, block_tables.stride(0), k_cache.stride(0), k_cache.stride(1),
        GROUP=group, GROUP_PAD=group_pad, ROWS=rows, HEAD_DIM=head_dim, BLOCK=block_size,
        TILE=tile, ONE_SPLIT=splits == 1, num_stages=2,
    )  # fmt: skip
    if splits > 1:
        _combine_kernel[(batch * heads,)](
            best, total, acc, out, SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits),
            HEAD_DIM=head_dim,
        )  # fmt: skip
    return out


@paged_decode_attention.register_fake
def _(q: Tensor, *_: object) -> Tensor:
    return torch.empty_like(q)

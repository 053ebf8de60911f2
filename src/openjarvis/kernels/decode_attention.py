"""Phase B of the one-row layer kernel (kernels/decode_layer.py): the row's attention over the
paged cache, its keys split over the programs, the parts combined by the last to arrive."""

import triton
import triton.language as tl

from openjarvis.kernels.decode_parts import phase_wait, rounded
from openjarvis.kernels.rope_kv import norm_weighted

__all__ = ["attention"]


@triton.jit
def _head_rows(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    qkv, first_head, count, weight_ptr, cos, sin, eps,
    ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, NORM: tl.constexpr, OFFSET: tl.constexpr,
):  # fmt: skip
    """Heads first_head .. first_head + count - 1 of the q/k/v row, normed (NORM) and rotated,
    rounded to the model's dtype: float32 [ROWS, HEAD_DIM], zeros past `count`. cos and sin:
    the position's RoPE rows ([HEAD_DIM], the rotation's signs folded in)."""
    head = tl.arange(0, ROWS)[:, None]
    column = tl.arange(0, HEAD_DIM)[None, :]
    partner = (column + HEAD_DIM // 2) % HEAD_DIM
    inside = (head < count) & (column < HEAD_DIM)
    base = qkv + (first_head + head) * HEAD_DIM
    x = tl.load(base + column, mask=inside, other=0.0, cache_modifier=".cg").to(tl.float32)
    swapped = tl.load(base + partner, mask=inside, other=0.0, cache_modifier=".cg")
    swapped = swapped.to(tl.float32)
    if NORM:
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
        weight = tl.load(weight_ptr + column)
        weight_swapped = tl.load(weight_ptr + partner)
        x = rounded(norm_weighted(x * rstd, weight, OFFSET), qkv)
        swapped = rounded(norm_weighted(swapped * rstd, weight_swapped, OFFSET), qkv)
    return rounded(x * cos[None, :] + swapped * sin[None, :], qkv)


@triton.jit
def _kv_tile(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    table, k_cache, v_cache, start, bound, kv_head,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr,
):  # fmt: skip
    """Keys and values at positions start .. start + TILE - 1 below `bound`, through the
    table: [TILE, HEAD_DIM] each, zeros past `bound`."""
    keys = start + tl.arange(0, TILE)
    seen = keys < bound
    block = tl.load(table + keys // BLOCK, mask=seen, other=0).to(tl.int64)
    where = ((block * BLOCK + keys % BLOCK) * KV_HEADS + kv_head) * HEAD_DIM
    where = where[:, None] + tl.arange(0, HEAD_DIM)[None, :]
    k = tl.load(k_cache + where, mask=seen[:, None], other=0.0)
    v = tl.load(v_cache + where, mask=seen[:, None], other=0.0)
    return k, v


@triton.jit
def _combine(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    best_ptr, total_ptr, acc_ptr, attended, kv_head, used,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
    COMBINE: tl.constexpr,
):  # fmt: skip
    """A KV head's parts 0 .. used - 1 rescaled to their common max and summed, COMBINE parts a
    load (the loads of one go in flight together; each load waits for the last): its query
    heads' attention rows, written to `attended`."""
    queries = tl.arange(0, GROUP_P)
    real = queries < GROUP  # GROUP_P pads to a power of two
    parts = tl.arange(0, COMBINE)[:, None]
    dims = tl.arange(0, HEAD_DIM)
    top = tl.full([GROUP_P], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM], tl.float32)
    for start in range(0, used, COMBINE):
        part = start + parts
        inside = (part < used) & real[None, :]  # [COMBINE, GROUP_P]
        rows = (kv_head * SPLITS + part) * GROUP + queries[None, :]
        # Parts past `used` weigh exp(-inf) = 0; padding rows go NaN, and are never stored.
        best = tl.load(best_ptr + rows, mask=inside, other=float("-inf"), cache_modifier=".cg")
        part_total = tl.load(total_ptr + rows, mask=inside, other=0.0, cache_modifier=".cg")
        part_acc = tl.load(
            acc_ptr + rows[:, :, None] * HEAD_DIM + dims[None, None, :], mask=inside[:, :, None],
            other=0.0, cache_modifier=".cg",
        )  # fmt: skip
        new_top = tl.maximum(top, tl.max(best, axis=0))  # each load has a part: finite
        old, this = tl.exp(top - new_top), tl.exp(best - new_top[None, :])
        total = total * old + tl.sum(part_total * this, axis=0)
        acc = acc * old[:, None] + tl.sum(part_acc * this[:, :, None], axis=0)
        top = new_top
    out = acc / total[:, None]
    place = attended + (kv_head * GROUP + queries)[:, None] * HEAD_DIM + dims[None, :]
    tl.store(place, out.to(attended.dtype.element_ty), mask=real[:, None])


@triton.jit
def attention(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    qkv, position, slot_ptr, table, k_cache, v_cache, cos_ptr, sin_ptr, q_norm, k_norm,
    best_ptr, total_ptr, acc_ptr, arrivals, attended, scale, eps, window, pid, bar, target,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
    QUERIES: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr,
    SPLITS: tl.constexpr, COMBINE: tl.constexpr, NORM: tl.constexpr, OFFSET: tl.constexpr,
    WAIT: tl.constexpr,
):  # fmt: skip
    """Phase B: the row's attention, program i the part i % SPLITS of KV head i // SPLITS
    (parts of whole tiles, as many as the keys need). Its first tile of cached keys and values
    is loaded before the wait (`phase_wait`): they do not depend on the phase before."""
    context = position + 1  # the newest key (this row's) is at `position`
    first = tl.where(window > 0, tl.maximum(context - window, 0), 0)
    part = tl.cdiv(tl.cdiv(context - first, SPLITS), TILE) * TILE
    used = tl.cdiv(context - first, part)
    kv_head = pid // SPLITS
    split = pid % SPLITS
    low = first + split * part
    high = tl.minimum(low + part, context)
    bound = tl.minimum(high, position)  # the cached keys; the newest is not in the cache yet
    k_first, v_first = _kv_tile(
        table, k_cache, v_cache, low, bound, kv_head, KV_HEADS, HEAD_DIM, BLOCK, TILE
    )
    phase_wait(bar, target, WAIT)
    works = (kv_head < KV_HEADS) & (split < used)
    if works:
        dims = tl.arange(0, HEAD_DIM)
        queries = tl.arange(0, QUERIES)
        cos = tl.load(cos_ptr + position * HEAD_DIM + dims)
        sin = tl.load(sin_ptr + position * HEAD_DIM + dims)
        q = _head_rows(
            qkv, kv_head * GROUP, GROUP, q_norm, cos, sin, eps, QUERIES, HEAD_DIM, NORM, OFFSET
        )
        q = rounded(q * scale, qkv).to(k_cache.dtype.element_ty)
        best = tl.full([QUERIES], float("-inf"), tl.float32)
        total = tl.zeros([QUERIES], tl.float32)
        acc = tl.zeros([QUERIES, HEAD_DIM], tl.float32)
        for start in range(low, bound, TILE):
            if start == low:
                k, v = k_first, v_first
            else:
                k, v = _kv_tile(
                    table, k_cache, v_cache, start, bound, kv_head, KV_HEADS, HEAD_DIM, BLOCK,
                    TILE,
                )  # fmt: skip
            seen = (start + tl.arange(0, TILE)) < bound
            scores = tl.dot(q, tl.trans(k))  # [QUERIES, TILE] float32
            scores = tl.where(seen[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            rescale = tl.exp(best - new_best)
            p = tl.exp(scores - new_best[:, None])
            total = total * rescale + tl.sum(p, axis=1)
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
            best = new_best
        if high == context:  # the newest key, from this step's q/k/v row
            key = _head_rows(
                qkv, HEADS + kv_head, 1, k_norm, cos, sin, eps, 1, HEAD_DIM, NORM, OFFSET
            )
            value_row = qkv + (HEADS + KV_HEADS + kv_head) * HEAD_DIM
            value = tl.load(value_row + dims, cache_modifier=".cg").to(tl.float32)
            slot = tl.load(slot_ptr).to(tl.int64)
            place = (slot * KV_HEADS + kv_head) * HEAD_DIM + dims
            tl.store(k_cache + place[None, :], key.to(k_cache.dtype.element_ty))
            tl.store(v_cache + place, value.to(v_cache.dtype.element_ty))
            score = tl.sum(q.to(tl.float32) * key, axis=1)  # [QUERIES]
            new_best = tl.maximum(best, score)
            rescale = tl.exp(best - new_best)
            p = tl.exp(score - new_best)
            total = total * rescale + p
            acc = acc * rescale[:, None] + rounded(p, v_cache)[:, None] * value[None, :]
            best = new_best
        real = queries < GROUP  # the group's heads; the rest pad tl.dot's rows
        rows = (kv_head * SPLITS + split) * GROUP + queries
        tl.store(best_ptr + rows, best, mask=real)
        tl.store(total_ptr + rows, total, mask=real)
        tl.store(acc_ptr + rows[:, None] * HEAD_DIM + dims[None, :], acc, mask=real[:, None])
        # The last part of this KV head to arrive combines them (the count starts at 0).
        tl.debug_barrier()
        arrived = tl.atomic_add(arrivals + kv_head, 1, sem="acq_rel", scope="gpu")
        if arrived == used - 1:
            _combine(
                best_ptr, total_ptr, acc_ptr, attended, kv_head, used, GROUP, GROUP_P, HEAD_DIM,
                SPLITS, COMBINE,
            )  # fmt: skip
            tl.store(arrivals + kv_head, 0)

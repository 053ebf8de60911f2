"""A decode step's weight products for a few rows with the work around them fused in, for
small models whose step is hundreds of kernels each too short to fill the GPU (the embedded
Gemma 3 270M at one sequence: 0.80 ms a step against 0.13 ms of bytes, docs/benchmarks.md).

`norm_gemv` is one kernel for what the model runs as four to eight: a residual add of the last
sub-layer's output (normed first where the model has sandwich norms), the next RMSNorm, the
product, and for the MLP's stacked gate and up the activation of one times the other. Every
program recomputes the row's norms from the whole row (a few KB), so no kernel has to run
before it; program 0 writes the new residual. The roundings are the model's: each value the
eager model keeps in bf16 is rounded to bf16 here too, so the greedy tokens can stay the eager
path's. Rows are few (a decode step of one to a few sequences): each program takes every row,
so a weight tile is read once. tests/kernels/test_fused_decode.py holds the same in torch, and
checks it against the model's own modules.

A layer could then be five kernels (q, k, v after the norms; attention with q and k's norms and
RoPE and the KV write inside; out; gate and up after theirs; down), where the engine's compiled
step runs each norm, RoPE, residual add and activation as kernels of their own between the
products; benchmarks/fused_decode_probe.py times the products' chain on a GPU against the
engine's replayed step before anything is built on it.
"""

from typing import Literal

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["Glu", "norm_gemv"]

Glu = Literal["silu", "gelu_tanh"] | None
_GLU_CODES = {None: 0, "silu": 1, "gelu_tanh": 2}


@triton.jit
def _bf16(x):  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    """Round float32 values to bf16 and back: a value the eager model keeps in bf16."""
    return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _row_chunk(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    x,
    pending,
    w_post,
    rows_index,
    k,
    row_mask,
    dim,
    post_scale,
    HAS_PENDING: tl.constexpr,
    POST_NORM: tl.constexpr,
    OFFSET: tl.constexpr,
):
    """Columns k of the rows' new residual, float32 [ROWS, BLOCK_K]: x + (normed) pending."""
    mask = row_mask[:, None] & (k < dim)[None, :]
    offsets = rows_index[:, None] * dim + k[None, :]
    value = tl.load(x + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_PENDING:
        extra = tl.load(pending + offsets, mask=mask, other=0.0).to(tl.float32)
        if POST_NORM:
            weight = tl.load(w_post + k, mask=k < dim, other=0.0).to(tl.float32)
            extra = _bf16(extra * post_scale[:, None] * (OFFSET + weight[None, :]))
        value = _bf16(value + extra)
    return value


@triton.jit
def _norm_gemv_kernel(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    x,
    pending,
    x_out,
    w_post,
    w_pre,
    weight,
    bias,
    out,
    rows,
    dim,
    features,
    eps,
    HAS_PENDING: tl.constexpr,
    POST_NORM: tl.constexpr,
    PRE_NORM: tl.constexpr,
    OFFSET: tl.constexpr,
    GLU: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < features
    rows_index = tl.arange(0, ROWS)
    row_mask = rows_index < rows
    # The pending output's norm, then the new residual's: sums of squares over whole rows.
    post_scale = tl.zeros((ROWS,), dtype=tl.float32)
    if HAS_PENDING and POST_NORM:
        squares = tl.zeros((ROWS,), dtype=tl.float32)
        for start in range(0, dim, BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            mask = row_mask[:, None] & (k < dim)[None, :]
            offsets = rows_index[:, None] * dim + k[None, :]
            value = tl.load(pending + offsets, mask=mask, other=0.0).to(tl.float32)
            squares += tl.sum(value * value, axis=1)
        post_scale = 1.0 / tl.sqrt(squares / dim + eps)
    pre_scale = tl.zeros((ROWS,), dtype=tl.float32)
    if PRE_NORM:
        squares = tl.zeros((ROWS,), dtype=tl.float32)
        for start in range(0, dim, BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            value = _row_chunk(
                x, pending, w_post, rows_index, k, row_mask, dim, post_scale,
                HAS_PENDING, POST_NORM, OFFSET,
            )  # fmt: skip
            squares += tl.sum(value * value, axis=1)
        pre_scale = 1.0 / tl.sqrt(squares / dim + eps)
    first = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    second = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)  # GLU: the up half
    for start in range(0, dim, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_mask = k < dim
        value = _row_chunk(
            x, pending, w_post, rows_index, k, row_mask, dim, post_scale,
            HAS_PENDING, POST_NORM, OFFSET,
        )  # fmt: skip
        if HAS_PENDING:  # noqa: SIM102 (a constexpr then a runtime test: Triton nests them)
            if pid == 0:
                mask = row_mask[:, None] & k_mask[None, :]
                offsets = rows_index[:, None] * dim + k[None, :]
                tl.store(x_out + offsets, value.to(x_out.dtype.element_ty), mask=mask)
        if PRE_NORM:
            scale = tl.load(w_pre + k, mask=k_mask, other=0.0).to(tl.float32)
            value = _bf16(value * pre_scale[:, None] * (OFFSET + scale[None, :]))
        tile_mask = n_mask[:, None] & k_mask[None, :]
        tile = tl.load(weight + n[:, None] * dim + k[None, :], mask=tile_mask, other=0.0)
        first += tl.sum(value[:, None, :] * tile.to(tl.float32)[None, :, :], axis=2)
        if GLU != 0:
            up = tl.load(
                weight + (features + n)[:, None] * dim + k[None, :], mask=tile_mask, other=0.0
            )
            second += tl.sum(value[:, None, :] * up.to(tl.float32)[None, :, :], axis=2)
    if HAS_BIAS:
        first += tl.load(bias + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    result = first
    if GLU != 0:
        gate, up = _bf16(first), _bf16(second)
        if GLU == 1:
            active = gate * tl.sigmoid(gate)
        else:  # tanh-approximated gelu: 0.5 (1 + tanh(z)) is sigmoid(2 z)
            z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)  # sqrt(2 / pi)
            active = gate * tl.sigmoid(2.0 * z)
        result = _bf16(active) * up
    out_mask = row_mask[:, None] & n_mask[None, :]
    out_offsets = rows_index[:, None] * features + n[None, :]
    tl.store(out + out_offsets, result.to(out.dtype.element_ty), mask=out_mask)


def norm_gemv(
    x: Tensor,
    weight: Tensor,
    *,
    eps: float,
    pending: Tensor | None = None,
    x_out: Tensor | None = None,
    post: Tensor | None = None,
    pre: Tensor | None = None,
    offset: float = 0.0,
    glu: Glu = None,
    bias: Tensor | None = None,
    block_n: int = 16,
    block_k: int = 128,
) -> Tensor:
    """out [B, N] = (rmsnorm(x + post(pending)) with `pre`) @ weight^T (+ bias), or with `glu`
    act(gate) * up for weight = [gate; up] ([2 N, D]); x, pending [B, D]. With `pending`, the
    new residual x + post(pending) goes to `x_out` [B, D], another buffer than x (every program
    reads x while program 0 writes it). `post` and `pre` are RMSNorm weights ([D], scaling by
    offset + w); None: no such norm."""
    rows, dim = x.shape
    outputs = weight.size(0) // (2 if glu else 1)
    assert weight.shape == ((2 if glu else 1) * outputs, dim), "weight [N, D] ([2 N, D] with glu)"
    assert x.is_contiguous() and weight.is_contiguous(), "contiguous rows"
    assert pending is None or (pending.shape == x.shape and x_out is not None)
    assert x_out is None or x_out.data_ptr() != x.data_ptr(), "x_out must not be x"
    assert post is None or pending is not None, "a post norm needs a pending output"
    assert rows <= 16, "a few rows: each program takes them all"
    assert bias is None or (glu is None and bias.shape == (outputs,)), "a bias [N], not with glu"
    out = torch.empty(rows, outputs, device=x.device, dtype=x.dtype)
    unused = x  # any tensor for the pointers a configuration does not read
    grid = (triton.cdiv(outputs, block_n),)
    _norm_gemv_kernel[grid](
        x,
        unused if pending is None else pending,
        unused if x_out is None else x_out,
        unused if post is None else post,
        unused if pre is None else pre,
        weight,
        unused if bias is None else bias,
        out,
        rows,
        dim,
        outputs,
        eps,
        HAS_PENDING=pending is not None,
        POST_NORM=post is not None,
        PRE_NORM=pre is not None,
        OFFSET=offset,
        GLU=_GLU_CODES[glu],
        HAS_BIAS=bias is not None,
        ROWS=max(1, triton.next_power_of_2(rows)),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return out

"""A whole decoder layer for one row (a one-sequence decode step) in five fused phases, as five
launches or one persistent launch with grid barriers: one program per multiprocessor either way.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from openjarvis.kernels.decode_attention import attention
from openjarvis.kernels.decode_parts import (
    gdc_launch_dependents,
    gdc_wait,
    phase_wait,
    rounded,
    vector,
    weight_tile,
)
from openjarvis.kernels.rope_kv import norm_weighted

__all__ = [
    "PHASES",
    "DecodeScratch",
    "LayerTensors",
    "decode_layer",
    "final_norm",
    "gdc_wait",
    "launch_constants",
    "supports",
    "warps",
]

PHASES = 5


@triton.jit
def _tiles(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    w, t, N: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr,
    GLU: tl.constexpr,
):  # fmt: skip
    """Tile t of w, and with GLU (w is [gate; up], [2 N, K]) the same rows of up; without, the
    tile again."""
    tile = weight_tile(w, t, N, K, KP, BLOCK_N)
    up = tile
    if GLU != 0:
        up = weight_tile(w + N * K, t, N, K, KP, BLOCK_N)
    return tile, up


@triton.jit
def _residual_norm(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    x_ptr, pending_ptr, post_ptr, pre_ptr, eps, x_scale,
    DIM: tl.constexpr, DIM_P: tl.constexpr, HAS_PENDING: tl.constexpr, POST_NORM: tl.constexpr,
    OFFSET: tl.constexpr, SCALED: tl.constexpr,
):  # fmt: skip
    """The residual x (times x_scale where SCALED: an embedding row) + post_norm(pending), and
    its pre norm: float32 [DIM_P] each."""
    k = tl.arange(0, DIM_P)
    inside = k < DIM
    value = vector(x_ptr, DIM, DIM_P)
    if SCALED:
        value = rounded(value * x_scale, x_ptr)
    if HAS_PENDING:
        extra = vector(pending_ptr, DIM, DIM_P)
        if POST_NORM:
            rstd = tl.rsqrt(tl.sum(extra * extra, axis=0) / DIM + eps)
            weight = tl.load(post_ptr + k, mask=inside, other=0.0)
            extra = rounded(norm_weighted(extra * rstd, weight, OFFSET), x_ptr)
        value = rounded(value + extra, x_ptr)
    rstd = tl.rsqrt(tl.sum(value * value, axis=0) / DIM + eps)
    weight = tl.load(pre_ptr + k, mask=inside, other=0.0)
    return value, rounded(norm_weighted(value * rstd, weight, OFFSET), x_ptr)


@triton.jit
def _products(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    w, row, out, first, first_up, pid, P,
    N: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr, GLU: tl.constexpr,
    AHEAD: tl.constexpr,
):  # fmt: skip
    """out[N] = w @ row, the program's tiles (the first preloaded); with GLU (1 silu, 2 gelu
    tanh) w is [gate; up] ([2 N, K]) and out act(gate) * up. AHEAD: a program has several
    tiles, and loads each next one before it multiplies this one (zeros past the last: masked,
    no traffic)."""
    tiles = tl.cdiv(N, BLOCK_N)
    tile, up_tile = first, first_up
    for t in range(pid, tiles, P):
        if AHEAD:
            next_tile, next_up = _tiles(w, t + P, N, K, KP, BLOCK_N, GLU)
        elif t != pid:
            tile, up_tile = _tiles(w, t, N, K, KP, BLOCK_N, GLU)
        result = tl.sum(tile.to(tl.float32) * row[None, :], axis=1)
        if GLU != 0:
            gate = rounded(result, out)
            up = rounded(tl.sum(up_tile.to(tl.float32) * row[None, :], axis=1), out)
            if GLU == 1:
                active = gate * tl.sigmoid(gate)
            else:  # tanh-approximated gelu: 0.5 (1 + tanh(z)) is sigmoid(2 z)
                z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)  # sqrt(2 / pi)
                active = gate * tl.sigmoid(2.0 * z)
            result = rounded(active, out) * up
        n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(out + n, result.to(out.dtype.element_ty), mask=n < N)
        if AHEAD:
            tile, up_tile = next_tile, next_up


@triton.jit
def _plain_products(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    w, row_ptr, out, bar, target, pid, P,
    N: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr, WAIT: tl.constexpr,
    AHEAD: tl.constexpr,
):  # fmt: skip
    """out = w @ row (a vector written by the phase before): the first tile loaded, then the
    wait (`phase_wait`), then the row and the products."""
    first = weight_tile(w, pid, N, K, KP, BLOCK_N)
    phase_wait(bar, target, WAIT)
    row = vector(row_ptr, K, KP)
    _products(w, row, out, first, first, pid, P, N, K, KP, BLOCK_N, 0, AHEAD)


@triton.jit
def decode_layer_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    x,  # [DIM] the residual: read in A (not with EMBED), this layer's new one written in D
    token_ptr, embedding, embed_scale,  # with EMBED, A's residual: embedding[token] * scale
    pending,  # [DIM] the last layer's down output, not yet added (HAS_PENDING)
    post_ffn_prev,  # [DIM] the last layer's post-MLP norm weight (HAS_PENDING and SANDWICH)
    between,  # [DIM] the residual after A (program 0 writes it; D reads it)
    attention_norm, wqkv, q_norm, k_norm, wo, post_attention_norm, ffn_norm, w13, w2,
    position_ptr, slot_ptr, table,  # the row's position and cache slot ([1] long), table [W]
    k_cache, v_cache,  # [slots, KV_HEADS, HEAD_DIM]
    cos_ptr, sin_ptr,  # RoPE tables [positions, HEAD_DIM] float32 (signs folded in)
    qkv, best, total, acc, arrivals, attended, out, active,  # scratch (arrivals: zeros)
    down,  # [DIM] this layer's down output
    bar,  # the layer's barrier counter, zero at launch
    scale, eps, window,
    DIM: tl.constexpr, DIM_P: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, HIDDEN: tl.constexpr, HIDDEN_P: tl.constexpr,
    ATT_P: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr, SPLITS: tl.constexpr,
    GROUP_P: tl.constexpr, QUERIES: tl.constexpr, COMBINE: tl.constexpr, AHEAD: tl.constexpr,
    N_QKV: tl.constexpr, N_O: tl.constexpr, N_13: tl.constexpr, N_2: tl.constexpr,
    HAS_PENDING: tl.constexpr, SANDWICH: tl.constexpr, QK_NORM: tl.constexpr,
    OFFSET: tl.constexpr, GLU: tl.constexpr, PHASE: tl.constexpr, PDL: tl.constexpr,
    EMBED: tl.constexpr,
):  # fmt: skip
    """A small model's one-row step was hundreds of kernels each far too short to fill the GPU
    (the embedded Gemma 3 270M's four products a layer took 3.7-4.9 us each for 1-5 MB on an
    H200: docs/benchmarks.md). Here a layer is five phases:

      A  residual add of the last layer's down output (after its post norm, Gemma), the
         attention norm, the q/k/v product;
      B  attention over the paged cache, the keys split over the programs (flash-decoding):
         each part norms and rotates its queries itself, the part with the newest position
         norms and rotates the new key, scores it from registers and writes it and the value to
         the cache; the last part of a KV head to finish (an atomic count) combines the parts,
         `COMBINE` of them a load;
      C  the attention-out product;
      D  residual add (after the post-attention norm, Gemma), the MLP norm, gate and up with
         the activation of one times the other;
      E  the down product, left for the next layer's A (or the caller) to add.

    Every program recomputes a phase's norms from the whole row (a few KB from L2) instead of
    waiting for one program to; program 0 writes the residual. Between phases a barrier: each
    program adds one to the layer's counter and polls until all have. Before it waits, a
    program loads its next weight tile (weights do not depend on the phase before), so the
    wait hides the load; where a program has several tiles (`AHEAD`), it loads each next one
    before it multiplies the one it has. Data written inside the launch is read with `.cg`
    loads (L2, not a stale L1 line). The programs must all be resident at once: one per
    multiprocessor, each fits alone. With five launches and programmatic dependent launch
    (`PDL`) the same loads come before each launch's wait for the last; they overlap it only
    where a program of each fits one multiprocessor together (benchmarks/kernel_resources.py
    says which do, without a GPU).

    The roundings are the model's: each value the eager model keeps in the model's dtype is
    rounded to it here too. `PHASE` > 0 runs one phase only (the barriers left out): the same
    code as five launches, which the tests also run under Triton's interpreter (it runs
    programs one after another, so a barrier would wait forever there). Which form is faster,
    and by how much, is measured in docs/benchmarks.md (benchmarks/one_row_phases.py).
    """
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    # Each phase waits for the one before: at the grid barrier in the persistent launch; with
    # programmatic dependent launch (PDL), for the previous launch to end, after loading what
    # does not depend on it (this launch may start as soon as the last one let it).
    WAIT = 1 if PHASE == 0 else (2 if PDL else 0)
    if PDL:
        gdc_launch_dependents()  # the next launch may start: it too waits before reading
    GROUP = HEADS // KV_HEADS
    QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    ATT = HEADS * HEAD_DIM
    position = tl.load(position_ptr).to(tl.int64)
    if PHASE == 0 or PHASE == 1:
        first = weight_tile(wqkv, pid, QKV, DIM, DIM_P, N_QKV)
        phase_wait(bar, 0, 2 if PDL else 0)  # the launch before wrote the residual
        residual = x
        if EMBED:
            residual = embedding + tl.load(token_ptr).to(tl.int64) * DIM
        value, normed = _residual_norm(
            residual, pending, post_ffn_prev, attention_norm, eps, embed_scale, DIM, DIM_P,
            HAS_PENDING, SANDWICH, OFFSET, EMBED,
        )  # fmt: skip
        if pid == 0:
            k = tl.arange(0, DIM_P)
            tl.store(between + k, value.to(between.dtype.element_ty), mask=k < DIM)
        _products(wqkv, normed, qkv, first, first, pid, P, QKV, DIM, DIM_P, N_QKV, 0, AHEAD)
    if PHASE == 0 or PHASE == 2:
        attention(
            qkv, position, slot_ptr, table, k_cache, v_cache, cos_ptr, sin_ptr, q_norm, k_norm,
            best, total, acc, arrivals, attended, scale, eps, window, pid, bar, P, HEADS,
            KV_HEADS, GROUP, GROUP_P, QUERIES, HEAD_DIM, BLOCK, TILE, SPLITS, COMBINE, QK_NORM,
            OFFSET, WAIT,
        )  # fmt: skip
    if PHASE == 0 or PHASE == 3:
        _plain_products(wo, attended, out, bar, 2 * P, pid, P, DIM, ATT, ATT_P, N_O, WAIT, AHEAD)
    if PHASE == 0 or PHASE == 4:
        first, first_up = _tiles(w13, pid, HIDDEN, DIM, DIM_P, N_13, GLU)
        phase_wait(bar, 3 * P, WAIT)
        value, normed = _residual_norm(
            between, out, post_attention_norm, ffn_norm, eps, 1.0, DIM, DIM_P, True, SANDWICH,
            OFFSET, False,
        )  # fmt: skip
        if pid == 0:
            k = tl.arange(0, DIM_P)
            tl.store(x + k, value.to(x.dtype.element_ty), mask=k < DIM)
        _products(
            w13, normed, active, first, first_up, pid, P, HIDDEN, DIM, DIM_P, N_13, GLU, AHEAD
        )
    if PHASE == 0 or PHASE == 5:
        _plain_products(
            w2, active, down, bar, 4 * P, pid, P, DIM, HIDDEN, HIDDEN_P, N_2, WAIT, AHEAD
        )


@triton.jit
def _final_norm_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    x, down, post_ffn, norm, out, eps,
    DIM: tl.constexpr, DIM_P: tl.constexpr, SANDWICH: tl.constexpr, OFFSET: tl.constexpr,
):  # fmt: skip
    """After the last layer: its residual add (after its post-MLP norm, Gemma) and the model's
    final norm, one program: out [DIM]."""
    _, normed = _residual_norm(
        x, down, post_ffn, norm, eps, 1.0, DIM, DIM_P, True, SANDWICH, OFFSET, False
    )
    k = tl.arange(0, DIM_P)
    tl.store(out + k, normed.to(out.dtype.element_ty), mask=k < DIM)


_TILE = 64  # key positions an attention part reads per iteration: one for a short context
# Attention parts the combining program loads at once (1: one after another, as measured).
_COMBINE = 1
_WARPS = 8  # warps a program of the other phases
_ATTENTION_WARPS = 8  # warps a program of attention (phase B)
_MOST_TILE = 32_768  # weight elements a program's tile holds at most (registers)
# The longest weight row taken (padded). On an H200 (2026-12-05) the layers of Llama 3.2 1B
# (rows of 8,192) and the Llama-3-8B shape (14,336) ran faster through the kernel than the
# compiled step at one row (benchmarks/one_row_phases.py); the engine times both at start.
_WIDEST = 16_384


@dataclass(frozen=True, slots=True)
class LayerTensors:
    """One layer's weights (the model's own tensors) and caches, as the kernel reads them.
    Norm weights: [dim] (or [head_dim]); None where the model has no such norm."""

    attention_norm: Tensor
    wqkv: Tensor  # [(heads + 2 kv_heads) head_dim, dim]
    q_norm: Tensor | None
    k_norm: Tensor | None
    wo: Tensor  # [dim, heads head_dim]
    post_attention_norm: Tensor | None
    ffn_norm: Tensor
    w13: Tensor  # [2 hidden, dim]: gate, then up
    w2: Tensor  # [dim, hidden]
    post_ffn_norm: Tensor | None
    k_cache: Tensor  # [blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor
    cos: Tensor  # RoPE tables [positions, head_dim] float32, the layer's own (local or global)
    sin: Tensor
    window: int  # 0: attends to every key


class DecodeScratch:
    """The buffers a one-row step's layers pass between phases, allocated once (a CUDA graph
    replays their addresses): the residual and its copy between A and D, the down output, the
    attention parts, the barrier counters (one a layer, zeroed each step) and the KV heads'
    arrival counts (zeroed by the part that combines)."""

    def __init__(
        self, *, dim: int, heads: int, kv_heads: int, head_dim: int, hidden: int, layers: int,
        programs: int, dtype: torch.dtype, device: torch.device,
    ) -> None:  # fmt: skip
        def vector(size: int) -> Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        self.programs = programs
        self.x, self.between, self.down = vector(dim), vector(dim), vector(dim)
        self.normed = vector(dim)  # the step's output: the last residual after the final norm
        self.qkv = vector((heads + 2 * kv_heads) * head_dim)
        self.attended, self.out = vector(heads * head_dim), vector(dim)
        self.active = vector(hidden)
        parts = heads * _splits(programs, kv_heads)
        self.best = torch.zeros(parts, dtype=torch.float32, device=device)
        self.total = torch.zeros(parts, dtype=torch.float32, device=device)
        self.acc = torch.zeros(parts, head_dim, dtype=torch.float32, device=device)
        self.arrivals = torch.zeros(kv_heads, dtype=torch.int32, device=device)
        self.barriers = torch.zeros(layers, dtype=torch.int32, device=device)


def _block_n(features: int, reads: int, programs: int) -> int:
    """Features a program's tile holds: enough that the tiles go round the programs once, no
    more than fits its registers."""
    block = triton.next_power_of_2(max(1, -(-features // programs)))
    while block > 1 and block * triton.next_power_of_2(reads) > _MOST_TILE:
        block //= 2
    return block


def _splits(programs: int, kv_heads: int) -> int:
    """Attention parts a KV head's keys may be split into: its share of the programs."""
    return max(1, programs // kv_heads)


def warps(phase: int) -> int:
    """Warps a program of `phase` (0: the persistent launch of all five)."""
    return _ATTENTION_WARPS if phase == 2 else _WARPS


def launch_constants(
    *,
    dim: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    hidden: int,
    block: int,
    programs: int,
    qk_norm: bool,
    sandwich: bool,
    offset: bool,
    activation: str,
) -> dict[str, int | bool]:
    """The kernel's compile-time constants for a layer of this shape on `programs` programs,
    but for those of a layer or launch (HAS_PENDING, EMBED, PHASE, PDL). `block`: positions a
    cache block holds."""
    att, qkv = heads * head_dim, (heads + 2 * kv_heads) * head_dim
    blocks = {
        "N_QKV": _block_n(qkv, dim, programs), "N_O": _block_n(dim, att, programs),
        "N_13": _block_n(hidden, 2 * dim, programs), "N_2": _block_n(dim, hidden, programs),
    }  # fmt: skip
    features = {"N_QKV": qkv, "N_O": dim, "N_13": hidden, "N_2": dim}
    ahead = any(-(-features[name] // block) > programs for name, block in blocks.items())
    return {
        "DIM": dim, "DIM_P": triton.next_power_of_2(dim), "HEADS": heads, "KV_HEADS": kv_heads,
        "HEAD_DIM": head_dim, "HIDDEN": hidden, "HIDDEN_P": triton.next_power_of_2(hidden),
        "ATT_P": triton.next_power_of_2(att), "BLOCK": block, "TILE": _TILE,
        "SPLITS": _splits(programs, kv_heads),
        "GROUP_P": triton.next_power_of_2(heads // kv_heads),
        "QUERIES": max(16, triton.next_power_of_2(heads // kv_heads)),  # tl.dot's least rows
        "COMBINE": _COMBINE,
        **blocks, "AHEAD": ahead, "SANDWICH": sandwich, "QK_NORM": qk_norm, "OFFSET": offset,
        "GLU": {"silu": 1, "gelu_tanh": 2}[activation],
    }  # fmt: skip


def supports(*, dim: int, heads: int, kv_heads: int, head_dim: int, hidden: int) -> bool:
    """Whether the kernel takes this shape: heads of a power of two from 16, and weight rows
    of at most 16,384 (padded; a program holds a whole row of each tile in its registers)."""
    if head_dim < 16 or head_dim & (head_dim - 1) or heads % kv_heads:
        return False
    widest = max(dim, heads * head_dim, hidden)
    return triton.next_power_of_2(widest) <= _WIDEST


def decode_layer(
    layer: LayerTensors,
    scratch: DecodeScratch,
    index: int,
    *,
    pending: tuple[Tensor, Tensor | None] | None,
    embed: tuple[Tensor, Tensor, float] | None = None,
    positions: Tensor,
    slots: Tensor,
    table: Tensor,
    heads: int,
    scale: float,
    eps: float,
    weight_offset: float,
    activation: str,
    phases: tuple[int, ...] = (0,),
    pdl: bool = False,
) -> None:
    """Layer `index` for one row: scratch.x (the residual) + the last layer's pending down
    output (with that layer's post-MLP norm weight, or None) -> scratch.x and scratch.down, the
    row's key and value written to the caches. `embed` (the first layer): the token [1] long,
    the embedding table and its scale, whose row is the residual instead of scratch.x.
    positions, slots: [1] long; table [W] int32.
    `phases`: (0,) one launch of every phase; else the phases (1-5) to launch, one each (all
    five: the interpreter's way; fewer: a benchmark timing a phase). `pdl`: each launch may
    start while the one before runs (programmatic dependent launch, Hopper; the engine's
    default: docs/benchmarks.md), waiting for it before reading what it wrote."""
    s = scratch
    dim = s.x.numel()
    _, block, kv_heads, head_dim = layer.k_cache.shape
    hidden = layer.w2.size(1)
    assert layer.wqkv.shape == ((heads + 2 * kv_heads) * head_dim, dim)
    assert layer.w13.shape == (2 * hidden, dim) and layer.wo.shape == (dim, heads * head_dim)
    assert table.dtype == torch.int32 and table.dim() == 1
    qk_norm = layer.q_norm is not None and layer.k_norm is not None
    sandwich = layer.post_attention_norm is not None
    programs = s.programs
    unused = layer.cos  # any tensor for a pointer this configuration does not read
    down, post_prev = pending if pending is not None else (s.down, None)
    token, embedding, embed_scale = embed if embed is not None else (positions, unused, 1.0)
    arguments = (
        s.x, token, embedding, embed_scale, down, unused if post_prev is None else post_prev,
        s.between,
        layer.attention_norm, layer.wqkv, layer.q_norm if qk_norm else unused,
        layer.k_norm if qk_norm else unused, layer.wo,
        layer.post_attention_norm if sandwich else unused, layer.ffn_norm, layer.w13, layer.w2,
        positions, slots, table, layer.k_cache, layer.v_cache, layer.cos, layer.sin,
        s.qkv, s.best, s.total, s.acc, s.arrivals, s.attended, s.out, s.active, s.down,
        s.barriers[index:], scale, eps, layer.window,
    )  # fmt: skip
    constants = launch_constants(
        dim=dim, heads=heads, kv_heads=kv_heads, head_dim=head_dim, hidden=hidden, block=block,
        programs=programs, qk_norm=qk_norm, sandwich=sandwich, offset=weight_offset != 0,
        activation=activation,
    )  # fmt: skip
    assert not pdl or (0 not in phases and gdc_wait is not None), "PDL: separate launches"
    launch = {"launch_pdl": True} if pdl else {}  # an option older Tritons do not know
    for phase in phases:
        decode_layer_kernel[(programs,)](
            *arguments, **constants, HAS_PENDING=pending is not None, EMBED=embed is not None,
            PHASE=phase, PDL=pdl, num_warps=warps(phase), **launch,
        )  # fmt: skip


def final_norm(
    scratch: DecodeScratch, post_ffn: Tensor | None, norm: Tensor, eps: float, weight_offset: float
) -> Tensor:
    """After the last layer: scratch.x + post_ffn(scratch.down) (or + scratch.down without the
    norm), then the model's final norm (weight `norm`) -> scratch.normed [dim]."""
    dim = scratch.x.numel()
    _final_norm_kernel[(1,)](
        scratch.x, scratch.down, norm if post_ffn is None else post_ffn, norm, scratch.normed,
        eps, DIM=dim, DIM_P=triton.next_power_of_2(dim), SANDWICH=post_ffn is not None,
        OFFSET=weight_offset != 0,
    )  # fmt: skip
    return scratch.normed

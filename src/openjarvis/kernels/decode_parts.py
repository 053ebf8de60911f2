"""Device functions the one-row layer kernel's phases share (kernels/decode_layer.py,
kernels/decode_attention.py): roundings, waits between phases, vector and weight-tile loads."""

import triton
import triton.language as tl

try:  # programmatic dependent launch's grid controls (Hopper on; Triton 3.4 on)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - an older Triton: `pdl` is refused
    gdc_launch_dependents = gdc_wait = None

__all__ = [
    "gdc_launch_dependents",
    "gdc_wait",
    "grid_barrier",
    "phase_wait",
    "rounded",
    "vector",
    "weight_tile",
]


@triton.jit
def rounded(x, like):  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    """float32 values rounded to the dtype `like` points to, and back: a value the eager model
    keeps in its dtype."""
    return x.to(like.dtype.element_ty).to(tl.float32)


@triton.jit
def grid_barrier(bar, target):  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    """Wait until `target` arrivals at the counter `bar`, after adding this program's."""
    tl.debug_barrier()  # every thread's stores before the arrival (released with it)
    tl.atomic_add(bar, 1, sem="release", scope="gpu")
    count = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
    while count < target:
        count = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def phase_wait(bar, target, WAIT: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    """How a phase waits for the one before it: 0 not at all (a launch of its own, after the
    last), 1 at the grid barrier (the persistent launch), 2 for the previous launch to end
    (programmatic dependent launch: this launch started while that one ran)."""
    if WAIT == 1:
        grid_barrier(bar, target)
    elif WAIT == 2:
        gdc_wait()


@triton.jit
def vector(ptr, K: tl.constexpr, KP: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    """ptr[0:K] in float32, [KP] (zeros past K), read from L2 (written in this launch)."""
    k = tl.arange(0, KP)
    return tl.load(ptr + k, mask=k < K, other=0.0, cache_modifier=".cg").to(tl.float32)


@triton.jit
def weight_tile(w, t, N: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    """Rows t * BLOCK_N ... of the weight w [N, K]: [BLOCK_N, KP], zeros outside."""
    n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, KP)
    mask = (n < N)[:, None] & (k < K)[None, :]
    return tl.load(w + n[:, None] * K + k[None, :], mask=mask, other=0.0)

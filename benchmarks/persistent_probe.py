"""Can one persistent kernel run a small model's decode layers faster than a launch per product?
A probe before building it: the products of a preset's layers at one row (random bf16 weights),
each layer five phases (q/k/v; a stand-in for attention that only reads q; attention out; gate
and up; down) with a grid-wide barrier between phases, against the same products as one launch
each (cuBLASLt through torch, and a plain Triton GEMV), all replayed from CUDA graphs.

The persistent kernel runs one program per multiprocessor; a barrier is an atomic counter every
program adds to, then polls until all have. With `prefetch`, a program loads its next weight
tile before it waits at the barrier (weights do not depend on the phase before: only the row
does), so the wait hides the load. Also timed: the barriers alone.

`PYTHONPATH=src python3 benchmarks/persistent_probe.py --preset gemma-3-270m` (its barrier and
tiles are the layer kernel's, kernels/decode_layer.py)
"""

import argparse
import json
from collections.abc import Callable
from functools import partial

import torch
import triton
import triton.language as tl

from openjarvis.kernels.decode_parts import grid_barrier, vector, weight_tile
from openjarvis.runtime.torch.model import config_for
from openjarvis.runtime.torch.runner import _captured

__all__ = ["main"]


@triton.jit
def _phase(  # type: ignore[no-untyped-def]  # a Triton function: triton types its arguments at launch
    w,
    x,
    out,
    bar,
    target,
    pid,
    P,
    N: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """out[N] = w[N, K] @ x[K], tiles of BLOCK_N features over the programs, after the barrier."""
    tiles = tl.cdiv(N, BLOCK_N)
    if PREFETCH:
        first = weight_tile(w, pid, N, K, KP, BLOCK_N)
    grid_barrier(bar, target)
    if pid < tiles:
        if not PREFETCH:
            first = weight_tile(w, pid, N, K, KP, BLOCK_N)
        row = vector(x, K, KP)
        value = tl.sum(first.to(tl.float32) * row[None, :], axis=1)
        n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(out + n, value.to(tl.bfloat16), mask=n < N)
    for t in range(pid + P, tiles, P):
        tile = weight_tile(w, t, N, K, KP, BLOCK_N)
        row = vector(x, K, KP)
        value = tl.sum(tile.to(tl.float32) * row[None, :], axis=1)
        n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(out + n, value.to(tl.bfloat16), mask=n < N)


@triton.jit
def _layers_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    wqkv, wo, w13, w2, x, qkv, attended, out, active, bar,
    DIM: tl.constexpr, QKV: tl.constexpr, ATT: tl.constexpr, HIDDEN: tl.constexpr,
    LAYERS: tl.constexpr, B_QKV: tl.constexpr, B_O: tl.constexpr, B_13: tl.constexpr,
    B_2: tl.constexpr, PREFETCH: tl.constexpr, DIM_P: tl.constexpr, ATT_P: tl.constexpr,
    HIDDEN_P: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    for layer in range(LAYERS):
        base = layer * 5 * P
        _phase(
            wqkv + layer * QKV * DIM,
            x,
            qkv,
            bar,
            base + P,
            pid,
            P,
            QKV,
            DIM,
            DIM_P,
            B_QKV,
            PREFETCH,
        )
        # Stand-in for attention: a barrier, then each program copies a slice of q.
        grid_barrier(bar, base + 2 * P)
        k = pid * 16 + tl.arange(0, 16)
        tl.store(attended + k, tl.load(qkv + k, mask=k < ATT), mask=k < ATT)
        _phase(
            wo + layer * DIM * ATT,
            attended,
            out,
            bar,
            base + 3 * P,
            pid,
            P,
            DIM,
            ATT,
            ATT_P,
            B_O,
            PREFETCH,
        )
        _phase(
            w13 + layer * 2 * HIDDEN * DIM,
            out,
            active,
            bar,
            base + 4 * P,
            pid,
            P,
            2 * HIDDEN,
            DIM,
            DIM_P,
            B_13,
            PREFETCH,
        )
        _phase(
            w2 + layer * DIM * HIDDEN,
            active,
            x,
            bar,
            base + 5 * P,
            pid,
            P,
            DIM,
            HIDDEN,
            HIDDEN_P,
            B_2,
            PREFETCH,
        )


@triton.jit
def _barriers_kernel(bar, COUNT: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    P = tl.num_programs(0)
    for i in range(COUNT):
        grid_barrier(bar, (i + 1) * P)


@triton.jit
def _gemv_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel: triton types its arguments at launch
    w, x, out, N: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr
):
    pid = tl.program_id(0)
    tile = weight_tile(w, pid, N, K, KP, BLOCK_N)
    row = vector(x, K, KP)
    value = tl.sum(tile.to(tl.float32) * row[None, :], axis=1)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out + n, value.to(tl.bfloat16), mask=n < N)


def graph_ms(fn: Callable[[], object], steps: int = 200) -> float:
    """Milliseconds per replay of `fn` captured in a CUDA graph as the engine captures its
    steps (warmed up on a side stream first)."""
    graph, _ = _captured(fn, (), warm_ups=3, pool=None)
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="gemma-3-270m")
    args = parser.parse_args()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    c = config_for(args.preset)
    dim, hidden, layers = c.dim, c.intermediate_size, c.n_layers
    att = c.n_heads * c.head_dim
    qkv_n = att + 2 * c.n_kv_heads * c.head_dim
    device = torch.device("cuda")
    programs = torch.cuda.get_device_properties(device).multi_processor_count

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device=device) * shape[-1] ** -0.5).to(torch.bfloat16)

    wqkv, wo = weight(layers, qkv_n, dim), weight(layers, dim, att)
    w13, w2 = weight(layers, 2 * hidden, dim), weight(layers, dim, hidden)
    x = weight(dim)
    qkv, attended = x.new_empty(qkv_n), x.new_empty(att)
    out, active = x.new_empty(dim), x.new_empty(2 * hidden)
    bar = torch.zeros(1, dtype=torch.int32, device=device)
    step_bytes = sum(t.numel() * t.element_size() for t in (wqkv, wo, w13, w2))
    # The roofline: a copy of half the bytes moves them all (it reads and writes).
    source = torch.empty(step_bytes // 2, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy_ms = graph_ms(lambda: target.copy_(source), 50)
    results: dict[str, object] = {"preset": args.preset, "programs": programs}
    results["bytes_mb"] = round(step_bytes / 1e6, 1)

    def cublas() -> None:
        for i in range(layers):
            q = torch.nn.functional.linear(x, wqkv[i])
            o = torch.nn.functional.linear(q[:att], wo[i])
            a = torch.nn.functional.linear(o, w13[i])
            x.copy_(torch.nn.functional.linear(a[:hidden], w2[i]))

    def gemv(block: int) -> None:
        for i in range(layers):
            for w, src, dst, n, k in (
                (wqkv[i], x, qkv, qkv_n, dim), (wo[i], attended, out, dim, att),
                (w13[i], out, active, 2 * hidden, dim), (w2[i], active, x, dim, hidden),
            ):  # fmt: skip
                _gemv_kernel[(triton.cdiv(n, block),)](
                    w, src, dst, n, k, triton.next_power_of_2(k), block
                )

    results["cublaslt_ms"] = round(graph_ms(cublas), 4)
    for block in (4, 8, 16):
        results[f"gemv_launches_n{block}_ms"] = round(graph_ms(partial(gemv, block)), 4)

    pads = [triton.next_power_of_2(n) for n in (dim, att, hidden)]

    def persistent(prefetch: bool, blocks: tuple[int, int, int, int], warps: int) -> None:
        bar.zero_()
        _layers_kernel[(programs,)](
            wqkv, wo, w13, w2, x, qkv, attended, out, active, bar,
            dim, qkv_n, att, hidden, layers, *blocks, prefetch, *pads, num_warps=warps,
        )  # fmt: skip

    for blocks in ((16, 8, 32, 8), (16, 4, 32, 4), (8, 4, 16, 4)):
        for prefetch in (False, True):
            for warps in (4, 8):
                kind = "prefetch" if prefetch else "plain"
                name = f"persistent_{kind}_{'_'.join(map(str, blocks))}_w{warps}"
                ms = graph_ms(partial(persistent, prefetch, blocks, warps))
                results[name + "_ms"] = round(ms, 4)
    count = 5 * layers

    def barriers() -> None:
        bar.zero_()
        _barriers_kernel[(programs,)](bar, count, num_warps=4)

    results["barrier_us"] = round(graph_ms(barriers) * 1e3 / count, 3)
    results["roofline_ms"] = round(copy_ms, 4)
    print(json.dumps(results))


if __name__ == "__main__":
    main()

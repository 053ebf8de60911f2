"""Could a few-row decode step of a small model reach 0.40 of its roofline with fused kernels?
A probe, before anything is built into the engine (kernels/experimental/fused_decode.py).

On the GPU, for a preset's shape (random bf16 weights, `--rows` sequences at `--context`
positions), one decode step's chain of the fused kernels, replayed from a CUDA graph: per layer
q, k and v after the residual and norms (`norm_gemv`), the engine's paged decode attention
(without q and k's norms, RoPE or the KV write, which the design would fold into it), the
attention-out product, gate and up after the residual and norms with the activation, and down;
then the final norm, the output head and the argmax. Beside it, in the same process, the
engine's own decode step for the same rows replayed from its graph (compiled; timed as
torch_step.py times it, its inputs copied in each step), and both against the bytes a step
reads over the copy bandwidth. Each `--block-n` and `--block-k` is tried, the fastest kept, and
its kernels listed by GPU time (torch.profiler). A program's passes over its rows (the norms,
then the product) run one iteration each where `--block-k` covers the row (1,024 for Gemma 3
270M's 640): fewer loads one after another, each waiting for memory.

`PYTHONPATH=src python3 benchmarks/fused_decode_probe.py --preset gemma-3-270m --rows 1`
"""

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["main"]


def replay_ms(graph: torch.cuda.CUDAGraph, steps: int) -> float:
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def chain(
    config: object, rows: int, context: int, tiles: tuple[int, int], steps: int
) -> tuple[float, torch.cuda.CUDAGraph]:
    """Milliseconds per replayed step of the fused chain, and its graph."""
    from openjarvis.runtime.torch.runner import _captured

    step = build_step(config, rows, context, tiles, torch.device("cuda"))
    graph, _ = _captured(step, (), warm_ups=3, pool=None)
    return replay_ms(graph, steps), graph


def build_step(
    config: object, rows: int, context: int, tiles: tuple[int, int], device: torch.device
) -> Callable[[], torch.Tensor]:
    """The fused chain of one decode step (random weights), returning each row's argmax.
    `tiles`: the output features a program computes, and the most input columns it reads
    per iteration (fewer where the input is narrower: the whole row in one load)."""
    import triton

    from openjarvis.kernels.experimental.fused_decode import norm_gemv
    from openjarvis.runtime.torch.paged import Layout, PagedKV, row_joins

    c = config
    dtype = torch.bfloat16
    generator = torch.Generator(device).manual_seed(0)

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=generator) * shape[-1] ** -0.5).to(
            dtype
        )

    heads, kv_heads, head_dim = c.n_heads, c.n_kv_heads, c.head_dim  # type: ignore[attr-defined]
    dim, hidden = c.dim, c.intermediate_size  # type: ignore[attr-defined]
    offset, eps = c.norm_weight_offset, c.norm_eps  # type: ignore[attr-defined]
    sandwich = c.sandwich_norms  # type: ignore[attr-defined]
    glu = c.activation  # type: ignore[attr-defined]
    block_size = 16
    blocks_per_row = -(-(context + 1) // block_size)
    layers = []
    for _ in range(c.n_layers):  # type: ignore[attr-defined]
        layers.append(
            {
                "wqkv": weight((heads + 2 * kv_heads) * head_dim, dim),
                "wo": weight(dim, heads * head_dim),
                "w13": weight(2 * hidden, dim),
                "w2": weight(dim, hidden),
                "norms": [weight(dim) for _ in range(4)],  # attn, post-attn, ffn, post-ffn
                "cache": PagedKV(
                    1 + rows * blocks_per_row, block_size, kv_heads, head_dim, dtype, device
                ),
            }
        )
    head = weight(c.vocab_size, dim)  # type: ignore[attr-defined]
    final_norm = weight(dim)
    tables = (1 + torch.arange(rows * blocks_per_row, device=device)).view(rows, -1)
    positions = torch.full((rows, 1), context, device=device)
    slots = tables[:, context // block_size, None].long() * block_size + context % block_size
    tables = tables.to(torch.int32)
    # Which rows read the same blocks, once a step as the model computes it (left to `attend`,
    # every layer recomputed it: ~0.18 ms of small kernels a step at one row on the H200).
    layout = Layout(positions, slots, tables, row_joins(tables, 1))
    embedded = weight(rows, dim)
    # Two residual buffers in turn: a kernel reads one while its program 0 writes the other.
    buffers = (torch.empty_like(embedded), torch.empty_like(embedded))
    scale = head_dim**-0.5
    # The decode kernel reads the blocks on a GPU; elsewhere (a smoke run) the gathered path.
    mask = None if device.type == "cuda" else layout.masks(block_size, None)

    def norm(value: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return (F.rms_norm(value.float(), (dim,), eps=eps) * (offset + scale.float())).to(dtype)

    def product(x: torch.Tensor, weight: torch.Tensor, **options: Any) -> torch.Tensor:
        block_k = min(tiles[1], triton.next_power_of_2(x.size(1)))
        return norm_gemv(x, weight, block_n=tiles[0], block_k=block_k, **options)

    def step() -> torch.Tensor:
        # pending: the last layer's down product, not yet added; post_ffn: that layer's norm.
        current, pending, post_ffn, turn = embedded, None, None, 0
        for layer in layers:
            attn_norm, post_attn, ffn_norm, next_post_ffn = layer["norms"]
            after = buffers[turn]
            qkv = product(
                current,
                layer["wqkv"],
                eps=eps,
                pending=pending,
                x_out=after if pending is not None else None,
                post=post_ffn if sandwich else None,
                pre=attn_norm,
                offset=offset,
            )
            if pending is not None:
                current, turn = after, 1 - turn
            # Contiguous, as the operator takes it (a copy above one row; the model's RoPE
            # makes it, and the design would fold both into the attention kernel).
            q = qkv[:, : heads * head_dim].reshape(rows, 1, heads, head_dim).contiguous()
            attended = layer["cache"].attend(q, layout, mask, None, scale, None)
            out = product(attended.reshape(rows, heads * head_dim), layer["wo"], eps=eps)
            after = buffers[turn]
            active = product(
                current,
                layer["w13"],
                eps=eps,
                pending=out,
                x_out=after,
                post=post_attn if sandwich else None,
                pre=ffn_norm,
                offset=offset,
                glu=glu,
            )
            current, turn = after, 1 - turn
            pending = product(active, layer["w2"], eps=eps)
            post_ffn = next_post_ffn
        # The last residual add and the final norm, eagerly (a few kernels of the ~90).
        assert pending is not None and post_ffn is not None
        last = current + (norm(pending, post_ffn) if sandwich else pending)
        return F.linear(norm(last, final_norm), head).argmax(dim=-1)

    return step


def engine_ms(preset: str, rows: int, context: int, steps: int) -> tuple[float, float, float]:
    """The engine's replayed decode step (ms), the bytes a step reads, the copy bandwidth.
    Its engine captures decode graphs for these rows only (no prompt rows, no prefill graphs:
    a faster start); at one row the step is the one it runs with them (bucket 1 is compiled
    on its own), above one the compiled body is tuned at this size, not at its largest."""
    from torch_step import decode_inputs, time_replay  # this folder is on the path

    from openjarvis.runtime.torch.config import TorchSettings
    from openjarvis.runtime.torch.engine import TorchEngine

    settings = TorchSettings(
        max_seq_len=context + 64,
        concurrency=max(rows, 1),
        engine_process=False,
        decode_prompt_rows=0,
        prefill_graphs=False,
    )
    engine = TorchEngine(preset, settings)
    try:
        runner = engine._core.runner  # type: ignore[union-attr]
        inputs = decode_inputs(runner, rows, context)
        with torch.inference_mode():
            ms = time_replay(runner, inputs, steps, pick=False)
        step_bytes = engine.weight_bytes() + rows * engine.kv_bytes(context)
        bandwidth = engine.bandwidth_bytes_per_s
        assert bandwidth is not None
        return ms, step_bytes, bandwidth
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="gemma-3-270m")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--context", type=int, default=400)
    parser.add_argument("--block-n", default="8,16,32")
    parser.add_argument("--block-k", default="128,1024", help="most input columns an iteration")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    from openjarvis.runtime.torch.model import config_for

    config = config_for(args.preset)
    chains = {
        (int(n), int(k)): chain(config, args.rows, args.context, (int(n), int(k)), args.steps)
        for n in args.block_n.split(",")
        for k in args.block_k.split(",")
    }
    fused = {tiles: ms for tiles, (ms, _) in chains.items()}
    best = min(fused, key=fused.__getitem__)
    # Where the fastest chain's time goes, by kernel (the GPU's time, launches hidden).
    from torch_step import calls_kernels  # this folder is on the path

    kernel_ms, kernels = calls_kernels(chains[best][1].replay, 20)
    ours, step_bytes, bandwidth = engine_ms(args.preset, args.rows, args.context, args.steps)
    roofline = step_bytes / bandwidth * 1e3
    summary = {
        "preset": args.preset,
        "rows": args.rows,
        "context": args.context,
        "roofline_ms": round(roofline, 4),
        "fused_chain_ms_by_tiles": {f"n{n}_k{k}": round(ms, 4) for (n, k), ms in fused.items()},
        "fused_chain_share": round(roofline / fused[best], 3),
        "engine_step_ms": round(ours, 4),
        "engine_share": round(roofline / ours, 3),
        "engine_over_fused": round(ours / fused[best], 2),
        "fused_kernels_ms": round(kernel_ms, 4),
    }
    print(json.dumps(summary))
    for kernel in kernels:
        print(f"  {kernel['ms']:8.4f} ms  x {kernel['calls']:5.1f}  {kernel['kernel']}")


if __name__ == "__main__":
    main()

"""Where one batched decode step of the torch engine spends its time, on the GPU.

For each batch size B it times, on one engine (random bf16 weights of a preset):
- `replay`: B rows' decode step replayed back to back from its CUDA graph, one sync at the end
  (the GPU's time per step, launches hidden);
- `replay + pick`: the same with each step's argmax read back by the host before the next
  (the engine's pattern before its decode steps were chained: the host waits for every step);
- `host`: the Python work of one step on this CPU with the GPU out of the picture, in the
  engine's steady state (scheduler_host.py --chain): building the next step from B sequences
  (`continued`, `StepInputs.of`) and recording the last (`finish_step`, `deliver`);
- the GPU kernels of one replayed step (torch.profiler), grouped by name, with the bytes the
  step must read over the measured copy bandwidth (the roofline) beside them;
- the weight products alone at M = B (torch.mm on the layer's shapes, separate and fused),
  each as achieved bandwidth.
With --prompt-rows N, each step also carries N prompt rows of one query (a mixed step: new
prompts of `--context` tokens joining the batch, their rows' tables those of the decode rows),
and the weight products' rate is given in TFLOP/s beside the bandwidth.
With --prefill LENGTHS, one sequence's prefill step instead, of each length after --cached
tokens: replayed from the engine's prefill graph for its table's width, from the graph for the
widest table (the whole context), and eagerly; with the kernels of the first.

`PYTHONPATH=src python3 benchmarks/torch_step.py --preset llama-3-8b --batches 1,64,128`
`PYTHONPATH=src python3 benchmarks/torch_step.py --batches 64 --prompt-rows 2048`
`PYTHONPATH=src python3 benchmarks/torch_step.py --preset gemma-3-270m --prefill 16,128,1024`
"""

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, get_args

import torch
from scheduler_host import chained_us  # this folder is on the path

from openjarvis.runtime.torch.config import TimedChoice

if TYPE_CHECKING:
    from openjarvis.runtime.torch.engine import TorchEngine
    from openjarvis.runtime.torch.model import ModelConfig
    from openjarvis.runtime.torch.runner import Runner
    from openjarvis.runtime.torch.step_inputs import StepInputs

__all__ = ["main"]


def _runner(engine: "TorchEngine") -> "Runner":
    """The engine's runner: its steps run in this process (`engine_process=False`)."""
    from openjarvis.runtime.torch.core import EngineCore

    core = engine._core
    assert isinstance(core, EngineCore), "the engine's core in this process"
    return core.runner


def add_one_row_option(parser: argparse.ArgumentParser) -> None:
    """`--one-row`: the engine's `one_row_kernel` setting (torch_batch.py's too)."""
    parser.add_argument(
        "--one-row",
        choices=get_args(TimedChoice),
        default="auto",
        help="one-row steps through the layer kernel: where timed faster at start (the "
        "engine's default), always, or never (the compiled step)",
    )


def decode_inputs(runner: "Runner", batch: int, context: int) -> "StepInputs":
    """A decode step of `batch` rows, each at position `context` with its own blocks."""
    from openjarvis.runtime.torch.paged import BLOCK_SIZE, slots_of
    from openjarvis.runtime.torch.step_inputs import StepInputs

    blocks_per_row = -(-(context + 1) // BLOCK_SIZE)
    width = runner.table_width
    assert 1 + batch * blocks_per_row <= runner.blocks, "the cache holds every row"
    tables = torch.zeros(batch, width, dtype=torch.int32)
    for row in range(batch):
        first = 1 + row * blocks_per_row
        tables[row, :blocks_per_row] = torch.arange(first, first + blocks_per_row)
    positions = torch.full((batch, 1), context, dtype=torch.long)
    slots = slots_of(tables, positions, BLOCK_SIZE)
    tokens = torch.randint(0, runner.model.config.vocab_size, (batch, 1))
    return StepInputs(True, True, tokens, positions, slots, tables)


def mixed_inputs(runner: "Runner", batch: int, context: int, prompt_rows: int) -> "StepInputs":
    """A decode step of `batch` rows at position `context`, then `prompt_rows` prompt rows:
    prompts of `context` tokens (the last one shorter), one query a row at positions 0.., each
    prompt over the blocks of a decode row (their keys are what a timing needs, not theirs)."""
    from openjarvis.runtime.torch.paged import BLOCK_SIZE, slots_of
    from openjarvis.runtime.torch.step_inputs import StepInputs

    decode = decode_inputs(runner, batch, context)
    if not prompt_rows:
        return decode
    index = torch.arange(prompt_rows)
    positions = index % context
    tables = decode.tables[(index // context) % batch]
    slots = slots_of(tables, positions[:, None], BLOCK_SIZE)[:, 0]
    tokens = torch.randint(0, runner.model.config.vocab_size, (prompt_rows, 1))
    return StepInputs(
        True,
        True,
        torch.cat([decode.tokens, tokens]),
        torch.cat([decode.positions, positions[:, None]]),
        torch.cat([decode.slots, slots[:, None]]),
        torch.cat([decode.tables, tables]),
    )


def prefill_inputs(runner: "Runner", length: int, cached: int, width: int) -> "StepInputs":
    """One row's prefill of `length` tokens after `cached` ones, its table `width` blocks."""
    from openjarvis.runtime.torch.paged import BLOCK_SIZE, slots_of
    from openjarvis.runtime.torch.step_inputs import StepInputs

    blocks = -(-(cached + length) // BLOCK_SIZE)
    assert blocks <= width <= runner.table_width and blocks < runner.blocks
    tables = torch.zeros(1, width, dtype=torch.int32)
    tables[0, :blocks] = torch.arange(1, 1 + blocks)
    positions = torch.arange(cached, cached + length)[None]
    slots = slots_of(tables, positions, BLOCK_SIZE)
    tokens = torch.randint(0, runner.model.config.vocab_size, (1, length))
    return StepInputs(False, True, tokens, positions, slots, tables)


def time_calls(call: Callable[[], torch.Tensor], steps: int) -> float:
    """Milliseconds per call, each one's argmax read back (as the engine waits for a prefill)."""
    for _ in range(3):
        call().argmax(dim=-1).tolist()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        call().argmax(dim=-1).tolist()
    return (time.perf_counter() - start) / steps * 1e3


def calls_kernels(
    call: Callable[[], object], steps: int, top: int = 12
) -> tuple[float, list[dict[str, object]]]:
    """GPU time per call (ms) and its kernels grouped by name, largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for event in trace.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time
            counts[event.name] += 1
    rows = [
        {"kernel": name[:90], "ms": us / steps / 1e3, "calls": counts[name] / steps}
        for name, us in sorted(totals.items(), key=lambda item: -item[1])[:top]
    ]
    return sum(totals.values()) / steps / 1e3, rows


def prefill_diagnose(engine: "TorchEngine", lengths: list[int], cached: int, steps: int) -> None:
    """Print one prefill step's parts at each length (the module's list)."""
    runner = _runner(engine)
    assert runner.prefill_graphs, "the engine captured prefill graphs"
    for length in lengths:
        with torch.inference_mode():
            prefill_one(runner, length, cached, steps)


def prefill_one(runner: "Runner", length: int, cached: int, steps: int) -> None:
    from openjarvis.runtime.torch.paged import BLOCK_SIZE

    device = runner.device
    blocks = -(-(cached + length) // BLOCK_SIZE)
    exact = prefill_inputs(runner, length, cached, blocks).on(device)
    wide = prefill_inputs(runner, length, cached, runner.table_width).on(device)
    eager = runner._prefill
    calls = {
        "graph": lambda: runner.run(exact),
        "widest graph": lambda: runner.run(wide),
        "eager": lambda: eager(exact.tokens, exact.positions, exact.slots, exact.tables),
    }
    summary: dict[str, object] = {"length": length, "cached": cached, "blocks": blocks}
    for name, call in calls.items():
        summary[f"{name} ms"] = round(time_calls(call, steps), 3)
    gpu_ms, rows = calls_kernels(calls["graph"], 5)
    summary["graph gpu ms"] = round(gpu_ms, 3)
    print(json.dumps(summary), flush=True)
    for row in rows:
        print(f"  {row['ms']:7.3f} ms  x{row['calls']:5.1f}  {row['kernel']}")


def time_replay(runner: "Runner", inputs: "StepInputs", steps: int, pick: bool) -> float:
    """Milliseconds per step."""
    run = runner.run
    for _ in range(3):
        run(inputs)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        logits = run(inputs)
        if pick:
            logits.argmax(dim=-1).tolist()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def host_ms(batch: int, context: int, steps: int) -> dict[str, float]:
    """Milliseconds of Python per step in the engine's steady state (scheduler_host.py
    --chain): building the next step, and recording the last one's tokens."""
    build_us, record_us = chained_us(batch, steps, 1.5e-3, prompt=context)
    return {"inputs_ms": build_us / 1e3, "finish_ms": record_us / 1e3}


def kernel_table(
    runner: "Runner", inputs: "StepInputs", steps: int
) -> tuple[float, list[dict[str, object]]]:
    """GPU time per step (ms) and its kernels grouped by name, largest first."""
    return calls_kernels(lambda: runner.run(inputs), steps, top=14)


def layer_products(config: "ModelConfig") -> dict[str, tuple[int, int]]:
    """(K, N) of each weight product of a layer as the model runs them (q, k and v stacked in
    wqkv, gate and up in w13), and of the output head."""
    dim, hidden = config.dim, config.intermediate_size
    heads = config.n_heads * config.head_dim
    kv = config.n_kv_heads * config.head_dim
    return {
        "wqkv": (dim, heads + 2 * kv),
        "wo": (heads, dim),
        "w13": (dim, 2 * hidden),
        "w2": (hidden, dim),
        "output": (dim, config.vocab_size),
    }


def gemm_bandwidth(config: "ModelConfig", batch: int, bandwidth: float) -> list[dict[str, object]]:
    """torch.mm at M = batch on each of `layer_products`: achieved share of the copy
    bandwidth."""
    rows = []
    for name, (k, n) in layer_products(config).items():
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(5):
            torch.nn.functional.linear(x, weight)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                torch.nn.functional.linear(x, weight)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / 100
        read = (n * k + batch * k + batch * n) * 2
        rows.append(
            {
                "product": name,
                "us": seconds * 1e6,
                "share": read / seconds / bandwidth,
                "tflops": 2 * batch * n * k / seconds / 1e12,
            }
        )
    return rows


def diagnose(
    engine: "TorchEngine", batches: list[int], context: int, steps: int, prompt_rows: int = 0
) -> None:
    """Print the step's parts at each batch size (the module's list)."""
    runner = _runner(engine)
    bandwidth = engine.bandwidth_bytes_per_s
    assert bandwidth is not None
    for batch in batches:
        inputs = mixed_inputs(runner, batch, context, prompt_rows)
        step_bytes = engine.weight_bytes() + batch * engine.kv_bytes(context)
        summary = {
            "batch": batch,
            "prompt_rows": prompt_rows,
            "roofline_ms": step_bytes / bandwidth * 1e3,
            "replay_ms": time_replay(runner, inputs, steps, pick=False),
            "replay_pick_ms": time_replay(runner, inputs, steps, pick=True),
            **host_ms(batch, context, steps),
        }
        gpu_ms, kernels = kernel_table(runner, inputs, 10)
        summary["kernels_ms"] = gpu_ms
        print(json.dumps(summary))
        for row in kernels:
            print(f"  {row['ms']:7.3f} ms  x{row['calls']:5.1f}  {row['kernel']}")
        rows = batch + prompt_rows
        for row in gemm_bandwidth(engine.config, rows, bandwidth):
            print(
                f"  mm {row['product']:11s} {row['us']:8.1f} us  {row['share']:5.2f} of copy bw"
                f"  {row['tflops']:6.1f} TFLOP/s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="llama-3-8b")
    parser.add_argument("--batches", default="1,64,128")
    parser.add_argument("--context", type=int, default=640)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true")
    add_one_row_option(parser)
    parser.add_argument(
        "--prompt-rows", type=int, default=0, help="prompt rows of one query beside each batch"
    )
    parser.add_argument("--prefill", help="prefill lengths (one sequence) instead of decode")
    parser.add_argument("--cached", type=int, default=0, help="cached tokens before a prefill")
    parser.add_argument("--max-seq-len", type=int, help="the engine's context (default: fits)")
    args = parser.parse_args()
    from openjarvis.runtime.torch.config import TorchSettings
    from openjarvis.runtime.torch.engine import TorchEngine

    batches = [int(b) for b in args.batches.split(",")]
    settings = TorchSettings(
        max_seq_len=args.max_seq_len or args.context + 64,
        concurrency=max(batches),
        compile=not args.no_compile,
        one_row_kernel=args.one_row,
        engine_process=False,  # the steps run from this process's runner
        decode_prompt_rows=args.prompt_rows or None,  # None: the engine's own default
    )
    started = time.monotonic()
    engine = TorchEngine(args.preset, settings)
    load_s = time.monotonic() - started
    buckets = sorted(_runner(engine).graphs)
    state = engine.settings_dict()["one_row_kernel_state"]
    print(f"{args.preset}: engine up in {load_s:.1f} s (buckets {buckets}; one-row kernel {state})")
    if args.prefill:
        lengths = [int(n) for n in args.prefill.split(",")]
        prefill_diagnose(engine, lengths, args.cached, args.steps)
    else:
        diagnose(engine, batches, args.context, args.steps, args.prompt_rows)
    engine.close()


if __name__ == "__main__":
    main()

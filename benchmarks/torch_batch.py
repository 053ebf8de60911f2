"""Batched decode of the torch engine: N sequences at once (prompt 512, output 256, greedy), for
each N the decode tokens/s, the joules per output token (NVML's energy counter over the whole
batch) and the memory-bandwidth roofline at that batch (weights read once per step plus every
sequence's KV cache, over the measured copy bandwidth); ratios against one sequence.

`PYTHONPATH=src python3 benchmarks/torch_batch.py --preset llama-3-8b --out batch.json`
(`--preset` takes a preset name for random bf16 weights, or a .gguf path). It first checks the
paged decode kernel against the gathered attention on the GPU, so that no speed is reported for
a kernel that computes something else.
"""

import argparse
import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch_step import add_one_row_option, diagnose  # this folder is on the path

if TYPE_CHECKING:
    from openjarvis.runtime.torch.engine import TorchEngine

__all__ = ["main"]


def check_kernel() -> float:
    """Largest relative difference between the kernel and the gathered path (bf16)."""
    from openjarvis.runtime.torch.paged import Layout, PagedKV

    device = torch.device("cuda")
    generator = torch.Generator(device).manual_seed(0)
    worst = 0.0
    for heads, kv_heads, head_dim, window in ((32, 8, 128, None), (4, 1, 256, 40)):
        cache = PagedKV(64, 16, kv_heads, head_dim, torch.bfloat16, device)
        cache.k.normal_(generator=generator)
        cache.v.normal_(generator=generator)
        contexts = [1, 17, 100, 300]
        tables = torch.stack([torch.randperm(63, device=device)[:20] + 1 for _ in contexts])
        tables = tables.to(torch.int32)
        positions = torch.tensor(contexts, device=device)[:, None] - 1
        slots = torch.zeros_like(positions)
        layout = Layout(positions, slots, tables)
        q = torch.randn(len(contexts), 1, heads, head_dim, device=device, dtype=torch.bfloat16)
        ours = cache.attend(q, layout, None, window, head_dim**-0.5, None)
        reference = cache.gathered(q, layout, layout.masks(16, window), head_dim**-0.5, None)
        error = ((ours.float() - reference.float()).norm() / reference.float().norm()).item()
        worst = max(worst, error)
    return worst


def energy_mj(handle: object) -> int:
    import pynvml

    return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))


def run_batch(engine: "TorchEngine", batch: int, prompt: int, tokens: int, handle: object) -> dict:
    generator = torch.Generator().manual_seed(batch)
    vocab = engine.config.vocab_size
    prompts = [
        torch.randint(0, vocab, (prompt,), generator=generator).tolist() for _ in range(batch)
    ]
    times: list[list[float]] = [[] for _ in range(batch)]
    torch.cuda.synchronize()
    time.sleep(0.5)  # the counter's refresh after a quiet moment
    counts = engine.step_counts()
    start_s, start_mj = time.monotonic(), energy_mj(handle)
    # Submitted only now: generate_tokens starts the sequence at once, not when it is read.
    streams = [engine.generate_tokens(p, tokens) for p in prompts]

    def read(i: int) -> None:
        times[i] = [t for _, t in streams[i]]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(batch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    end_s = time.monotonic()
    time.sleep(0.25)  # the counter refreshes every ~100 ms: read it after the last step's
    end_mj = energy_mj(handle)
    decode_start = max(t[0] for t in times)  # every sequence has its first token
    decoded = sum(sum(1 for x in t if x > decode_start) for t in times)
    decode_s = end_s - decode_start
    # While every sequence decodes: from the last first token to the first sequence's end (the
    # prompts are prefilled over several steps, so the sequences start and end staggered and
    # the batch runs below `batch` rows before the first and after the last of them).
    full_end = min(t[-1] for t in times)
    full = sum(sum(1 for x in t if decode_start < x <= full_end) for t in times)
    output = sum(len(t) for t in times)
    energy_j = (end_mj - start_mj) / 1e3
    steps = engine.step_counts().since(counts)
    return {
        "batch": batch,
        "output_tokens": output,
        "wall_s": end_s - start_s,
        "decode_tokens_per_s": decoded / decode_s,
        "full_batch_tokens_per_s": full / (full_end - decode_start) if full else None,
        "first_token_spread_s": decode_start - min(t[0] for t in times),
        "tokens_per_s": output / (end_s - start_s),
        "joules": energy_j,
        "joules_per_token": energy_j / output,
        "mean_power_w": energy_j / (end_s - start_s + 0.25),
        "steps": steps.text(end_s - start_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="llama-3-8b")
    parser.add_argument("--batches", default="1,8,32,64,128")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--no-compile", action="store_true")
    add_one_row_option(parser)
    parser.add_argument(
        "--no-one-row-pdl",
        action="store_true",
        help="the kernel's launches each after the one before ends (the default: PDL, each "
        "starting while the one before runs)",
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        help="the engine's context (default: prompt + tokens + 16; ipw measure's is 4096)",
    )
    parser.add_argument(
        "--prompt-rows",
        type=int,
        help="decode_prompt_rows: prompt tokens a decode step takes as rows (default: engine's)",
    )
    parser.add_argument("--compile-mode", default="default", help="torch.compile's mode")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--diagnose", metavar="N,..", help="after the table, torch_step.py's parts at these batches"
    )
    args = parser.parse_args()
    import pynvml

    from openjarvis.runtime.torch.config import TorchSettings
    from openjarvis.runtime.torch.engine import TorchEngine

    kernel_error = check_kernel()
    print(f"paged decode kernel vs gathered attention: relative difference {kernel_error:.2e}")
    assert kernel_error < 2e-2, "the kernel disagrees with the reference: no speeds reported"
    batches = [int(b) for b in args.batches.split(",")]
    settings = TorchSettings(
        max_seq_len=args.max_seq_len or args.prompt + args.tokens + 16,
        concurrency=max(batches),
        compile=not args.no_compile,
        one_row_kernel=args.one_row,
        one_row_pdl=not args.no_one_row_pdl,
        compile_mode=args.compile_mode,
        decode_prompt_rows=args.prompt_rows,
        # torch_step.py's parts time the runner itself, which only an in-process core has:
        # with --diagnose the table's steps run in this process too (said below).
        engine_process=False if args.diagnose else None,
    )
    started = time.monotonic()
    engine = TorchEngine(args.preset, settings)
    load_s = time.monotonic() - started
    print(f"one-row kernel: {engine.settings_dict()['one_row_kernel_state']}")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    bandwidth = engine.bandwidth_bytes_per_s
    assert bandwidth is not None
    for batch in batches:  # warm-up: compile and capture each bucket once, briefly
        run_batch(engine, batch, 16, 4, handle)
    results = []
    for batch in batches:
        row = run_batch(engine, batch, args.prompt, args.tokens, handle)
        mean_context = args.prompt + args.tokens / 2
        step_bytes = engine.weight_bytes() + batch * engine.kv_bytes(mean_context)
        row["roofline_tokens_per_s"] = batch * bandwidth / step_bytes
        row["roofline_share"] = row["decode_tokens_per_s"] / row["roofline_tokens_per_s"]
        full = row["full_batch_tokens_per_s"]
        row["full_batch_share"] = None if full is None else full / row["roofline_tokens_per_s"]
        results.append(row)
        print(json.dumps(row))
    one = results[0]
    where = "this process" if args.diagnose else "the engine's own process"
    print(
        f"\n{args.preset}: load {load_s:.0f} s, copy bandwidth {bandwidth / 1e12:.2f} TB/s, "
        f"context {settings.max_seq_len}, steps in {where}, "
        f"prompt rows per decode step {engine.settings_dict()['decode_prompt_rows']}, "
        f"compile mode {args.compile_mode}"
    )
    print(
        "batch  decode tok/s  roofline  share  all decoding: tok/s  share  first tokens spread"
        "  J/token  W      tok/s ratio  J/token ratio"
    )
    for row in results:
        full, full_share = row["full_batch_tokens_per_s"], row["full_batch_share"]
        print(
            f"{row['batch']:5d}  {row['decode_tokens_per_s']:12.1f}  "
            f"{row['roofline_tokens_per_s']:8.0f}  {row['roofline_share']:5.2f}  "
            f"{'-' if full is None else f'{full:19.1f}'}  "
            f"{'-' if full_share is None else f'{full_share:5.2f}'}  "
            f"{1e3 * row['first_token_spread_s']:16.1f} ms  "
            f"{row['joules_per_token']:7.4f}  {row['mean_power_w']:5.0f}  "
            f"{row['decode_tokens_per_s'] / one['decode_tokens_per_s']:11.1f}  "
            f"{one['joules_per_token'] / row['joules_per_token']:13.1f}"
        )
    for row in results:
        print(f"{row['batch']:5d}  steps: {row['steps']}")
    if args.diagnose:
        batches = [int(b) for b in args.diagnose.split(",")]
        diagnose(engine, batches, args.prompt + args.tokens // 2, steps=50)
    if args.out:
        summary = {
            "preset": args.preset,
            "kernel_relative_difference": kernel_error,
            "settings": engine.settings_dict(),
            "results": results,
        }
        args.out.write_text(json.dumps(summary, indent=2, default=str))
    engine.close()


if __name__ == "__main__":
    main()

"""The paged attention kernel on a mixed step's rows: one program per row (every row alone, as
the kernel ran before rows that read the same blocks were computed together) against runs of
rows computed together, `--rows` per program, on the GPU.

One layer's cache for a preset's attention shape (random bf16 keys and values), two layouts:
- decode: `--batch` rows, one per sequence, each at position `--context`;
- mixed: those rows, then `--prompt-rows` rows of prompts of `--context` tokens, one query a
  row at positions 0.. (new prompts joining the decode step), each prompt its own blocks.
Each is replayed from a CUDA graph of `--layers` calls (a step's layers), and the outputs of
the two ways are compared.

`PYTHONPATH=src python3 benchmarks/attention_rows.py --preset llama-3-8b --batch 64`
"""

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import triton
from persistent_probe import graph_ms  # this folder is on the path

if TYPE_CHECKING:
    from openjarvis.runtime.torch.model import ModelConfig

__all__ = ["main"]


def layout(batch: int, prompt_rows: int, context: int, width: int, block: int) -> tuple:
    """Tables [R, width] int32 and contexts [R] (keys visible) of the mixed step's rows."""
    prompts = -(-prompt_rows // context)
    per_row = -(-(context + 1) // block)
    assert per_row <= width
    tables = torch.zeros(batch + prompts, width, dtype=torch.int32)
    for sequence in range(batch + prompts):
        first = 1 + sequence * per_row
        tables[sequence, :per_row] = torch.arange(first, first + per_row)
    index = torch.arange(prompt_rows)
    row_tables = torch.cat([tables[:batch], tables[batch + index // context]])
    contexts = torch.cat([torch.full((batch,), context + 1), index % context + 1])
    return row_tables, contexts, 1 + (batch + prompts) * per_row


def step_ms(call: Callable[[], torch.Tensor], layers: int, steps: int) -> float:
    """Milliseconds per replay of a CUDA graph of `layers` calls."""

    def layers_calls() -> torch.Tensor:
        return [call() for _ in range(layers)][-1]

    return graph_ms(layers_calls, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="llama-3-8b")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-rows", type=int, default=2048)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--rows", default="4,8,16", help="rows per program to try")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    from openjarvis.runtime.torch.model import config_for
    from openjarvis.runtime.torch.paged import BLOCK_SIZE

    config = config_for(args.preset)
    device = torch.device("cuda")
    width = -(-(args.context + 64) // BLOCK_SIZE)
    for name, prompt_rows in (("decode", 0), ("mixed", args.prompt_rows)):
        tables, contexts, blocks = layout(args.batch, prompt_rows, args.context, width, BLOCK_SIZE)
        result = compare(config, tables.to(device), contexts.to(device), blocks, args)
        print(json.dumps({"layout": name, **result}), flush=True)


def compare(
    config: "ModelConfig",
    tables: torch.Tensor,
    contexts: torch.Tensor,
    blocks: int,
    args: argparse.Namespace,
) -> dict[str, object]:
    """One layout's rows alone against runs together, each `--rows`, in ms per step."""
    from functools import partial

    from openjarvis.kernels.paged_attention import paged_decode_attention, rows_per_program
    from openjarvis.runtime.torch.paged import BLOCK_SIZE, row_joins

    heads, kv_heads, head_dim = config.n_heads, config.n_kv_heads, config.head_dim
    device = tables.device
    shape = (blocks, BLOCK_SIZE, kv_heads, head_dim)
    k = torch.randn(shape, device=device, dtype=torch.bfloat16)
    v = torch.randn(shape, device=device, dtype=torch.bfloat16)
    q = torch.randn(tables.size(0), heads, head_dim, device=device, dtype=torch.bfloat16)
    alone = torch.zeros(tables.size(0), dtype=torch.bool, device=device)
    joins = row_joins(tables, 1)
    step = partial(
        paged_decode_attention, q, k, v, tables, contexts, scale=head_dim**-0.5, window=0
    )
    layers, steps = args.layers, args.steps
    before = step(joins=alone)
    result: dict[str, object] = {"rows": tables.size(0)}
    result["alone_ms"] = round(step_ms(partial(step, joins=alone), layers, steps), 3)
    default = rows_per_program(tables.size(0), heads // kv_heads)
    tried = {default, *(int(r) for r in args.rows.split(","))}
    for rows in sorted(tried):
        if rows * triton.next_power_of_2(heads // kv_heads) < 16:  # the operator refuses it
            continue
        error = (step(joins=joins, rows=rows).float() - before.float()).abs().max().item()
        ms = step_ms(partial(step, joins=joins, rows=rows), layers, steps)
        mark = " (default)" if rows == default else ""
        result[f"rows_{rows}{mark}"] = {"ms": round(ms, 3), "max_diff": error}
    return result


if __name__ == "__main__":
    main()

"""Rows that read the same blocks, computed together by the paged attention kernel: a mixed
step's prompt rows (one query each, a prompt's tokens in order, the prompt-ending row apart
from its run) beside decode rows, against the gathered attention. On a GPU in bf16 (`-m gpu`),
or on the CPU under TRITON_INTERPRET=1 in float32 (the interpreter loads masked bf16 lanes as
their raw bits)."""

import math

import pytest

pytest.importorskip("torch")

import torch

from openjarvis.runtime.torch.paged import Layout, PagedKV, row_joins
from tests.kernels.triton_device import KERNEL_MARKS, kernel_device

pytestmark = KERNEL_MARKS

# (sequence, position) per row, in the scheduler's order: decode rows, the rows that end a
# prompt, then each prompt's other rows in order. Runs of 37 and 100 rows start and end off the
# kernel's tiles of rows.
_MIXED = (
    [(0, 300), (1, 7), (2, 16)]
    + [(3, 37), (4, 140)]
    + [(3, p) for p in range(37)]
    + [(4, p) for p in range(40, 140)]
)


def _case(
    rows: list[tuple[int, int]], heads: int, kv_heads: int, head_dim: int, width: int
) -> tuple[PagedKV, PagedKV, "torch.Tensor", Layout]:
    device = torch.device(kernel_device() or "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    block_size = 16
    sequences = sorted({sequence for sequence, _ in rows})
    blocks = 1 + len(sequences) * width
    generator = torch.Generator().manual_seed(len(rows) * 100 + heads + head_dim)
    cache = PagedKV(blocks, block_size, kv_heads, head_dim, dtype, device)
    reference = PagedKV(blocks, block_size, kv_heads, head_dim, torch.float32, device)
    for name in ("k", "v"):
        values = torch.randn(blocks, block_size, kv_heads, head_dim, generator=generator)
        getattr(cache, name).copy_(values.to(dtype))
        getattr(reference, name).copy_(values.to(dtype).float())
    order = (torch.randperm(blocks - 1, generator=generator) + 1).view(len(sequences), width)
    tables = torch.stack([order[sequences.index(s)] for s, _ in rows]).to(torch.int32)
    positions = torch.tensor([[position] for _, position in rows])
    layout = Layout(positions.to(device), torch.zeros_like(positions).to(device), tables.to(device))
    q = torch.randn(len(rows), 1, heads, head_dim, generator=generator).to(dtype).to(device)
    return cache, reference, q, layout


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [(4, 1, 256), (32, 8, 128), (8, 8, 64)],
    ids=["gemma-270m", "llama-8b", "mha"],
)
@pytest.mark.parametrize("window", [None, 40], ids=["full", "window-40"])
@pytest.mark.parametrize("extra_decode_rows", [0, 60], ids=["narrow", "wide"])
def test_prompt_rows_beside_decode_rows_match_the_gathered_attention(
    heads: int, kv_heads: int, head_dim: int, window: int | None, extra_decode_rows: int
) -> None:
    """Narrow: 142 rows; wide: 60 more decode rows, so the step's programs take more rows each
    (the kernel picks rows per program by the step's width)."""
    pytest.importorskip("triton")
    rows = _MIXED + [(5 + i, 20 + 3 * i) for i in range(extra_decode_rows)]
    cache, reference, q, layout = _case(rows, heads, kv_heads, head_dim, width=24)
    joins = row_joins(layout.block_tables, 1)
    assert int(joins.sum()) == 36 + 99  # each prompt's run joins after its first row
    scale = 1 / math.sqrt(head_dim)
    if q.is_cuda:  # the engine's path: attend finds the joins itself
        out = cache.attend(q, layout, mask=None, window=window, scale=scale, softcap=None)
    else:  # attend gathers on the CPU: the kernel called as the GPU would call it
        from openjarvis.kernels.paged_attention import paged_decode_attention

        flat, context = q.reshape(len(rows), heads, head_dim), layout.positions.reshape(-1) + 1
        tables = layout.block_tables
        out = paged_decode_attention(
            flat, cache.k, cache.v, tables, context, joins, scale, window or 0
        )
        out = out.view_as(q)
    mask = layout.masks(16, window)
    expected = reference.gathered(q.float(), layout, mask, scale, softcap=None)
    bound = 2e-2 if q.dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.float(), expected, atol=bound, rtol=bound)

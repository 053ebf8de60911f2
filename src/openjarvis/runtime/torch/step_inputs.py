"""A scheduled step as the tensors every rank runs, and the step shapes that get a CUDA graph:
decode batch buckets, prefill prompt-length buckets and their block-table widths. Rank 0 packs
a step into one header and one body to broadcast; the other ranks unpack it.
"""

from dataclasses import dataclass, replace
from typing import cast

import torch
from torch import Tensor

from openjarvis.runtime.torch.paged import BLOCK_SIZE, SCRATCH_BLOCK
from openjarvis.runtime.torch.scheduler import Step

__all__ = [
    "STOP",
    "StepInputs",
    "batch_buckets",
    "pad_prefill",
    "prefill_buckets",
    "prefill_graph_key",
    "prefill_widths",
]

# A packed step's first header field: what the other ranks do with it.
STOP, _PREFILL, _DECODE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class StepInputs:
    """A step as tensors, rows left-padded to one length (padding sits in the scratch block)."""

    decode: bool
    last_only: bool
    tokens: Tensor  # [B, T] long
    positions: Tensor  # [B, T] long
    slots: Tensor  # [B, T] long
    tables: Tensor  # [B, W] int32

    @classmethod
    def of(cls, step: Step, block_size: int, tokens: Tensor | None = None) -> "StepInputs":
        """One tensor per field, built from the sequences' table rows and plain lists: a
        decode step of a hundred rows costs no per-row tensor work. `tokens` ([K, 1], on the
        device) stands in for a continued step's PENDING tokens, its first K rows."""
        rows = step.rows
        sequences = [row.sequence for row in rows]
        length = max([len(row.tokens) for row in rows])
        width = max([len(sequence.blocks) for sequence in sequences])
        # Admitted sequences have their table (torch.stack refuses a None).
        tables = torch.stack(cast(list[Tensor], [s.table for s in sequences]))[:, :width]
        if length == 1:  # a decode step: one position a row, in flat lists (a column each)
            starts = [row.start for row in rows]
            where = torch.tensor(starts, dtype=torch.long).view(-1, 1)
            slots = torch.tensor(
                [
                    _slot(sequence.blocks, start, block_size)
                    for sequence, start in zip(sequences, starts, strict=True)
                ],
                dtype=torch.long,
            ).view(-1, 1)
        else:  # left-padded: a padding position is -1, its slot in the scratch block
            positions = [
                [-1] * (length - len(row.tokens))
                + list(range(row.start, row.start + len(row.tokens)))
                for row in rows
            ]
            slot_rows = [
                [_slot(row.sequence.blocks, position, block_size) for position in places]
                for row, places in zip(rows, positions, strict=True)
            ]
            where = torch.tensor(positions, dtype=torch.long).clamp_(min=0)
            slots = torch.tensor(slot_rows, dtype=torch.long)
        last_only = not sequences[0].all_logits  # a scoring prompt's step is its own
        if tokens is None:  # left-padded with 0 (padding sits in the scratch block)
            padded = [[0] * (length - len(row.tokens)) + row.tokens for row in rows]
            tokens = torch.tensor(padded, dtype=torch.long)
        elif tokens.size(0) < len(rows):  # then rows whose tokens are known (one each)
            known = torch.tensor([row.tokens for row in rows[tokens.size(0) :]], dtype=torch.long)
            if tokens.is_cuda:
                known = known.pin_memory().to(tokens.device, non_blocking=True)
            tokens = torch.cat([tokens, known])
        return cls(step.kind == "decode", last_only, tokens, where, slots, tables)

    def on(self, device: torch.device) -> "StepInputs":
        """The step's host tensors copied to the GPU through pinned memory: a copy from
        pageable memory may wait for the stream, i.e. for the step still running."""
        if device.type != "cuda":
            return self
        names = ("tokens", "positions", "slots", "tables")
        moved = {
            name: getattr(self, name).pin_memory().to(device, non_blocking=True)
            for name in names
            if getattr(self, name).device != device
        }
        return replace(self, **moved)

    def pack(self) -> tuple[Tensor, Tensor]:
        batch, length = self.tokens.shape
        op = _DECODE if self.decode else _PREFILL
        header = torch.tensor([op, batch, length, self.tables.size(1), int(self.last_only)])
        body = torch.cat(
            [t.reshape(-1).long() for t in (self.tokens, self.positions, self.slots, self.tables)]
        )
        return header, body

    @classmethod
    def unpack(cls, header: list[int], body: Tensor) -> "StepInputs":
        op, batch, length, width, last_only = header
        cells = batch * length
        tokens, positions, slots, tables = body.split([cells, cells, cells, batch * width])
        shape = (batch, length)
        return cls(
            op == _DECODE,
            bool(last_only),
            tokens.view(shape),
            positions.view(shape),
            slots.view(shape),
            tables.view(batch, width).to(torch.int32),
        )


def batch_buckets(rows: int, concurrency: int) -> tuple[int, ...]:
    """Decode step sizes with a CUDA graph each, for steps of at most `rows` rows: 1, 2, 4, then
    every multiple of 8 up to the concurrency (vLLM's capture sizes: a step of running
    sequences pads at most 7 rows; on an H200 the embedded model's 40 rows replayed in 0.96 ms
    from their own graph against 1.04 from the 64-row one), then powers of two for the steps
    that new prompts join, and `rows`."""
    top = min(concurrency, rows)
    sizes = [size for size in (1, 2, 4) if size < top] + list(range(8, top, 8)) + [top]
    power = 1 << top.bit_length()
    while power < rows:
        sizes.append(power)
        power <<= 1
    if rows > top:
        sizes.append(rows)
    return tuple(sizes)


def prefill_buckets(prefill_tokens: int) -> tuple[int, ...]:
    """Prompt lengths with a prefill graph each: powers of two from 16 up to the prefill budget,
    and it."""
    sizes = [1 << i for i in range(4, prefill_tokens.bit_length()) if 1 << i < prefill_tokens]
    return (*sizes, prefill_tokens)


def prefill_widths(length: int, table_width: int) -> tuple[int, ...]:
    """Block-table widths with a prefill graph for prompt-length bucket `length`: powers of two
    from the blocks `length` tokens fill up to the widest table, and it."""
    least = -(-length // BLOCK_SIZE)
    sizes = [1 << i for i in range(table_width.bit_length()) if least <= 1 << i < table_width]
    return (*sizes, table_width)


def prefill_graph_key(
    length: int, width: int, buckets: tuple[int, ...], table_width: int
) -> tuple[int, int] | None:
    """The (length, width) of the smallest prefill graph that holds a one-sequence step of
    `length` tokens whose table spans `width` blocks (None: longer than every bucket)."""
    bucket = next((b for b in buckets if b >= length), None)
    if bucket is None:
        return None
    return bucket, next(w for w in prefill_widths(bucket, table_width) if w >= width)


def pad_prefill(inputs: StepInputs, bucket: int, table_width: int) -> StepInputs:
    """A one-sequence prefill step as its bucket's graph takes it: the tokens right-aligned in
    `bucket` columns after padding at position 0 whose keys and values go to the scratch block
    (no real query sees them: their table columns lie past every real position), and the
    block table padded with the scratch block to `table_width`."""
    tokens, positions, slots, tables = inputs.tokens, inputs.positions, inputs.slots, inputs.tables
    pad = bucket - tokens.size(1)
    assert tokens.size(0) == 1 and pad >= 0 and inputs.last_only and not inputs.decode

    def left(values: Tensor, fill: int) -> Tensor:
        return torch.cat([values.new_full((1, pad), fill), values], dim=1)

    wide = tables.new_full((1, table_width), SCRATCH_BLOCK)
    wide[:, : tables.size(1)] = tables
    return StepInputs(
        False,
        True,
        left(tokens, 0),
        left(positions, 0),
        left(slots, SCRATCH_BLOCK * BLOCK_SIZE),
        wide,
    )


def _slot(blocks: list[int], position: int, block_size: int) -> int:
    """Where a position's key and value go in the cache: its block's slot, or the scratch
    block's first for a padding position (-1). A step's rows are built while their sequences
    still hold their blocks (a stale row's sequence finishes in the step before, which lands
    after this one is launched)."""
    if position < 0:
        return SCRATCH_BLOCK * block_size
    return blocks[position // block_size] * block_size + position % block_size

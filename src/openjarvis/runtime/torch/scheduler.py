"""Which sequences run in the next step, apart from the model (nano-vllm's split): admission
while blocks last, chunked prefill under a token budget, then decode of every running sequence,
and finishing (end token, token limit, or the consumer left). While sequences decode, a new
prompt's tokens join their decode step as rows of one query each (`prompt_rows` of them at
most) instead of stopping the batch for a prefill step of their own.

A sequence is admitted only when blocks for its whole length (prompt + max tokens) are free, so
a running sequence never waits for memory and nothing is ever preempted. Its prompt's leading
full blocks that the pool already holds (an earlier prompt's prefix) are shared instead of
computed, and every block it fills is published for later prompts (paged.py, BlockPool).
"""

import queue
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from openjarvis.runtime.torch.paged import SCRATCH_BLOCK, BlockPool, chain_key
from openjarvis.runtime.types import WorkPiece

__all__ = ["PENDING", "Pieces", "Row", "Scheduler", "Sequence", "Step"]

# A continued decode row's token: the step before it is still picking it, on the device.
PENDING = -1

# What a consumer receives: a batch of (token, arrival time) ending with None at the end, or the
# error.
Delivery = list[tuple[int, float] | None] | BaseException
# Consumers are handed their tokens in periods while steps run back to back: one wake-up per
# consumer per period rather than per step, which on a small model would take the interpreter
# from the step loop. The period is at least DELIVERY_PERIOD_S and long enough that all the
# running sequences' consumers together wake at most DELIVERY_WAKES_PER_S times a second (64
# streams: every 64 ms). A sequence's first token and its end are handed over at once, alone.
DELIVERY_PERIOD_S = 0.01
DELIVERY_WAKES_PER_S = 1000.0


@dataclass(eq=False)
class Sequence:
    """One request's tokens and state. The scheduler's thread writes; the consumer reads
    `outbox` (filled through `hand`) and may set `cancelled`."""

    prompt: list[int]
    max_tokens: int
    end_tokens: frozenset[int]
    temperature: float = 0.0
    seed: int = 0
    all_logits: bool = False  # scoring: the prompt's logits, no tokens
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    # Its blocks as one row of a block table, padded with the scratch block to the widest a
    # sequence can need: reserved at admission, it never changes while the sequence runs.
    table: Tensor | None = None
    cached: int = 0  # tokens whose keys and values are in the cache
    # Prompt tokens handed to steps: ahead of `cached` while a step holding them runs.
    scheduled: int = 0
    reused: int = 0  # prompt tokens taken from the prefix cache at admission, not computed
    # Keys of its prompt's full blocks before the last token (looked up once), then of every
    # block it filled: block i of `blocks` holds the prefix keys[i] names.
    keys: list[bytes] | None = None
    cancelled: bool = False
    finished: bool = False
    work: list[WorkPiece] = field(default_factory=list)
    followed: bool = False  # the meter follows its steps (`StepLedger.attach`)
    logits: Tensor | None = None  # all_logits: [len(prompt), vocab] float32 on the CPU
    generator: torch.Generator | None = None  # sampling at temperature > 0, seeded once
    outbox: "queue.SimpleQueue[Delivery]" = field(default_factory=queue.SimpleQueue)

    def hand(self, item: Delivery) -> None:
        """Give the consumer a batch, or the error that ends the sequence."""
        self.outbox.put(item)

    @property
    def length(self) -> int:
        """Tokens the sequence may grow to; its blocks are reserved for all of them."""
        return len(self.prompt) + self.max_tokens

    @property
    def prefilling(self) -> bool:
        return self.cached < len(self.prompt)

    @property
    def unscheduled(self) -> int:
        """Prompt tokens no step has been handed yet."""
        return len(self.prompt) - self.scheduled


@dataclass(slots=True)  # not frozen: a step makes one per sequence, and a frozen dataclass's
class Row:  # __init__ takes three times as long
    """One sequence's part of a step: `tokens` at positions start.. of its sequence."""

    sequence: Sequence
    tokens: list[int]
    start: int
    sample: bool  # the row ends the prompt or decodes: the next token is picked from it


@dataclass(frozen=True, slots=True)
class Step:
    kind: Literal["prefill", "decode"]
    rows: list[Row]


# A landed step's pieces of work, each with the live sequences that took it (rows of one size
# share a piece).
Pieces = list[tuple[WorkPiece, list[Sequence]]]


class Scheduler:
    def __init__(
        self,
        pool: BlockPool,
        concurrency: int,
        prefill_tokens: int,
        max_seq_len: int,
        prefill_rows: int | None = None,
        prompt_rows: int = 0,
    ) -> None:
        self.pool = pool
        self.concurrency = concurrency
        self.prefill_tokens = prefill_tokens  # chunked prefill: tokens per prefill step
        # Sequences one prefill step carries at most (None: as many as the budget holds); 1
        # where prefill steps replay one-sequence CUDA graphs.
        self.prefill_rows = prefill_rows
        self.max_seq_len = max_seq_len
        # Prompt tokens a decode step takes as one-query rows (0: prompts prefill alone).
        self.prompt_rows = prompt_rows
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # Tokens and ends decided but not yet handed to the consumers: the engine hands them
        # over while the GPU runs the next step (deliver), so waking consumer threads costs
        # the GPU nothing. By sequence, each one's in the order they were decided.
        self._undelivered: dict[Sequence, list[tuple[int, float] | None]] = {}
        self._delivered_s = float("-inf")
        # Sequences whose first token or end is undelivered: handed over without waiting.
        self._urgent: set[Sequence] = set()

    def add(self, sequence: Sequence) -> None:
        """Queue a sequence (the engine has checked it against the context); one that could
        never fit in the KV cache is refused at once."""
        if self.pool.blocks_for(sequence.length) > self.pool.blocks - 1:
            raise ValueError(
                f"{sequence.length} tokens need more KV cache than the engine has "
                f"({(self.pool.blocks - 1) * self.pool.block_size} tokens)"
            )
        self.waiting.append(sequence)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def can_admit(self) -> bool:
        """A waiting sequence could start now: decoding should make way for its prefill."""
        if not self.waiting or len(self.running) >= self.concurrency:
            return False
        sequence = self.waiting[0]
        return self.pool.can_take(self.pool.blocks_for(sequence.length), self._hits(sequence))

    def drop_cancelled(self) -> None:
        """Finish the sequences whose consumers left; their blocks go back to the pool."""
        for sequence in [s for s in self.running if s.cancelled]:
            self._finish(sequence)
        self.waiting = deque(s for s in self.waiting if not s.cancelled)

    def next_step(self) -> Step | None:
        """Drop what the consumers left, admit what fits, then prefill before decoding: new
        prompts in the decode step where something decodes and prompt rows are on, else in
        prefill steps."""
        self.drop_cancelled()
        self._admit()
        decoding = [s for s in self.running if not s.prefilling]
        if decoding and self._mixes():
            return Step("decode", [*_decode_rows(decoding), *self._prompt_rows()])
        rows: list[Row] = []
        budget = self.prefill_tokens
        for sequence in self.running:
            if not sequence.prefilling or budget <= 0:
                continue
            if sequence.all_logits and rows:
                break  # a scoring prompt runs alone and whole
            size = len(sequence.prompt) - sequence.cached
            if not sequence.all_logits:
                size = min(size, budget)
            start = sequence.cached
            chunk = sequence.prompt[start : start + size]
            rows.append(Row(sequence, chunk, start, start + size == len(sequence.prompt)))
            sequence.scheduled = start + size
            budget -= size
            if sequence.all_logits or len(rows) == self.prefill_rows:
                break
        if rows:
            return Step("prefill", rows)
        if not decoding:
            return None
        return Step("decode", _decode_rows(decoding))

    def continued(self, step: Step) -> tuple[Step, list[int]] | None:
        """The decode step after `step`, decided before `step`'s tokens are known: the
        sequences it samples that have not finished, one position on, each row's token PENDING
        (the step picks it on the device), then, where prompt rows are on, the prompt tokens
        that no step holds yet (sequences admitted now included). With the indices of the rows
        of `step` it keeps. None: the chain ends (nothing to continue, or a waiting sequence
        needs a prefill step of its own).

        A sequence that finishes in `step` is still in this one (its row is stale, and
        finish_step ignores it): at most one stale row per sequence, at a position its
        reserved blocks hold (prompt + max tokens - 1 at the latest)."""
        if self._mixes():
            self._admit()
            if not self._mixes():  # a scoring prompt came in: it prefills alone
                return None
        elif self.can_admit:
            return None
        kept = [i for i, row in enumerate(step.rows) if row.sample and not row.sequence.finished]
        rows = [Row(step.rows[i].sequence, [PENDING], step.rows[i].start + 1, True) for i in kept]
        if self.prompt_rows:
            rows += self._prompt_rows()
        if not rows:
            return None
        return Step("decode", rows), kept

    def _mixes(self) -> bool:
        """Prompts join decode steps: prompt rows are on and no scoring prompt (which runs
        alone, for all its logits) is prefilling."""
        return self.prompt_rows > 0 and not any(s.all_logits and s.prefilling for s in self.running)

    def _prompt_rows(self) -> list[Row]:
        """Up to `prompt_rows` prompt tokens no step holds yet, one row each, in admission
        order, but the rows that end a prompt first: the runner computes logits for a decode
        step's first `concurrency` rows only, and those rows pick their prompts' first
        tokens (no more of them than sequences run)."""
        ending: list[Row] = []
        rows: list[Row] = []
        budget = self.prompt_rows
        for sequence in self.running:
            if budget <= 0:
                break
            size = min(sequence.unscheduled, budget)
            if size <= 0:
                continue
            start, last = sequence.scheduled, len(sequence.prompt) - 1
            rows += [
                Row(sequence, [sequence.prompt[position]], position, False)
                for position in range(start, min(start + size, last))
            ]
            if start + size > last:
                ending.append(Row(sequence, [sequence.prompt[last]], last, True))
            sequence.scheduled = start + size
            budget -= size
        return ending + rows

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.concurrency:
            sequence = self.waiting[0]
            needed = self.pool.blocks_for(sequence.length)
            hits = self._hits(sequence)
            if not self.pool.can_take(needed, hits):
                return  # first come, first served: later ones wait behind it
            self.waiting.popleft()
            sequence.blocks = self.pool.take(needed, hits)
            reused = len(hits) * self.pool.block_size
            sequence.cached = sequence.reused = sequence.scheduled = reused
            assert sequence.keys is not None
            del sequence.keys[len(hits) :]  # from here on, the keys of blocks it fills
            width = self.pool.blocks_for(self.max_seq_len)
            row = sequence.blocks + [SCRATCH_BLOCK] * (width - needed)
            sequence.table = torch.tensor(row, dtype=torch.int32)
            self.running.append(sequence)

    def _hits(self, sequence: Sequence) -> list[int]:
        """The pool's blocks holding the longest leading run of the prompt's full blocks. The
        last prompt token is always computed (its logits pick the first token), and a scoring
        prompt computes every position (it wants each one's logits)."""
        if sequence.keys is None:
            shared = [] if sequence.all_logits else sequence.prompt[:-1]
            sequence.keys = self.pool.prefix_keys(shared)
        return self.pool.cached(sequence.keys)

    def _publish(self, sequence: Sequence, keys: list[bytes]) -> None:
        """Publish the blocks the sequence (whose `keys` these are) has filled since the last
        step, for later prompts; the caller checks that it filled one."""
        size = self.pool.block_size
        prompt, output = sequence.prompt, sequence.output
        for index in range(len(keys), sequence.cached // size):
            low, high = index * size, (index + 1) * size  # the block's positions
            # Its tokens from the prompt, the reply or both (not the whole sequence copied).
            reply = output[max(low - len(prompt), 0) : max(high - len(prompt), 0)]
            tokens = prompt[low:high] + reply
            keys.append(chain_key(keys[-1] if keys else b"", tokens))
            self.pool.publish(sequence.blocks[index], keys[-1])

    def finish_step(
        self, step: Step, picked: list[int | None], start_s: float, end_s: float
    ) -> Pieces:
        """Record the step: each row's tokens are cached now; sampled rows get their token,
        stamped with the step's end time (delivered by `deliver`); finished sequences give
        their blocks back. Rows of sequences that finished before the step (stale rows of a
        continued step) are ignored: the live sequences share the step's work by their tokens
        in it (every row's, a prompt's one-query rows included). Returns the step's pieces
        with the live sequences that took each."""
        live = [
            (row, token)
            for row, token in zip(step.rows, picked, strict=True)
            if not row.sequence.finished
        ]
        sizes: dict[Sequence, int] = {}  # the tokens each live sequence took in the step
        for row, _ in live:
            sequence, taken = row.sequence, len(row.tokens)
            sizes[sequence] = sizes.get(sequence, 0) + taken
            if row.start + taken > sequence.cached:
                sequence.cached = row.start + taken
        total, block_size = sum(sizes.values()), self.pool.block_size
        # Sequences that took as many tokens share one (frozen) piece: a decode step makes one.
        pieces: dict[int, tuple[WorkPiece, list[Sequence]]] = {}
        for sequence, size in sizes.items():
            keys = sequence.keys
            assert keys is not None, "admitted sequences have their keys"
            if sequence.cached // block_size > len(keys):
                self._publish(sequence, keys)  # it filled a block
            shared = pieces.get(size)
            if shared is None:
                shared = pieces[size] = (WorkPiece(start_s, end_s, size / total, len(sizes)), [])
            sequence.work.append(shared[0])
            shared[1].append(sequence)
        undelivered = self._undelivered
        for row, token in live:
            sequence = row.sequence
            if sequence.cancelled or not row.sample or sequence.all_logits:
                if sequence.all_logits and not sequence.prefilling:
                    self._finish(sequence)
                continue
            assert token is not None, "a sampled row has its token"
            output = sequence.output
            output.append(token)
            items = undelivered.get(sequence)
            if items is None:
                undelivered[sequence] = [(token, end_s)]
            else:
                items.append((token, end_s))
            if len(output) == 1:
                self._urgent.add(sequence)
            if token in sequence.end_tokens or len(output) >= sequence.max_tokens:
                self._finish(sequence)
        return list(pieces.values())

    def _finish(self, sequence: Sequence) -> None:
        sequence.finished = True
        self.running.remove(sequence)
        self.pool.give_back(sequence.blocks)
        sequence.blocks = []
        self._undelivered.setdefault(sequence, []).append(None)
        self._urgent.add(sequence)

    def deliver(self, now_s: float | None = None) -> None:
        """Hand the decided tokens and ends to their consumers, one batch each. With `now_s`
        (between steps), everything once a delivery period has passed, else only the
        sequences with a first token or an end to hand over."""
        if now_s is not None and now_s - self._delivered_s < self._period_s():
            if not self._urgent:
                return
            undelivered = self._undelivered
            handed = [(s, undelivered.pop(s)) for s in self._urgent if s in undelivered]
        else:
            handed = list(self._undelivered.items())
            self._undelivered = {}
            self._delivered_s = time.monotonic() if now_s is None else now_s
        self._urgent = set()
        for sequence, batch in handed:
            sequence.hand(batch)

    def _period_s(self) -> float:
        return max(DELIVERY_PERIOD_S, len(self.running) / DELIVERY_WAKES_PER_S)

    def fail(self, error: BaseException) -> None:
        """The step failed: every sequence gets the error and its blocks back."""
        self.deliver()
        for sequence in [*self.running, *self.waiting]:
            sequence.hand(error)
            sequence.finished = True
            if sequence.blocks:
                self.pool.give_back(sequence.blocks)
                sequence.blocks = []
        self.running, self.waiting = [], deque()


def _decode_rows(decoding: list[Sequence]) -> list[Row]:
    """A row per decoding sequence: its last token, at the next position."""
    return [Row(s, [s.output[-1]], s.cached, True) for s in decoding]

"""Several sequences per llama_decode for the llama.cpp engine: one scheduler thread owns the
context, prefills each admitted request alone, then decodes every running sequence one token each.

A lone sequence runs exactly as llama-cpp-python's `Llama.generate` runs it (same prompt chunks,
same sampler chain), so its tokens are the same. Sequences decoded together can part from what
they give alone: ggml's CPU kernels treat 4 or more rows in a group differently from a single row
(docs/benchmarks.md, "llama.cpp: several sequences per decode").
"""

import ctypes
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from openjarvis.errors import UserError
from openjarvis.runtime.ledger import StepLedger, WorkPiece

__all__ = ["BatchScheduler", "Sequence"]

_Item = tuple[int, float] | BaseException | None  # a token and its time, a failure, or the end


@dataclass(eq=False)
class Sequence:
    """One request inside the scheduler: prompt, limits and sampling in; tokens out through
    `tokens()`, and the steps it took part in (`work`) once its stream is closed."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    seed: int | None
    grammar: object | None
    work: list[WorkPiece] = field(default_factory=list)
    followed: bool = False  # the meter follows its steps (`StepLedger.attach`)
    _items: "queue.SimpleQueue[_Item]" = field(default_factory=queue.SimpleQueue)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _retired: threading.Event = field(default_factory=threading.Event)
    # Scheduler thread only: its slot, its sampler chain, the tokens in its KV cells, the
    # tokens produced and the last of them (fed at the next step).
    slot: "_Slot | None" = None
    sampler: Any = None
    fed: list[int] = field(default_factory=list)
    produced: int = 0
    last: int = -1
    reused: int = 0  # prompt tokens whose KV cells the slot already held (not computed again)

    def tokens(self, wake: Callable[[], None]) -> Iterator[tuple[int, float]]:
        """(token, arrival time) until the scheduler ends the sequence; closing the iterator
        early frees its slot, and returns once the scheduler has let go of it (so that `work`
        is complete)."""
        try:
            while (item := self._items.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._cancelled.set()
            wake()
            self._retired.wait()


@dataclass(slots=True)
class _Slot:
    seq_id: int
    cached: list[int] = field(default_factory=list)  # tokens in this seq_id's KV cells


class BatchScheduler:
    """Admits sequences from any thread; its own thread runs every llama.cpp call."""

    def __init__(
        self,
        llama_cpp: ModuleType,
        llama: Any,  # llama_cpp.Llama: weights, vocabulary and its sampler chain
        *,
        n_ctx: int,
        concurrency: int,
        reuse_prompt_cache: bool,
        is_end: Callable[[int], bool],
    ) -> None:
        from llama_cpp import _internals

        self._llama_cpp, self._llama, self._is_end = llama_cpp, llama, is_end
        self._reuse = reuse_prompt_cache
        params = type(llama.context_params)()
        ctypes.pointer(params)[0] = llama.context_params  # a copy of the load's settings
        # Each sequence gets its own n_ctx cells (a KV stream per seq_id: attention reads only
        # its own sequence's cells, which a unified buffer would not).
        params.n_seq_max = concurrency
        params.n_ctx = n_ctx * concurrency
        params.kv_unified = False
        self._n_batch = params.n_batch
        self._context = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        if llama_cpp.llama_n_ctx_seq(self._context.ctx) < n_ctx:
            self._context.close()
            raise UserError(
                f"llama.cpp gave each of {concurrency} sequences fewer than {n_ctx} tokens of "
                "context; lower --n-ctx or the number of sequences"
            )
        self._batch = _internals.LlamaBatch(
            n_tokens=max(self._n_batch, concurrency), embd=0, n_seq_max=1, verbose=False
        )
        self._free = [_Slot(seq_id) for seq_id in range(concurrency)]
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._condition = threading.Condition()
        self._closed = False
        self.ledger = StepLedger()  # each step as it lands, for the meter
        self._thread = threading.Thread(target=self._run, name="llama.cpp scheduler", daemon=True)
        self._thread.start()

    def submit(
        self, sequence: Sequence, ledger_key: int | None = None
    ) -> Iterator[tuple[int, float]]:
        """Queue the sequence; its steps are filed in the ledger under `ledger_key`."""
        sequence.followed = self.ledger.attach(ledger_key, sequence.work)
        with self._condition:
            if self._closed:
                raise UserError("the llama.cpp engine is closed; load the model again")
            self._waiting.append(sequence)
            self._condition.notify()
        return sequence.tokens(self._wake)

    def free_slots(self) -> int:
        with self._condition:
            return len(self._free)

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify()
        self._thread.join()
        self._batch.close()
        self._context.close()

    def _wake(self) -> None:
        with self._condition:
            self._condition.notify()

    def _run(self) -> None:
        failure = UserError("the llama.cpp engine was closed while this stream was open")
        admitted: deque[Sequence] = deque()
        try:
            while (taken := self._next_work()) is not None:
                admitted.extend(taken)
                while admitted:
                    self._prefill(admitted[0])
                    admitted.popleft()
                self._retire_cancelled()
                if self._running:
                    self._decode_step()
        except Exception as error:  # handed to every open stream, never lost
            failure = UserError(f"llama.cpp failed while decoding ({error}); load the model again")
            failure.__cause__ = error
        finally:
            self.ledger.idle()  # no step will land: the meter must not wait for one
            with self._condition:
                self._closed = True
                stranded = {id(s): s for s in [*admitted, *self._running, *self._waiting]}
            for sequence in stranded.values():
                # Tokens not yet read are dropped: their text needs the weights close() frees.
                while not sequence._items.empty():
                    sequence._items.get_nowait()
                sequence._items.put(failure)
                sequence._retired.set()

    def _next_work(self) -> list[Sequence] | None:
        """Wait for work; take waiting sequences into free slots. None once closed."""
        with self._condition:
            if not self._closed and not self._waiting and not self._running:
                self.ledger.idle()
            while not self._closed and not self._waiting and not self._running:
                self._condition.wait()
            if self._closed:
                return None
            self.ledger.busy()  # before any step starts: their times follow this
            admitted = []
            while self._waiting and self._free:
                sequence = self._waiting.popleft()
                sequence.slot = self._take_slot(sequence.prompt)
                admitted.append(sequence)
            return admitted

    def _take_slot(self, prompt: list[int]) -> _Slot:
        """The free slot whose cache shares the longest prefix with the prompt, else the lowest
        seq_id: running seq_ids stay consecutive (see `_decode_step`)."""

        def rank(slot: _Slot) -> tuple[int, int]:
            shared = _common_prefix(slot.cached, prompt) if self._reuse else 0
            return shared, -slot.seq_id

        best = max(self._free, key=rank)
        self._free.remove(best)
        return best

    def _prefill(self, sequence: Sequence) -> None:
        """The prompt alone, in chunks of n_batch tokens, as `Llama.generate` feeds it; the
        first token is sampled from its last row. A cached prefix is kept as `generate` keeps
        it: a whole cached prompt still re-feeds its last token for fresh logits."""
        if sequence._cancelled.is_set():
            self._retire(sequence, running=False)
            return
        assert sequence.slot is not None
        seq_id = sequence.slot.seq_id
        reused = _common_prefix(sequence.slot.cached, sequence.prompt)
        if reused == len(sequence.prompt):
            reused -= 1
        sequence.reused = reused
        self._llama_cpp.llama_memory_seq_rm(self._context.memory, seq_id, reused, -1)
        sequence.fed = list(sequence.prompt[:reused])
        sequence.sampler = self._sampler(sequence)
        rest = sequence.prompt[reused:]
        raw = self._batch.batch
        for start in range(0, len(rest), self._n_batch):
            chunk = rest[start : start + self._n_batch]
            raw.n_tokens = len(chunk)
            for index, token in enumerate(chunk):
                raw.token[index] = token
                raw.pos[index] = len(sequence.fed) + index
                raw.n_seq_id[index] = 1
                raw.seq_id[index][0] = seq_id
                raw.logits[index] = False
            raw.logits[len(chunk) - 1] = True
            step_start_s = time.monotonic()
            self._context.decode(self._batch)
            sequence.fed.extend(chunk)
            if start + self._n_batch >= len(rest):
                token = sequence.sampler.sample(self._context, len(chunk) - 1)
                self._emit(sequence, token, time.monotonic())
            step_end_s = time.monotonic()
            sequence.work.append(WorkPiece(step_start_s, step_end_s, 1.0, 1))
            self.ledger.landed(step_start_s, step_end_s, 1.0 if sequence.followed else 0.0)
        if sequence.produced < sequence.max_tokens and not self._ended(sequence):
            self._running.append(sequence)
        else:
            self._retire(sequence, running=False)

    def _decode_step(self) -> None:
        """One llama_decode with the last token of every running sequence, in seq_id order:
        with a KV stream per sequence, llama.cpp computes together only rows whose seq_ids
        rise by one (its split_equal), and splits the rest into further passes."""
        self._running.sort(key=lambda s: s.slot.seq_id if s.slot else -1)
        running, raw = self._running, self._batch.batch
        raw.n_tokens = len(running)
        for index, sequence in enumerate(running):
            assert sequence.slot is not None, "a running sequence holds a slot"
            raw.token[index] = sequence.last
            raw.pos[index] = len(sequence.fed)
            raw.n_seq_id[index] = 1
            raw.seq_id[index][0] = sequence.slot.seq_id
            raw.logits[index] = True
            sequence.fed.append(sequence.last)
        step_start_s = time.monotonic()
        self._context.decode(self._batch)
        chosen = [s.sampler.sample(self._context, index) for index, s in enumerate(running)]
        step_end_s = time.monotonic()
        # Streams wake only now, all at once: a stream woken mid-step would take the GIL from
        # this thread between its samplers' calls (a stall per call on a busy machine).
        # The rows share one piece (the meter finds a window's pieces among the batch's).
        piece = WorkPiece(step_start_s, step_end_s, 1.0 / len(running), len(running))
        followed = 0.0
        for sequence, token in zip(running, chosen, strict=True):
            sequence.work.append(piece)
            followed += piece.share if sequence.followed else 0.0
            self._emit(sequence, token, step_end_s)
        self.ledger.landed(step_start_s, step_end_s, followed)
        for sequence in list(running):
            if sequence.produced >= sequence.max_tokens or self._ended(sequence):
                self._retire(sequence, running=True)

    def _emit(self, sequence: Sequence, token: int, time_s: float) -> None:
        sequence.last = token
        sequence.produced += 1
        sequence._items.put((token, time_s))

    def _ended(self, sequence: Sequence) -> bool:
        return self._is_end(sequence.last)

    def _retire_cancelled(self) -> None:
        for sequence in [s for s in self._running if s._cancelled.is_set()]:
            self._retire(sequence, running=True)

    def _retire(self, sequence: Sequence, *, running: bool) -> None:
        """End the stream and free the slot; its KV cells stay only for prompt reuse."""
        if running:
            self._running.remove(sequence)
        if sequence.sampler is not None:
            sequence.sampler.close()
        slot = sequence.slot
        assert slot is not None
        if self._reuse:
            if sequence.fed:  # else never prefilled: the cells still hold slot.cached
                slot.cached = sequence.fed
        else:
            self._llama_cpp.llama_memory_seq_rm(self._context.memory, slot.seq_id, -1, -1)
            slot.cached = []
        with self._condition:
            self._free.append(slot)
        sequence._items.put(None)
        sequence._retired.set()

    def _sampler(self, sequence: Sequence) -> Any:
        """llama-cpp-python's own chain for `generate(temp=..., repeat_penalty=1.0)`: greedy at
        temperature 0, else top-k 40, typical 1, top-p 0.95, min-p 0.05, temperature, and a
        draw seeded with the request's seed (a random one without)."""
        seed = self._llama_cpp.LLAMA_DEFAULT_SEED if sequence.seed is None else sequence.seed
        self._llama.set_seed(seed)
        return self._llama._init_sampler(
            temp=sequence.temperature, repeat_penalty=1.0, grammar=sequence.grammar
        )


def _common_prefix(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length

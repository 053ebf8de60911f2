"""One request's generation in a worker thread: the engine's synchronous stream runs inside the
request's own meter window, and its chunks (a stream's only), then the completion with its
resolved energy, are handed to the event loop. Cancelling closes the engine's generator in its
own thread, which frees the sequence (a batching engine's KV cache slot) at the next token.

A thread per request rather than a pool: the generator must be advanced and closed by one
thread, and a stream lasts seconds, so a thread's start-up (~0.1 ms) costs nothing.

Chunks reach the loop in batches: what the worker produced while the loop had not yet taken the
last hand-over goes in the next one, so under load the loop wakes once per batch (and writes
one network send of its events), not once per token.
"""

import asyncio
import threading
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import dataclass, replace
from typing import cast

from openjarvis.power import Meter
from openjarvis.runtime.types import Completion, Engine, StreamChunk
from openjarvis.serve.protocol import EnergyField, ParsedRequest, energy_field

__all__ = ["Finished", "Generation", "Item"]


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a generation: the completion and its energy (resolved after the window)."""

    completion: Completion
    energy: EnergyField


Item = StreamChunk | Finished


class Generation:
    """Runs `engine.stream(request)` in a thread; `next_batch()` awaits its chunks (a stream's;
    a whole reply gets none), then Finished.

    `engine_free` is called (in the worker) once the engine's generator is closed, before the
    energy resolves: the next request need not wait for the counters. `finished` is called
    (in the worker) with a completed request's completion, its energy and the seconds from its
    end to the meter's publication of that energy, before the client hears of it, so a client
    that has the reply finds it in the request log."""

    def __init__(
        self,
        engine: Engine,
        meter: Meter,
        parsed: ParsedRequest,
        *,
        engine_free: Callable[[], None],
        finished: Callable[[Completion, EnergyField, float | None], None],
    ) -> None:
        self.parsed = parsed
        self._engine = engine
        self._meter = meter
        self._engine_free = engine_free
        self._finished = finished
        self._loop = asyncio.get_running_loop()
        self._batches: asyncio.Queue[list[Item | BaseException]] = asyncio.Queue()
        # The worker's items not yet handed to the loop; a hand-over is scheduled while any are.
        self._pending: list[Item | BaseException] = []
        self._pending_lock = threading.Lock()
        self._held: list[Item | BaseException] = []  # an error held back behind its batch
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"serve-{parsed.id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        """Stop at the next chunk and close the engine's generator (the client has gone)."""
        self._cancelled.set()

    def join(self) -> None:
        self._thread.join()

    def interrupt(self, error: BaseException) -> None:
        """On the loop: `next_batch` raises `error` once the chunks handed over before it are
        taken (the server is shutting down)."""
        self._batches.put_nowait([error])

    async def next_batch(self) -> list[Item]:
        """The chunks produced since the last call (at least one item), Finished last once
        there; re-raises what the engine or the meter raised, after the chunks before it."""
        batch = self._held or await self._batches.get()
        self._held = []
        last = batch[-1]  # an error is the worker's last item
        if isinstance(last, BaseException):
            if len(batch) == 1:
                raise last
            self._held, batch = [last], batch[:-1]
        return cast(list[Item], batch)

    def _post(self, item: Item | BaseException) -> None:
        with self._pending_lock:
            self._pending.append(item)
            if len(self._pending) > 1:
                return  # a hand-over is scheduled and takes this one too
        with suppress(RuntimeError):  # a closed loop: the server shut down, nobody listens
            self._loop.call_soon_threadsafe(self._hand_over)

    def _hand_over(self) -> None:
        """On the loop: what the worker posted since the last hand-over, as one batch."""
        with self._pending_lock:
            batch, self._pending = self._pending, []
        self._batches.put_nowait(batch)

    def _run(self) -> None:
        completion: Completion | None = None
        stream = self.parsed.stream
        try:
            try:
                with self._meter.window(self.parsed.id) as window:
                    # A batching engine files the request's steps under the window's key.
                    request = replace(self.parsed.request, ledger_key=window.key)
                    with closing(self._engine.stream(request)) as chunks:
                        for chunk in chunks:
                            if self._cancelled.is_set():
                                return  # closing() closes the generator: the engine frees it
                            if stream:
                                self._post(chunk)
                            completion = chunk.completion or completion
                    if completion is not None and completion.ttft_s is not None:
                        # Prefill energy: the window's part until the first token.
                        window.mark_first_token(window.start_s + completion.ttft_s)
            finally:
                self._engine_free()
            assert completion is not None, "every stream ends with its completion"
            # Published about one counter refresh after the window's end (the ledger's steps
            # past it landed), whatever else is still running.
            energy = energy_field(window.result, completion.energy_estimate)
            published_s, end_s = window.published_s, window.end_s
            delay_s = None if published_s is None or end_s is None else published_s - end_s
            self._finished(completion, energy, delay_s)
            self._post(Finished(completion, energy))
        except BaseException as error:  # handed to the request's handler, which answers it
            self._post(error)

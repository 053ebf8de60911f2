"""Admission of requests to the engine: a fixed number run at once, a bounded number wait in
line for a slot, and the rest are refused at once (HTTP 429) instead of piling up.

Used on the server's event loop; only `release_soon` may be called from another thread (an
asyncio.Semaphore binds to the loop that first waits on it, so it may be made before).
"""

import asyncio
from contextlib import suppress

from openjarvis.errors import UserError

__all__ = [
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_QUEUE",
    "Admission",
    "Overloaded",
    "check_limits",
]

# Bounds for memory (a batching engine's sequences) and for the wait: 32 requests behind
# llama.cpp's 4 sequences on a small CPU (~15 s a reply) wait about 2 minutes, well inside the
# openai client's 10-minute timeout.
DEFAULT_MAX_CONCURRENCY = 64
DEFAULT_MAX_QUEUE = 32


def check_limits(max_concurrency: int, max_queue: int) -> None:
    """Refuse `jarvis serve`'s --max-concurrency below 1 or --max-queue below 0."""
    if max_concurrency < 1:
        raise UserError(f"--max-concurrency must be at least 1, not {max_concurrency}")
    if max_queue < 0:
        raise UserError(f"--max-queue must be 0 or more, not {max_queue}")


class Overloaded(Exception):
    """Every slot is taken and the line is full: answered 429 with this message."""


class Admission:
    """`slots` requests generate at once (1: they take turns); up to `max_waiting` wait."""

    def __init__(self, slots: int, max_waiting: int) -> None:
        if slots < 1 or max_waiting < 0:
            raise ValueError(f"need slots >= 1 and max_waiting >= 0, not {slots}, {max_waiting}")
        self.slots = slots
        self.max_waiting = max_waiting
        self.running = 0
        self.waiting = 0
        self._free = asyncio.Semaphore(slots)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def acquire(self) -> None:
        """Take a slot, waiting in line for one; Overloaded when the line is full."""
        self._loop = asyncio.get_running_loop()
        if self.running >= self.slots and self.waiting >= self.max_waiting:
            raise Overloaded(
                f"the server is at capacity: {self.running} request(s) generating and "
                f"{self.waiting} waiting (jarvis serve --max-concurrency {self.slots} "
                f"--max-queue {self.max_waiting}); retry later"
            )
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        self.running += 1

    def release(self) -> None:
        """Give the slot back (on the event loop)."""
        self.running -= 1
        self._free.release()

    def release_soon(self) -> None:
        """Give the slot back from a worker thread; a loop already closed needs nothing back."""
        assert self._loop is not None, "release follows an acquire"
        with suppress(RuntimeError):  # a closed loop: the server has shut down
            self._loop.call_soon_threadsafe(self.release)

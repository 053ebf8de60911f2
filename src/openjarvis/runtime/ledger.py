"""The step ledger of a batching engine: which sequences each step carried, published as steps
land, and how far in time it is complete.

The engine writes it (its scheduler appends each step's piece to every sequence in the step,
then says the step landed); the meter reads it to split each counter interval among the
windows in it, as soon as the ledger is complete past the interval, so no request waits for
another's end. A window is tied to its sequence by a key that the request carries
(`ledger_key`); only keys the meter opened are followed, so a ledger nobody follows keeps
nothing.
"""

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["StepLedger", "WorkPiece"]


@dataclass(frozen=True, slots=True)
class WorkPiece:
    """One engine step that a sequence took part in, for splitting energy between sequences
    that ran at once: the step's time, this sequence's share of the step's tokens, and how
    many sequences the step carried. A step's tokens each cost about the same (a decode token,
    or a prompt's tokens in a prefill step or as one-query rows of a decode step), so the
    step's measured time is the cost that the shares divide."""

    start_s: float
    end_s: float
    share: float  # this sequence's tokens / all tokens of the step, in (0, 1]
    batch: int  # sequences in the step
    # share * the step's time: its claim on an interval that holds it whole; and the step's
    # time and batch * time, for the mean batch (the meter sums these; computed once per
    # piece, and the rows of a step share one piece).
    claim_s: float = field(init=False, repr=False, compare=False)
    length_s: float = field(init=False, repr=False, compare=False)
    batch_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        length_s = self.end_s - self.start_s
        object.__setattr__(self, "claim_s", self.share * length_s)
        object.__setattr__(self, "length_s", length_s)
        object.__setattr__(self, "batch_s", self.batch * length_s)


class StepLedger:
    """Engine steps by window key, and the time up to which every step is recorded."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[int, list[list[WorkPiece]]] = {}  # key: the work lists of its sequences
        self._busy = False
        self._landed_s = float("-inf")  # the end of the last recorded step (or the busy start)
        self._watch: tuple[float, Callable[[], None]] | None = None

    # The meter's side ------------------------------------------------------------------------

    def open(self, key: int) -> None:
        """Follow the sequences that requests with this key start."""
        with self._lock:
            self._open[key] = []

    def close(self, key: int) -> None:
        """Stop following a key (its window is settled): its pieces are forgotten here."""
        with self._lock:
            self._open.pop(key, None)

    def pieces(self, key: int) -> Sequence[WorkPiece]:
        """The steps of the key's sequences so far, in time order (complete up to
        `complete_s()`). Empty: the key's request has not started a sequence, or ran no step."""
        with self._lock:
            lists = self._open.get(key)
        if not lists:
            return ()
        if len(lists) == 1:
            return lists[0]
        # Several sequences under one window (its requests one after another, or at once).
        return list(heapq.merge(*lists, key=lambda piece: piece.end_s))

    def complete_s(self) -> float:
        """Every step that ends before this time is recorded: the last landed step's end while
        the engine works, now while it is idle."""
        with self._lock:
            return self._complete_s()

    def when_complete(self, time_s: float, callback: Callable[[], None]) -> None:
        """Call `callback` (in the engine's thread, or now) once the ledger is complete up to
        `time_s`; replaces an earlier request (one follower)."""
        with self._lock:
            if self._complete_s() < time_s:
                self._watch = (time_s, callback)
                return
        callback()

    # The engine's side -----------------------------------------------------------------------

    def attach(self, key: int | None, work: list[WorkPiece]) -> None:
        """A sequence started for a request with this key; `work` is the list its steps are
        appended to (the engine's own record), read here without a copy."""
        if key is None:
            return
        with self._lock:
            lists = self._open.get(key)
            if lists is not None:
                lists.append(work)

    def busy(self) -> None:
        """The engine starts working: steps from now on are recorded as they land."""
        with self._lock:
            if not self._busy:
                self._busy = True
                self._landed_s = max(self._landed_s, self._clock())

    def landed(self, end_s: float) -> None:
        """A step ending at `end_s` is recorded (its pieces appended)."""
        with self._lock:
            self._landed_s = max(self._landed_s, end_s)
            callback = self._due()
        if callback is not None:
            callback()

    def idle(self) -> None:
        """The engine waits for requests: nothing runs, so the ledger is complete up to now."""
        with self._lock:
            self._busy = False
            callback = self._due()
        if callback is not None:
            callback()

    def _complete_s(self) -> float:
        return self._landed_s if self._busy else self._clock()

    def _due(self) -> Callable[[], None] | None:
        if self._watch is None or self._complete_s() < self._watch[0]:
            return None
        callback, self._watch = self._watch[1], None
        return callback

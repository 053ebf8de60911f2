"""The step ledger of a batching engine: which sequences each step carried, published as steps
land, and how far in time it is complete.

The engine writes it (its scheduler appends each step's piece to every sequence in the step,
then says the step landed, with the shares of the rows the meter follows summed); the meter
reads it to split each counter interval among the windows in it, as soon as the ledger is
complete past the interval, so no request waits for another's end: an interval's claims in all
(`claimed_s`, from running sums over the steps) once, and each window's own claims from its
steps when it is published. A window is tied to its sequence by a key that the request carries
(`ledger_key`); only keys the meter opened are followed, so a ledger nobody follows keeps
nothing.
"""

import bisect
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
        # The steps in the order they land (their ends ascending), each with its followed
        # rows' shares summed, and the running sums of share * time (a step's claim) before
        # each; steps the meter has split every interval of are forgotten (`forget`). One
        # engine's steps follow one another; an engine that lands each sequence's step apart
        # (a fake) has steps that overlap, as long as the longest held (`_longest_s`).
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._followed: list[float] = []
        self._sums_s: list[float] = [0.0]
        self._longest_s = 0.0

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

    def claimed_s(self, low_s: float, high_s: float) -> float:
        """The followed sequences' claims on [low_s, high_s] summed: each step's followed
        shares times its time inside the interval (what the windows' claims there add up to)."""
        with self._lock:
            starts, ends, followed = self._starts, self._ends, self._followed
            first = bisect.bisect_right(ends, low_s)  # the first step ending after low_s
            last = bisect.bisect_right(ends, high_s, first)  # the first ending after high_s
            claim_s = self._sums_s[last] - self._sums_s[first]
            # Less the parts before low_s of the steps ending in the interval (those ending
            # within the longest step's time of it), plus the parts inside of those ending
            # after it: one step at each edge where steps follow one another.
            index, reach_s = first, low_s + self._longest_s
            while index < last and ends[index] < reach_s:
                if starts[index] < low_s:
                    claim_s -= followed[index] * (low_s - starts[index])
                index += 1
            index, reach_s = last, high_s + self._longest_s
            while index < len(ends) and ends[index] <= reach_s:
                if starts[index] < high_s:
                    claim_s += followed[index] * (high_s - max(starts[index], low_s))
                index += 1
        return max(claim_s, 0.0)

    def forget(self, before_s: float) -> None:
        """The meter has split every interval up to `before_s`: steps ending by then go, once
        they are most of those held (the meter says so at every publication)."""
        with self._lock:
            done = bisect.bisect_right(self._ends, before_s)
            if done == 0 or done * 2 < len(self._ends):
                return
            del self._starts[:done], self._ends[:done], self._followed[:done]
            base = self._sums_s[done]  # from 0 again, so the sums stay small and exact
            self._sums_s = [sum_s - base for sum_s in self._sums_s[done:]]
            self._longest_s = max(
                (end_s - start_s for start_s, end_s in zip(self._starts, self._ends, strict=True)),
                default=0.0,
            )

    def when_complete(self, time_s: float, callback: Callable[[], None]) -> None:
        """Call `callback` (in the engine's thread, or now) once the ledger is complete up to
        `time_s`; replaces an earlier request (one follower)."""
        with self._lock:
            if self._complete_s() < time_s:
                self._watch = (time_s, callback)
                return
        callback()

    # The engine's side -----------------------------------------------------------------------

    def attach(self, key: int | None, work: list[WorkPiece]) -> bool:
        """A sequence started for a request with this key; `work` is the list its steps are
        appended to (the engine's own record), read here without a copy. Whether the meter
        follows it: the engine sums the shares of such rows for `landed`."""
        if key is None:
            return False
        with self._lock:
            lists = self._open.get(key)
            if lists is not None:
                lists.append(work)
        return lists is not None

    def busy(self) -> None:
        """The engine starts working: steps from now on are recorded as they land."""
        with self._lock:
            if not self._busy:
                self._busy = True
                self._landed_s = max(self._landed_s, self._clock())

    def landed(self, start_s: float, end_s: float, followed: float) -> None:
        """A step from `start_s` to `end_s` is recorded (its pieces appended); `followed`: the
        shares of its rows whose sequences `attach` said are followed, summed. Steps land in
        the order of their ends."""
        with self._lock:
            self._landed_s = max(self._landed_s, end_s)
            if followed > 0:
                self._longest_s = max(self._longest_s, end_s - start_s)
                self._starts.append(start_s)
                self._ends.append(end_s)
                self._followed.append(followed)
                self._sums_s.append(self._sums_s[-1] + followed * (end_s - start_s))
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

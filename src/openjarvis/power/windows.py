"""What `Meter.window()` hands its caller: a window's record, its energy once the meter has
published it, and the step ledger a batching engine keeps for the meter.

A handle is a record: the meter's accountant fills in its energy (to the window's end, then with
its tail) and sets its events; the handle never reads the meter's state.
"""

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from openjarvis.power.edges import Share, WorkStep
from openjarvis.power.types import WindowEnergy

__all__ = ["Ledger", "WindowHandle"]


class Ledger(Protocol):
    """A batching engine's step ledger as the meter reads it (runtime/ledger.py writes one;
    power imports nothing from runtime)."""

    def open(self, key: int) -> None: ...
    def close(self, key: int) -> None: ...
    def pieces(self, key: int) -> Sequence[WorkStep]: ...
    def complete_s(self) -> float: ...
    def claimed_s(self, low_s: float, high_s: float) -> float: ...
    def forget(self, before_s: float) -> None: ...
    def when_complete(self, time_s: float, callback: Callable[[], None]) -> None: ...


@dataclass(slots=True)
class Account:
    """One window's energy from one source, as far as the accountant has split the counter."""

    share: Share = field(default_factory=Share)
    at_end: Share | None = None  # a copy once the interval holding the window's end was split
    started: bool = False  # an interval beginning at or before the window's start was split
    reason: str | None = None  # why this source's energy is unknown for the window
    # (low, high, gross joules, its steps' claim) of each interval the window had a share of
    # (those beginning after its first token, where known then, have no prefill part): its
    # prefill part is taken when the window is published, since its first token may be known
    # only at its end.
    intervals: list[tuple[float, float, float, float]] = field(default_factory=list)
    # Its part of the intervals split by the ledger for all their windows at once, taken from its
    # steps when it is first published (`Accountant._by_steps`), and the first token it took
    # the prefill part at (again if that was marked after).
    by_ledger: Share | None = None
    by_ledger_split_s: float | None = None


class WindowHandle:
    """A window's edges and, once published, its energy.

    `key` ties the window to a batching engine's step ledger (pass it as the request's
    `ledger_key`); None when the meter follows no ledger. `result` waits until the counters
    have refreshed past the window's end (about one refresh); `settled()` is the final energy,
    tail included, or None while the tail (at most about a second) is still open.
    """

    def __init__(
        self,
        label: str,
        start_s: float,
        key: int | None,
        sources: int,
        wait: Callable[["WindowHandle", bool], None],
        on_settled: Callable[["WindowHandle"], None] | None,
    ) -> None:
        self.label = label
        self.start_s = start_s
        self.key = key
        self.end_s: float | None = None
        self.split_s: float | None = None  # the first token: prefill before, decode after
        self.tail_end_s: float | None = None  # next window's opening, the tail's bound, or settle
        self.overlapped = False
        self.energy: WindowEnergy | None = None  # to the window's end (its tail not yet known)
        self.published_s: float | None = None  # when `energy` was published (meter's clock)
        self.final: WindowEnergy | None = None  # tail included
        self.accounts = [Account() for _ in range(sources)]  # written by the accountant only
        self.resolved = threading.Event()
        self.settled_event = threading.Event()
        self.on_settled = on_settled
        self._wait = wait

    def mark_first_token(self, time_s: float) -> None:
        """Split the window's energy at `time_s` (on the meter's clock) into prefill and decode."""
        self.split_s = time_s

    @property
    def result(self) -> WindowEnergy:
        """The window's energy: the final one when its tail is already known, else the energy
        to its end. Waits (after the window, never inside it) about one counter refresh."""
        if self.end_s is None:
            raise RuntimeError(f"window {self.label!r} is still open: read result after `with`")
        self._wait(self, False)
        published = self.final or self.energy
        assert published is not None, "a window is published before its waiter returns"
        return published

    def wait_settled(self) -> WindowEnergy:
        """The final energy, tail included, waiting for it (the tail is bounded)."""
        if self.end_s is None:
            raise RuntimeError(f"window {self.label!r} is still open: read result after `with`")
        self._wait(self, True)
        assert self.final is not None, "a settled window has its final energy"
        return self.final

    def settled(self) -> WindowEnergy | None:
        """The final energy, tail included, or None while it is not published yet."""
        return self.final

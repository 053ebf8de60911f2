"""Per-source bookkeeping for the Meter: unwraps counters, integrates power, counts faults.

Every read of a source, by the sampler or at a window's edge, goes through `Track.advance()`.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass

from openjarvis.power.sources import EnergySource, ReadError
from openjarvis.power.types import PowerSample

__all__ = ["Track", "TrackReading", "energy_between"]


@dataclass(frozen=True, slots=True)
class TrackReading:
    """A source's state right after one read.

    `energy_j` is cumulative since the track's first read (None when this read failed);
    `fault_count` grows at every failure, so two readings with different counts have a
    fault between them and their difference means nothing.
    """

    time_s: float
    energy_j: float | None
    fault_count: int
    reason: str | None  # the latest fault's reason code
    read_count: int  # successful reads so far


def energy_between(start: TrackReading, end: TrackReading) -> tuple[float | None, str | None]:
    """Joules between two readings of one track, or None with the reason it is unknown."""
    if start.energy_j is None:
        return None, start.reason
    if end.energy_j is None or end.fault_count != start.fault_count:
        return None, end.reason
    return end.energy_j - start.energy_j, None


class Track:
    """Turns one source's raw reads into a continuous cumulative energy, thread-safely."""

    def __init__(self, source: EnergySource, clock: Callable[[], float]) -> None:
        self.source = source
        self._clock = clock
        self._lock = threading.Lock()
        # The sampler must read a wrapping counter at least twice per shortest wrap period.
        self.sample_period_s = source.sample_period_s
        if source.max_read_interval_s is not None:
            self.sample_period_s = min(self.sample_period_s, source.max_read_interval_s / 2)
        self.next_due_s = float("-inf")
        self._energy_j = 0.0
        self._last_value: float | None = None  # None: the next read starts afresh
        self._last_time_s = 0.0
        self._fault_count = 0
        self._reason: str | None = None
        self._read_count = 0
        self._trace_start: tuple[float, float] | None = None  # (time_s, energy_j)

    def advance(self) -> TrackReading:
        """Read the source once and fold the value into the cumulative energy."""
        with self._lock:
            now_s = self._clock()
            try:
                value = self.source.read()
            except ReadError as error:
                self._fault(error.reason)
                return self._reading(now_s, ok=False)
            if self._last_value is not None:
                gap_s = now_s - self._last_time_s
                if self.source.reads == "power_w":
                    # Trapezoids between readings; the sampler keeps the gaps short.
                    self._energy_j += 0.5 * (self._last_value + value) * gap_s
                else:
                    self._add_counter_delta(value - self._last_value, gap_s)
            self._last_value, self._last_time_s = value, now_s
            self._read_count += 1
            return self._reading(now_s, ok=True)

    def trace_point(self, reading: TrackReading) -> PowerSample | None:
        """Mean watts since the previous trace point, for the sampler's readings only."""
        with self._lock:
            if reading.energy_j is None:
                self._trace_start = None
                return None
            start, self._trace_start = self._trace_start, (reading.time_s, reading.energy_j)
            if start is None or start[0] >= reading.time_s:
                return None
            power_w = (reading.energy_j - start[1]) / (reading.time_s - start[0])
            return PowerSample(self.source.name, reading.time_s, power_w)

    def _add_counter_delta(self, delta_j: float, gap_s: float) -> None:
        wrap_j = self.source.wrap_j
        if delta_j < 0:
            if wrap_j is None:
                # A counter that never wraps went backwards: reset by a driver reload.
                self._fault("read-error")
                return
            delta_j += wrap_j
        max_gap_s = self.source.max_read_interval_s
        if max_gap_s is not None and gap_s > max_gap_s:
            # Reads too far apart to tell how many times the counter wrapped.
            self._fault("missed-wrap")
            return
        self._energy_j += delta_j

    def _fault(self, reason: str) -> None:
        self._fault_count += 1
        self._reason = reason
        self._last_value = None
        self._trace_start = None

    def _reading(self, now_s: float, ok: bool) -> TrackReading:
        return TrackReading(
            time_s=now_s,
            energy_j=self._energy_j if ok else None,
            fault_count=self._fault_count,
            reason=self._reason,
            read_count=self._read_count,
        )

"""Per-source bookkeeping for the Meter: unwraps counters, integrates power, counts faults, and
keeps the knots (instants of known cumulative energy) that window energies are attributed from.

Every read of a source, by the sampler or at a window's edge, goes through `Track.advance()`.
A counter that refreshes only now and then (NVML's, every ~100 ms) has a `RefreshClock` that
learns when it refreshes, so each new value is placed at its refresh, not at the read.
"""

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass

from openjarvis.power.edges import Knot
from openjarvis.power.refresh_clock import RefreshClock
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
        self._lock = threading.Lock()  # the state below
        self._read_lock = threading.Lock()  # a read and its folding, for edge-read sources
        # The sampler must read a wrapping counter at least twice per shortest wrap period.
        self.sample_period_s = source.sample_period_s
        if source.max_read_interval_s is not None:
            self.sample_period_s = min(self.sample_period_s, source.max_read_interval_s / 2)
        self.refresh = RefreshClock(source.update_period_s) if source.steps else None
        self.next_due_s = float("-inf")
        self._energy_j = 0.0
        self._last_value: float | None = None  # None: the next read starts afresh
        self._last_time_s = 0.0
        self._last_sampled_s = float("-inf")  # earliest instant the last read may have sampled
        self._value_since_s = float("-inf")  # the end of the first read of the latest value
        self._fault_count = 0
        self._reason: str | None = None
        self._read_count = 0
        self._trace_start: tuple[float, float] | None = None  # (time_s, energy_j)
        self._knots: list[Knot] = []  # in time order
        self._faults: list[tuple[float, str]] = []  # (time_s, reason): no energy across them

    def advance(self, edge_s: float | None = None) -> TrackReading:
        """Read the source once and fold the value into the cumulative energy.

        `edge_s`: a window's edge at which this read is taken (a source that is current when
        read); its knot is placed there, so the window's edge and the knot coincide.
        """
        if self.source.edge_reads:
            with self._read_lock:  # reads from several threads fold in the order taken
                return self._advance(edge_s)
        # Read only by the sampler: the read (milliseconds for NVML) holds no lock, so a
        # window or a result never waits for it.
        return self._advance(edge_s)

    def _advance(self, edge_s: float | None) -> TrackReading:
        before_s = self._clock()
        try:
            value: float | None = self.source.read()
        except ReadError as error:
            value, failure = None, error.reason
        with self._lock:
            if value is None:
                self._fault(before_s, failure)
                return self._reading(before_s, ok=False)
            now_s = self._clock()
            previous = self._last_value
            if previous is not None:
                gap_s = now_s - self._last_time_s
                if self.source.reads == "power_w":
                    # Trapezoids between readings; the sampler keeps the gaps short.
                    self._energy_j += 0.5 * (previous + value) * gap_s
                else:
                    self._add_counter_delta(value - previous, gap_s, now_s)
            self._place_knot(previous, value, before_s, now_s if edge_s is None else edge_s)
            self._last_value, self._last_time_s = value, now_s
            self._last_sampled_s = before_s
            self._read_count += 1
            if self.refresh is not None:
                self.next_due_s = self.refresh.next_read_s(now_s)
            return self._reading(now_s, ok=True)

    def _place_knot(
        self, previous: float | None, value: float, before_s: float, now_s: float
    ) -> None:
        if self.refresh is None:
            if self._knots and now_s <= self._knots[-1].time_s:
                now_s = self._knots[-1].time_s  # reads from two threads: keep times in order
            self._add_knot(Knot(now_s, self._energy_j))
            return
        stepped = value != previous
        since_s, last_read = self._value_since_s, (self._last_sampled_s, self._last_time_s)
        if stepped or previous is None:
            self._value_since_s = now_s
        if previous is None:
            return  # the value of a refresh at an unknown time before this read
        time_s = self.refresh.observe(last_read, (before_s, now_s), since_s, stepped)
        if time_s is not None:
            if self._knots and time_s <= self._knots[-1].time_s:
                time_s = 0.5 * (self._knots[-1].time_s + now_s)
            self._add_knot(Knot(time_s, self._energy_j))

    def _add_knot(self, knot: Knot) -> None:
        self._knots.append(knot)
        refresh = self.refresh
        if refresh is not None and refresh.wanted_s is not None and knot.time_s >= refresh.wanted_s:
            refresh.wanted_s = None

    def hurry(self, time_s: float) -> bool:
        """Someone waits for this source's energy up to `time_s`: a stepping counter is read
        right after its first refresh at or after it, instead of at its cheaper planned time.
        Returns whether its next read moved earlier (the sampler must be woken for it); not
        when the energy is there already, or for a source read at every window's edge. Windows
        that end within one refresh of each other move it once, not once each."""
        if self.refresh is None:
            return False  # read at the edge itself: its knot is there
        with self._lock:
            if self._knots and self._knots[-1].time_s >= time_s:
                return False
            self.refresh.wanted_s = time_s
            due_s = self.refresh.next_read_s(self._last_time_s)
            if due_s >= self.next_due_s:
                return False  # the sampler reads it by then anyway
            self.next_due_s = due_s
            return True

    # Knots for the Meter -------------------------------------------------------------------

    @property
    def read_count(self) -> int:
        """Successful reads so far (what the sampler costs is about this times one read)."""
        return self._read_count

    @property
    def fault_count(self) -> int:
        """Failed reads so far: a new one may decide windows that no new knot would."""
        return self._fault_count

    def failing(self) -> str | None:
        """The reason of a fault since the last knot (the source is failing now), if any."""
        with self._lock:
            last_knot_s = self._knots[-1].time_s if self._knots else -float("inf")
            if self._faults and self._faults[-1][0] >= last_knot_s:
                return self._faults[-1][1]
            return None

    def covers(self, time_s: float) -> bool:
        """Whether waiting can end: a knot at or after `time_s`, or the source failing since
        its last knot (waiting would not help)."""
        with self._lock:
            if self._knots and self._knots[-1].time_s >= time_s:
                return True
        return self.failing() is not None

    def knots_around(self, low_s: float, high_s: float) -> tuple[list[Knot], str | None]:
        """The knots from the last one at or before `low_s` to the first at or after `high_s`,
        and the reason the energy between them is unknown (a fault in between), if any.

        A meter with history keeps every knot (a few MB a day), since `total()` brackets the
        whole run; one without drops those older than its oldest needed window
        (`forget_before`), so a bracket must start after what was forgotten.
        """
        with self._lock:
            knots = self._knots
            first = max(0, bisect.bisect_right(knots, low_s, key=_knot_time) - 1)
            last = min(len(knots), bisect.bisect_left(knots, high_s, key=_knot_time) + 1)
            knots = self._knots[first:last]
            low_s = knots[0].time_s if knots else low_s
            high_s = max(high_s, knots[-1].time_s) if knots else high_s
            for fault_s, reason in reversed(self._faults):
                if fault_s < low_s:
                    break
                if fault_s <= high_s:
                    return knots, reason
            return knots, None

    def knots_from(self, time_s: float) -> tuple[list[Knot], list[tuple[float, str]]]:
        """The knots from the last one at or before `time_s` on (or all, when none is), and the
        faults at or after the first of them: what the meter's accountant has not split yet."""
        with self._lock:
            first = max(0, bisect.bisect_right(self._knots, time_s, key=_knot_time) - 1)
            knots = self._knots[first:]
            low_s = knots[0].time_s if knots else time_s
            faults = [fault for fault in self._faults if fault[0] >= low_s]
            return knots, faults

    def forget_before(self, time_s: float) -> None:
        """Drop the knots before the last one at or before `time_s`, and the faults before that
        knot: a bracket whose low end is at or after `time_s` is found as before. The latest
        fault is always kept, since `failing()` asks for it."""
        with self._lock:
            keep = bisect.bisect_right(self._knots, time_s, key=_knot_time) - 1
            if keep > 0:
                del self._knots[:keep]
            cut_s = self._knots[0].time_s if self._knots and keep >= 0 else time_s
            latest = self._faults[-1:]
            self._faults = [fault for fault in self._faults[:-1] if fault[0] >= cut_s] + latest

    # Traces --------------------------------------------------------------------------------

    def trace_point(self, reading: TrackReading) -> PowerSample | None:
        """Mean watts since the previous trace point, at most one per sample period."""
        with self._lock:
            if reading.energy_j is None:
                self._trace_start = None
                return None
            start = self._trace_start
            if start is not None and reading.time_s - start[0] < 0.9 * self.sample_period_s:
                return None
            self._trace_start = (reading.time_s, reading.energy_j)
            if start is None or start[0] >= reading.time_s:
                return None
            power_w = (reading.energy_j - start[1]) / (reading.time_s - start[0])
            return PowerSample(self.source.name, reading.time_s, power_w)

    def _add_counter_delta(self, delta_j: float, gap_s: float, now_s: float) -> None:
        wrap_j = self.source.wrap_j
        if delta_j < 0:
            if wrap_j is None:
                # A counter that never wraps went backwards: reset by a driver reload.
                self._fault(now_s, "read-error")
                return
            delta_j += wrap_j
        max_gap_s = self.source.max_read_interval_s
        if max_gap_s is not None and gap_s > max_gap_s:
            # Reads too far apart to tell how many times the counter wrapped.
            self._fault(now_s, "missed-wrap")
            return
        self._energy_j += delta_j

    def _fault(self, time_s: float, reason: str) -> None:
        self._fault_count += 1
        self._reason = reason
        self._last_value = None
        self._trace_start = None
        self._faults.append((time_s, reason))

    def _reading(self, now_s: float, ok: bool) -> TrackReading:
        return TrackReading(
            time_s=now_s,
            energy_j=self._energy_j if ok else None,
            fault_count=self._fault_count,
            reason=self._reason,
            read_count=self._read_count,
        )


def _knot_time(knot: Knot) -> float:
    return knot.time_s

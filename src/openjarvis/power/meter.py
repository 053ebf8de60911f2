"""The Meter: owns the energy sources and measures labelled windows, idle power and traces.

A background sampler keeps counters unwrapped and records traces; windows read every source
at their edges on one monotonic clock.
"""

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from openjarvis.power.accounting import in_scope, source_energy, sum_scope
from openjarvis.power.estimate import discover_estimate
from openjarvis.power.nvml import discover_nvml
from openjarvis.power.rapl import discover_rapl
from openjarvis.power.sources import EnergySource
from openjarvis.power.track import Track, TrackReading, energy_between
from openjarvis.power.types import (
    IdleBaseline,
    Method,
    PowerSample,
    Scope,
    SourceStatus,
    TotalEnergy,
    WindowEnergy,
    weakest_method,
)
from openjarvis.power.union import UnionTotals

__all__ = ["Meter", "WindowHandle"]


class WindowHandle:
    """What `Meter.window()` yields; `result` is set when the `with` block ends."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.overlapped = False
        self._result: WindowEnergy | None = None

    @property
    def result(self) -> WindowEnergy:
        if self._result is None:
            raise RuntimeError(f"window {self.label!r} is still open: read result after `with`")
        return self._result


class Meter:
    """Energy windows over a fixed set of sources, summed within one scope."""

    def __init__(
        self,
        sources: Sequence[EnergySource],
        scope: Scope = "system",
        statuses: Sequence[SourceStatus] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        max_trace_samples: int = 200_000,
    ) -> None:
        names = [source.name for source in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique: {names}")
        measured = {source.domain for source in sources if source.method != "estimate"}
        if any(s.method == "estimate" and s.domain in measured for s in sources):
            raise ValueError("an estimate may not stand beside a measured source of its domain")
        self.scope: Scope = scope
        self.sources = tuple(sources)
        self.statuses = (
            tuple(statuses) if statuses is not None else tuple(source.status for source in sources)
        )
        self.idle: IdleBaseline | None = None  # set by measure_idle(), or restored by a caller
        self._clock = clock
        self._sleep = sleep
        self._tracks = [Track(source, clock) for source in sources]
        self._lock = threading.Lock()  # windows' edges, overlap and union bookkeeping
        self._active: list[WindowHandle] = []
        self._union = UnionTotals(self._tracks)
        self._trace_lock = threading.Lock()
        self._trace: deque[PowerSample] = deque(maxlen=max_trace_samples)
        self.dropped_samples = 0  # trace samples lost because nobody drained the trace
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._sampler_error: Exception | None = None

    @classmethod
    def discover(
        cls,
        scope: Scope = "system",
        sysfs_root: str | Path | None = None,
        *,
        estimate_cpu: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> "Meter":
        """Every readable source of this machine; `statuses` also lists the unreadable ones.

        GPUs follow CUDA_VISIBLE_DEVICES. The CPU estimate joins only when no CPU package
        counter can be read, and not at all with `estimate_cpu=False`.
        """
        found = [discover_nvml(os.environ.get("CUDA_VISIBLE_DEVICES")), discover_rapl(sysfs_root)]
        if estimate_cpu:
            cpu_counter = any(s.domain == "cpu" for part in found for s in part.sources)
            found.append(discover_estimate(cpu_counter, clock))
        sources = [source for part in found for source in part.sources]
        statuses = [status for part in found for status in part.statuses]
        return cls(sources, scope, statuses, clock=clock, sleep=sleep)

    @property
    def method(self) -> Method | None:
        """The weakest method among the sources in scope (None when none is in scope)."""
        return weakest_method([s.method for s in self.sources if in_scope(s.domain, self.scope)])

    # Lifecycle -----------------------------------------------------------------------------

    @property
    def resolution_s(self) -> float:
        """The shortest window that every source in scope resolves: its slowest refresh period
        (NVML's energy counter on an H200: ~100 ms)."""
        periods = [s.update_period_s for s in self.sources if in_scope(s.domain, self.scope)]
        return max(periods, default=0.0)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the background sampler (traces, power integration, counter wraps)."""
        if self._thread is not None:
            return
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._sample_loop, name="power-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the sampler; raises if it had died, since its traces are then incomplete."""
        if self._thread is not None:
            self._stop_event.set()
            self._thread.join()
            self._thread = None
        self._raise_sampler_error()

    def close(self) -> None:
        """Stop and release the sources (NVML); the meter cannot be used afterwards."""
        try:
            self.stop()
        finally:
            for source in self.sources:
                source.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Sampling ------------------------------------------------------------------------------

    def poll(self) -> float:
        """Read every source that is due; returns seconds until the next one is due."""
        now_s = self._clock()
        for track in self._tracks:
            if now_s >= track.next_due_s:
                sample = track.trace_point(track.advance())
                track.next_due_s = now_s + track.sample_period_s
                if sample is not None:
                    with self._trace_lock:
                        self.dropped_samples += len(self._trace) == self._trace.maxlen
                        self._trace.append(sample)
        if not self._tracks:
            return 1.0
        return max(0.0, min(track.next_due_s for track in self._tracks) - self._clock())

    def _sample_loop(self) -> None:
        delay_s = 0.0
        try:
            while not self._stop_event.wait(delay_s):
                delay_s = self.poll()
        except Exception as error:  # raised again in the caller's thread by stop()
            self._sampler_error = error

    def _raise_sampler_error(self) -> None:
        if self._sampler_error is not None:
            raise RuntimeError("the power sampler thread failed") from self._sampler_error

    def trace(self) -> list[PowerSample]:
        """The power samples recorded and not yet drained, oldest first."""
        with self._trace_lock:
            return list(self._trace)

    def drain_trace(self) -> list[PowerSample]:
        """Take the recorded samples away (to store them), bounding the meter's memory."""
        with self._trace_lock:
            samples = list(self._trace)
            self._trace.clear()
            return samples

    # Windows -------------------------------------------------------------------------------

    def _read_all(self) -> tuple[float, list[TrackReading]]:
        return self._clock(), [track.advance() for track in self._tracks]

    @contextmanager
    def window(self, label: str) -> Iterator[WindowHandle]:
        """Measure the energy of the `with` block; windows may overlap (across threads)."""
        handle = WindowHandle(label)
        with self._lock:
            self._raise_sampler_error()
            start_s, start = self._read_all()
            if self._active:
                handle.overlapped = True
                for other in self._active:
                    other.overlapped = True
            else:
                self._union.begin(start_s, start)
            self._active.append(handle)
        try:
            yield handle
        finally:
            # A counter that has not refreshed since the window opened cannot tell its energy:
            # a short window stays open (idle) until every source in scope has refreshed once,
            # and is flagged low_resolution, rather than being null.
            readable_s = max((r.time_s for r in start), default=start_s) + self.resolution_s
            if (wait_s := readable_s - self._clock()) > 0:
                self._sleep(wait_s)
            with self._lock:
                end_s, end = self._read_all()
                self._active.remove(handle)
                if not self._active:
                    self._union.end(end_s, end)
                self._union.windows += 1
            handle._result = self._window_energy(handle, start_s, start, end_s, end)

    def _window_energy(
        self,
        handle: WindowHandle,
        start_s: float,
        start: list[TrackReading],
        end_s: float,
        end: list[TrackReading],
    ) -> WindowEnergy:
        sources = tuple(
            source_energy(track, first, last, self._idle_power_w(track.source.name))
            for track, first, last in zip(self._tracks, start, end, strict=True)
        )
        total = sum_scope(sources, self.scope)
        return WindowEnergy(
            label=handle.label,
            start_s=start_s,
            end_s=end_s,
            scope=self.scope,
            method=total.method,
            energy_j=total.energy_j,
            net_energy_j=total.net_energy_j,
            null_reason=total.null_reason,
            sources=sources,
            low_resolution=total.low_resolution,
            overlapped=handle.overlapped,
        )

    def total(self) -> TotalEnergy:
        """Energy over the union of the closed windows: a joule in two windows counts once."""
        with self._lock:
            return self._union.total(self.scope, self._idle_power_w)

    # Idle ----------------------------------------------------------------------------------

    def _idle_power_w(self, name: str) -> float | None:
        return None if self.idle is None else self.idle.power_w.get(name)

    def measure_idle(self, seconds: float) -> IdleBaseline:
        """Mean power of each source over `seconds` of doing nothing; later windows subtract it.

        Call it before opening windows; the machine should be quiet meanwhile.
        """
        with self._lock:
            if self._active:
                raise RuntimeError("measure idle power before opening windows, not during one")
            start_s, start = self._read_all()
        deadline_s = start_s + seconds
        periods = [track.sample_period_s for track in self._tracks] or [seconds]
        while (now_s := self._clock()) < deadline_s:
            if not self.running:
                self.poll()  # integrated sources and wrapping counters need reads in between
            self._sleep(min(deadline_s - now_s, min(periods)))
        end_s, end = self._read_all()
        power_w: dict[str, float | None] = {}
        for track, first, last in zip(self._tracks, start, end, strict=True):
            energy_j, _ = energy_between(first, last)
            duration_s = last.time_s - first.time_s
            too_short = duration_s < track.source.update_period_s
            power_w[track.source.name] = (
                None if energy_j is None or too_short else energy_j / duration_s
            )
        self.idle = IdleBaseline(seconds=end_s - start_s, power_w=power_w)
        return self.idle

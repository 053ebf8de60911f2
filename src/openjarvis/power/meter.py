"""The Meter: owns the energy sources and measures labelled windows, idle power and traces.

A background sampler reads every source (NVML's counter just after each refresh) and keeps
knots of known energy; a window only notes its edges (cheap sources are read there too). The
accountant (accountant.py) splits each interval between knots once, in time order, by a
batching engine's step ledger where the meter follows one, and publishes each window about one
refresh after its end: no window waits for another's, nobody polls. Energy above idle between
windows is the previous window's tail, a second at most after a lone window.
"""

import itertools
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from openjarvis.power.accountant import REFRESH_GRACE_S, Accountant
from openjarvis.power.accounting import in_scope, sum_scope
from openjarvis.power.claims import Claim, claim_sources
from openjarvis.power.discovery import discover_sources
from openjarvis.power.edges import (
    Knot,
    Span,
    attribute,
)
from openjarvis.power.sources import EnergySource
from openjarvis.power.track import Track
from openjarvis.power.types import (
    Coverage,
    GpuSelection,
    IdleBaseline,
    Method,
    PowerSample,
    Scope,
    SourceEnergy,
    SourceStatus,
    TotalEnergy,
    weakest_method,
)
from openjarvis.power.windows import Ledger, WindowHandle

__all__ = ["Meter", "WindowHandle"]

# A lone window's tail (the device winding down, energy above idle) ends this long after it
# at the latest, when no window opened before: its energy is then known about a second later.
TAIL_S = 1.0


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
        keep_history: bool = True,
    ) -> None:
        """`keep_history=False`: a meter that lives long (a server) and never asks for `total()`
        keeps only what unresolved windows need (knots, faults), so its memory stays bounded; a
        result first read over a minute after its tail closed may then be None (no-refresh),
        and idle must be measured while no window opens, as `measure_idle` asks anyway."""
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
        # What the scope covers; discover() fills it from what it found (power/discovery.py).
        self.coverage = Coverage(in_scope=tuple(s.name for s in self.scoped_sources))
        self._clock = clock
        self._sleep = sleep
        self._tracks = [Track(source, clock) for source in sources]
        # The windows, overlap and tail bookkeeping, and the accountant's state.
        self._lock = threading.Lock()
        self._active: list[WindowHandle] = []
        self._tail_owner: WindowHandle | None = None
        self._keys = itertools.count(1)
        # CPU time the accountant has spent (splitting and publishing), in whatever thread.
        self.accounting_cpu_s = 0.0
        self._faults_seen = 0  # the sources' failed reads at the last publication
        # A window or tail closed where every source was split already (see `_closed_at`).
        self._closed_behind = False
        self._publish_by_s = -math.inf  # the next pass publishes, whatever it split
        # Without history, old knots are dropped as windows are forgotten (`_forget`), and no
        # spans or tails are kept: total() would need knots back to the first window.
        self.keep_history = keep_history
        self._spans: list[tuple[float, float]] = []  # closed windows, for total()
        self._tails: list[tuple[float, float]] = []  # closed tails (gaps owned by a window)
        self._trace_lock = threading.Lock()
        self._trace: deque[PowerSample] = deque(maxlen=max_trace_samples)
        self.dropped_samples = 0  # trace samples lost because nobody drained the trace
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._wake = threading.Event()  # a caller waits for a knot: read sooner than planned
        self._sampler_error: Exception | None = None
        resolution_s = max((s.update_period_s for s in self.scoped_sources), default=0.0)
        self._accountant = Accountant(
            self._tracks, scope, resolution_s, self._idle_power_w, self._wake.set
        )

    @classmethod
    def discover(
        cls,
        scope: Scope = "system",
        sysfs_root: str | Path | None = None,
        *,
        gpus: GpuSelection = "all",
        estimate_cpu: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        keep_history: bool = True,
    ) -> "Meter":
        """A meter over this machine's sources (power/discovery.py says which): of the GPUs,
        only `gpus` (the engine's devices as CUDA indices, or "all"). `coverage` says what the
        scope covers, which GPUs it leaves out and which sources in it cannot be read.
        `keep_history=False` bounds its memory but gives up `total()` (see `__init__`)."""
        found = discover_sources(
            sysfs_root, gpus=gpus, scope=scope, estimate_cpu=estimate_cpu, clock=clock
        )
        meter = cls(
            found.sources,
            scope,
            found.statuses,
            clock=clock,
            sleep=sleep,
            keep_history=keep_history,
        )
        meter.coverage = found.coverage
        return meter

    @property
    def scoped_sources(self) -> tuple[EnergySource, ...]:
        """The sources whose energy the scope sums (psys and out-of-scope domains are read but
        not added)."""
        return tuple(s for s in self.sources if in_scope(s.domain, self.scope))

    @property
    def method(self) -> Method | None:
        """The weakest method among the sources in scope (None when none is in scope)."""
        return weakest_method([s.method for s in self.scoped_sources])

    def claim(self, holder: str) -> Claim:
        """Claim the sources in scope for one measurement (power/claims.py); the caller
        releases the claim when it stops measuring."""
        return claim_sources([s.name for s in self.scoped_sources], holder)

    # Lifecycle -----------------------------------------------------------------------------

    @property
    def resolution_s(self) -> float:
        """The longest refresh period among the sources in scope (NVML's on an H200: ~100 ms)."""
        return max((s.update_period_s for s in self.scoped_sources), default=0.0)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the background sampler (knots, traces, power integration, counter wraps)."""
        if self._thread is not None:
            return
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._sample_loop, name="power-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the sampler; raises if it had died, since its traces are then incomplete."""
        if self._thread is not None:
            self._stop_event.set()
            self._wake.set()
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
        stepped = False
        for track in self._tracks:
            if now_s >= track.next_due_s:
                sample = track.trace_point(track.advance())
                if track.refresh is None:  # a stepping counter schedules its own reads
                    track.next_due_s = now_s + track.sample_period_s
                else:
                    stepped = True
                if sample is not None:
                    with self._trace_lock:
                        self.dropped_samples += len(self._trace) == self._trace.maxlen
                        self._trace.append(sample)
        if stepped:
            # A knot of each source read at the edges past a refresh just read, so that its
            # intervals end there, once a refresh (`Accountant._merges`).
            self._read_edges()
        self._account()
        if not self._tracks:
            return 1.0
        return max(0.0, min(track.next_due_s for track in self._tracks) - self._clock())

    def _sample_loop(self) -> None:
        delay_s = 0.0
        try:
            while not self._stop_event.is_set():
                self._wake.wait(delay_s)
                self._wake.clear()
                if self._stop_event.is_set():
                    break
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

    def _read_edges(self) -> float:
        """Read the sources cheap enough for a window's edge (each read takes microseconds, so its
        knot is placed at the edge itself); returns the edge's time."""
        edge_s = self._clock()
        for track in self._tracks:
            if track.source.edge_reads:
                track.advance(edge_s)
        return edge_s

    def _wait_for_knots(self, time_s: float) -> None:
        """Until every source has a knot at or after `time_s` (or stopped refreshing)."""
        deadline_s = time_s + self.resolution_s + REFRESH_GRACE_S
        hurried = False
        while (now_s := self._clock()) < deadline_s:
            if all(track.covers(time_s) for track in self._tracks):
                return
            if not hurried:  # the counters are read right after their next refresh
                for track in self._tracks:
                    track.hurry(time_s)
                self._wake.set()
                hurried = True
            delay_s = 0.002
            if not self.running:
                delay_s = max(min(self.poll(), deadline_s - now_s, delay_s), 1e-4)
            self._sleep(delay_s)

    # Windows -------------------------------------------------------------------------------

    def follow(self, ledger: Ledger | None) -> None:
        """Split intervals by this batching engine's step ledger: windows opened from now on
        carry a `key` for their requests (`ledger_key`). None: split by time again."""
        with self._lock:
            self._accountant.ledger = ledger

    @contextmanager
    def window(
        self, label: str, *, on_settled: Callable[[WindowHandle], None] | None = None
    ) -> Iterator[WindowHandle]:
        """Measure the energy of the `with` block; windows may overlap (across threads).

        Opening and closing cost the caller no wait: the energy is published later (`result`,
        `settled()`, or `on_settled`, called in the meter's thread once the tail is known).
        """
        self._raise_sampler_error()
        with self._lock:  # edges read under the lock: the accountant sees every window in time
            start_s = self._read_edges()
            key = None
            ledger = self._accountant.ledger
            if ledger is not None:
                key = next(self._keys)
                ledger.open(key)
            handle = WindowHandle(
                label, start_s, key, len(self._tracks), self._wait_published, on_settled
            )
            if self._active:
                handle.overlapped = True
                for other in self._active:
                    other.overlapped = True
            elif self._tail_owner is not None:
                self._close_tail(start_s)  # the gap before this window is the last one's tail
            self._active.append(handle)
            self._accountant.pending.append(handle)
            self._forget(start_s)
        try:
            yield handle
        finally:
            with self._lock:
                end_s = self._read_edges()
                handle.end_s = end_s
                self._closed_at(end_s)
                self._active.remove(handle)
                if self.keep_history:
                    self._spans.append((handle.start_s, end_s))
                if self._active:
                    handle.tail_end_s = end_s  # a window still open owns the gap after it
                else:
                    self._tail_owner = handle
            self._hurry(end_s)

    def settle(self) -> None:
        """End the last window's tail now (the end of a run); results then resolve in full."""
        with self._lock:
            now_s = self._read_edges()
            if self._tail_owner is not None:
                self._close_tail(now_s)
        self._hurry(now_s)

    def _close_tail(self, end_s: float) -> None:
        """The last window's tail ends at `end_s`; under the lock."""
        owner = self._tail_owner
        assert owner is not None and owner.end_s is not None
        owner.tail_end_s = end_s
        self._closed_at(end_s)
        if self.keep_history:
            self._tails.append((owner.end_s, end_s))
        self._tail_owner = None

    def _closed_at(self, time_s: float) -> None:
        """A window (or its tail) closed at `time_s`; under the lock. Where every source has
        been split past it already (a read that ended as it closed), the next pass publishes
        even if it splits nothing; otherwise the split that passes it will."""
        if all(c is not None and c.time_s >= time_s for c in self._accountant.cursors):
            self._closed_behind = True

    def _hurry(self, time_s: float) -> None:
        """Someone will want the energy up to `time_s`: read the counters right after their
        next refresh (the sampler is woken), or, with no sampler, split what is there now;
        nothing when every counter's read that covers it is planned already."""
        moved = [track.hurry(time_s) for track in self._tracks]  # every track, not the first
        if not any(moved) and not all(track.covers(time_s) for track in self._tracks):
            # Nothing new before the reads already planned: the pass then splits it (a source
            # read at every edge has its knot already, and alone wakes nobody: with many
            # windows at once that was a pass for every request's end).
            return
        if self.running:
            self._wake.set()
        else:
            self._account()

    def _forget(self, now_s: float) -> None:
        """Without history, drop the knots that no window needs (before the oldest window
        not yet settled and before what the accountant has split); under the lock."""
        if self.keep_history:
            return
        accountant = self._accountant
        horizon_s = min((w.start_s for w in accountant.pending), default=now_s)
        for cursor, track in zip(accountant.cursors, self._tracks, strict=True):
            if cursor is None:
                continue
            # takes the track's lock: never the other way round
            track.forget_before(min(horizon_s, cursor.time_s) - self.resolution_s)

    def _wait_published(self, handle: WindowHandle, settled: bool) -> None:
        """Wait until the accountant has published `handle` (settled: with its tail). With a
        sampler, on the handle's event; without one, reading the sources here meanwhile."""
        event = handle.settled_event if settled else handle.resolved
        if event.is_set():
            return
        if self.running:
            # The sampler is not woken: what publishes the window has its pass coming already
            # (the window's end hurried the reads that cover it, or woke the sampler where
            # they were there; a pass waiting for the ledger is called back as steps land; a
            # counter that stopped refreshing is decided by time in the passes of its planned
            # reads), so a wake here was one more pass for every reply read (a server's).
            while not event.wait(timeout=1.0):
                self._raise_sampler_error()  # a dead sampler publishes nothing: say why
            return
        while not event.is_set():
            delay_s = self.poll()
            if not event.is_set():
                self._sleep(max(min(delay_s, 0.002), 1e-4))

    # The accountant --------------------------------------------------------------------------

    def _account(self) -> None:
        """Split every interval the counters (and the ledger) have passed, once, in time order,
        and publish the windows that are then complete. Runs in the sampler's thread (or a
        waiter's, without a sampler); a pass costs what its new intervals cost."""
        settled: list[WindowHandle] = []
        with self._lock:
            cpu_start_s = time.thread_time()
            now_s = self._clock()
            owner = self._tail_owner
            changed = self._closed_behind  # since the last publication: may decide a window
            if owner is not None and owner.end_s is not None and now_s >= owner.end_s + TAIL_S:
                self._close_tail(owner.end_s + TAIL_S)
                changed = True
            changed |= self._accountant.account()
            faults = sum(track.fault_count for track in self._tracks)
            # After the split: a window's publication time is when its energy is known.
            now_s = self._clock()
            # A pass that split nothing (woken by a ledger step or a hurried read) publishes
            # nothing new, except a window whose counter stopped refreshing: that is decided
            # by time, looked at once a refresh period. Under load about half the passes are
            # such (H200, 64 clients); sparing them the look at every unsettled window did not
            # lower the accountant's CPU there measurably (docs/benchmarks.md, session 16).
            if changed or faults != self._faults_seen or now_s >= self._publish_by_s:
                settled = self._accountant.publish(now_s)
                self._closed_behind = False
                self._faults_seen = faults
                self._publish_by_s = now_s + self.resolution_s
            self.accounting_cpu_s += time.thread_time() - cpu_start_s
        for handle in settled:
            ledger = self._accountant.ledger
            if handle.key is not None and ledger is not None:
                ledger.close(handle.key)
            handle.settled_event.set()
            if handle.on_settled is not None:
                handle.on_settled(handle)

    def total(self) -> TotalEnergy:
        """Energy over the union of the closed windows and their closed tails: a joule in two
        windows counts once. Each stretch of the union is read as one window would be (with
        idle power known, the energy above idle of an interval its edge cuts counts whole),
        so the windows' energies, shared or not, add up to it."""
        if not self.keep_history:
            raise RuntimeError(
                "total() needs the meter's history: this meter was made with keep_history=False"
            )
        with self._lock:
            # With idle power known, tails (energy above idle between windows) are in the total.
            merged = _merge(self._spans + (self._tails if self.idle is not None else []))
            windows_s = sum(end - start for start, end in _merge(self._spans))
            windows = len(self._spans)
        covered_s = sum(end - start for start, end in merged)
        sources = []
        for track in self._tracks:
            source, idle_w = track.source, self._idle_power_w(track.source.name)
            energy_j: float | None = 0.0
            reason = None
            pad_s = track.refresh.uncertainty_s if track.refresh is not None else 0.0
            for start_s, end_s in merged:
                knots, fault = track.knots_around(start_s, end_s)
                if fault is not None or len(knots) < 2 or knots[-1].time_s < end_s:
                    energy_j, reason = None, fault or "no-refresh"
                    break
                shares = attribute(knots, [Span(start_s, end_s)], idle_w, pad_s)
                energy_j = (energy_j or 0.0) + shares[0].energy_j
            sources.append(
                SourceEnergy(
                    source=source.name,
                    domain=source.domain,
                    method=source.method,
                    energy_j=energy_j,
                    net_energy_j=(
                        None
                        if energy_j is None or idle_w is None
                        else energy_j - idle_w * covered_s
                    ),
                    idle_power_w=idle_w,
                    null_reason=reason if energy_j is None else None,
                )
            )
        summed = sum_scope(tuple(sources), self.scope)
        # As the windows count it: idle only over the windows' own time (a tail is above idle).
        idles_w = [s.idle_power_w for s in sources if in_scope(s.domain, self.scope)]
        windows_energy_j = summed.energy_j
        if summed.energy_j is not None and covered_s > windows_s:
            windows_energy_j = (
                None
                if None in idles_w
                else summed.energy_j
                - sum(w for w in idles_w if w is not None) * (covered_s - windows_s)
            )
        return TotalEnergy(
            scope=self.scope,
            method=summed.method,
            covered_s=covered_s,
            windows=windows,
            energy_j=summed.energy_j,
            net_energy_j=summed.net_energy_j,
            null_reason=summed.null_reason,
            sources=tuple(sources),
            windows_s=windows_s,
            windows_energy_j=windows_energy_j,
        )

    # Idle ----------------------------------------------------------------------------------

    def _idle_power_w(self, name: str) -> float | None:
        return None if self.idle is None else self.idle.power_w.get(name)

    def measure_idle(self, seconds: float, *, use: bool = True) -> IdleBaseline:
        """Mean power of each source over `seconds` of doing nothing, with its standard error.

        With `use`, later windows subtract it (call it before opening windows); without, it
        is only returned (idle after a run, to report drift). The machine should be quiet.
        """
        with self._lock:
            if self._active:
                raise RuntimeError("measure idle power while no window is open")
        start_s = self._read_edges()
        self._wait_until(start_s + seconds)
        end_s = self._read_edges()
        self._wait_for_knots(end_s)
        power_w: dict[str, float | None] = {}
        error_w: dict[str, float | None] = {}
        for track in self._tracks:
            knots, fault = track.knots_around(start_s, end_s)
            inside = [k for k in knots if start_s <= k.time_s <= end_s]
            name = track.source.name
            power_w[name], error_w[name] = None, None
            if fault is None and len(inside) >= 2:
                span_s = inside[-1].time_s - inside[0].time_s
                if span_s >= track.source.update_period_s:
                    power_w[name] = (inside[-1].energy_j - inside[0].energy_j) / span_s
                    error_w[name] = _standard_error_w(inside)
        baseline = IdleBaseline(seconds=end_s - start_s, power_w=power_w, error_w=error_w)
        if use:
            self.idle = baseline
        return baseline

    def _wait_until(self, deadline_s: float) -> None:
        """Wait, reading every refresh of the stepping counters meanwhile (the sampler's cheaper
        plan reads every third): idle power from every interval, also over a short baseline."""
        while (now_s := self._clock()) < deadline_s:
            delay_s = deadline_s - now_s
            if not self.running:  # integrated sources and stepping counters need reads between
                delay_s = min(delay_s, max(self.poll(), 1e-4))
            else:
                for track in self._tracks:
                    track.hurry(now_s)
                self._wake.set()
                delay_s = min(delay_s, max(self.resolution_s, 0.01))
            self._sleep(delay_s)


def _standard_error_w(knots: list[Knot]) -> float | None:
    """The standard error of mean power from the spread of the per-interval powers."""
    powers = [
        (b.energy_j - a.energy_j) / (b.time_s - a.time_s)
        for a, b in itertools.pairwise(knots)
        if b.time_s > a.time_s
    ]
    if len(powers) < 2:
        return None
    return statistics.stdev(powers) / math.sqrt(len(powers))


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged

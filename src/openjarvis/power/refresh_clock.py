"""When a stepping counter (NVML's energy, every ~100 ms) refreshes, learned from its reads: where
to place each new value in time, and when to read so that a refresh someone waits for is seen
as soon as it can be, at little cost otherwise.
"""

import math

__all__ = ["RefreshClock"]

# How far a placed refresh may move a period, at least, once the period is measured.
MIN_DRIFT_S = 2e-6


class RefreshClock:
    """When a stepping counter refreshes: a period, and bounds on the time of one refresh (its
    copies a period apart bound the others), and which refresh the latest read saw.

    Every read narrows the bounds: one that sees a new value puts the next refresh not yet seen
    between the previous read's start and its own end; reads that keep seeing one value put
    none between the first of them's end and the latest's start. A bracket up to `narrow_s`
    wide places the bounds; then the counter is read every `stride` refreshes halfway between
    two of them, where a read is cheapest and its value is that of the refresh just passed. A
    refresh that a caller waits for is read `wanted_after_s` after its earliest possible time
    (the one before it read first, so that a new value can only be its); a read that comes too
    soon raises that time and is followed by reads `probe_s` apart until the new value shows,
    so waited-for reads come about where the new value is first seen. After the bounds are
    placed and every `check_every` refreshes, such reads run across a refresh from just before
    it. The bounds widen by `drift_s` a period, so a counter that drifts is followed. Until the
    bounds are placed, or when a read contradicts them, reads come every `margin_s`.
    """

    # Defaults measured on an H200 (docs/benchmarks.md): an NVML energy read costs ~3-5 ms of
    # CPU, but one started 4-16 ms after a refresh lasts until ~17-20 ms after it, while one
    # started 1-2 ms after it is done 5-6 ms after it (benchmarks/nvml_read_latency.py); every
    # third refresh keeps the sampler under 2 % of a core; the period is stable (100.000 ms).
    def __init__(
        self,
        period_s: float,
        margin_s: float = 0.008,
        check_every: int = 20,
        stride: int = 3,
        wanted_after_s: float = 0.001,
        probe_s: float = 0.001,
        drift_s: float = 2e-5,
    ) -> None:
        self.period_s = period_s
        self.margin_s = margin_s
        self.check_every = check_every
        self.stride = stride  # read every stride-th refresh
        self.wanted_after_s = wanted_after_s
        self.probe_s = probe_s
        self.drift_s = drift_s
        # Refresh `k` (counted from the one the bounds were placed on) lies in
        # (low_s + k * period_s, high_s + k * period_s]; None: not placed yet.
        self.low_s: float | None = None
        self.high_s: float | None = None
        self._seen = 0  # the latest refresh a read saw
        self._widened_s = 0.0  # the bounds hold at this time (widened up to it)
        # Where refreshes are placed (the knots' times): the bounds' middle when they were set,
        # or had narrowed to half a wide width, kept while inside them, so that knots lie
        # whole periods apart, as the counter's refreshes do.
        self.phase_s: float | None = None
        self._phase_width_s = math.inf
        self._anchor: tuple[float, float] | None = None  # a placed refresh and its width
        self._refreshes = 0
        self._stage = "learn"  # learn | steady | probe (reads probe_s apart until a new value)
        self._checking = False  # the next read is a check's first, just before a refresh
        # A caller waits for a refresh at or after this time: read right after it.
        self.wanted_s: float | None = None
        # What the reads were spent on (benchmarks/power_sampler_cost.py reports them).
        self.late_reads = 0  # reads that came before the refresh they were for
        self.relearns = 0

    @property
    def narrow_s(self) -> float:
        """The widest bracket that places a refresh: a read on each side, each a margin away,
        plus a read's own time."""
        return 3 * self.margin_s

    @property
    def uncertainty_s(self) -> float:
        """How far a placed refresh may be from the true one (half the widest placing bracket)."""
        return 0.5 * self.narrow_s

    def observe(
        self, before: tuple[float, float], read: tuple[float, float], since_s: float, new: bool
    ) -> float | None:
        """A read from `read[0]` to `read[1]` after one from `before[0]` to `before[1]`; `new`:
        their values differ; `since_s`: the end of the first read of the value before this
        read's. Returns the time of the refresh it saw (None: no new value)."""
        if new:
            self._refreshes += 1
        if self.low_s is None or self.high_s is None:
            if new and read[1] - before[0] <= self.narrow_s:
                self._place(before[0], read[1])
                return self.phase_s
            return 0.5 * (before[0] + read[1]) if new else None
        self._widen(read[1])
        if new:
            self._checking = False
            return self._saw(before[0], read[1])
        if read[0] - since_s >= self.period_s:
            self._relearn()  # a period with one value: no refresh where one must be
            return None
        self._cut(since_s, read[0])
        if self._stage == "steady" and self.low_s is not None:
            if self.wanted_s is None and not self._checking:
                self._relearn()  # a planned read with no refresh since the last one
                return None
            self._stage = "probe"  # before the refresh waited for, or a check: again, soon
        if self._stage == "probe" and self.wanted_s is not None:
            self.late_reads += 1
        return None

    def next_read_s(self, now_s: float) -> float:
        """When to read next, given that the latest read ended at `now_s`."""
        low_s, high_s, period_s = self.low_s, self.high_s, self.period_s
        if low_s is None or high_s is None:
            return now_s + self.margin_s
        if self._stage == "probe":
            return now_s + self.probe_s
        following = math.floor((now_s - low_s) / period_s) + 1  # the first refresh after now
        if self.wanted_s is not None:
            # The first refresh that may lie at or after the wanted time, and not seen.
            wanted = max(math.ceil((self.wanted_s - high_s) / period_s), self._seen + 1)
            between_s = 0.5 * (high_s + low_s + period_s) + (wanted - 1) * period_s
            if self._seen < wanted - 1:  # read the one before first, so a new value is its
                if now_s < between_s:
                    return between_s  # halfway between the two, where a read is cheap
                if now_s < low_s + wanted * period_s:
                    return now_s
                return high_s + wanted * period_s + self.wanted_after_s  # surely after it
            return max(now_s, low_s + wanted * period_s + self.wanted_after_s)
        if self._refreshes % self.check_every == 0 and self._seen == following - 1:
            start_s = low_s + following * period_s - 0.5 * self.margin_s
            if start_s > now_s:
                self._checking = True  # read across it from just before it
                return start_s
        return 0.5 * (low_s + high_s) + (following + self.stride - 0.5) * period_s

    def _saw(self, low_s: float, high_s: float) -> float:
        """A read ending at `high_s` saw a new value, the previous one started at `low_s`: the
        refresh it saw (the latest that may have come by its end, unless that may not have
        come and an earlier one, not seen before, surely has), its bounds narrowed, its time."""
        assert self.low_s is not None and self.high_s is not None and self.phase_s is not None
        period_s = self.period_s
        latest = math.floor((high_s - self.low_s) / period_s)
        if latest <= self._seen:  # no refresh left that the read could have seen
            return self._replace(low_s, high_s)
        seen = latest
        if latest > self._seen + 1 and high_s <= self.high_s + latest * period_s:
            # It may have come or not; the one before surely has: take the placed time's word.
            seen = latest if self._placed(latest) <= high_s else latest - 1
        if seen == self._seen + 1:  # the first not seen lies after the previous read's start
            shift_s = seen * period_s
            low, high = max(self.low_s, low_s - shift_s), min(self.high_s, high_s - shift_s)
            if low >= high:
                return self._replace(low_s, high_s)
            self.low_s, self.high_s = low, high
        self._seen = seen
        self._rebase(seen)
        self._stage = "steady"
        self._narrowed()
        # Not after the read's end: the placed phase may lie a little outside the bounds.
        return min(self._placed(0), high_s)

    def _cut(self, low_s: float, high_s: float) -> None:
        """No refresh came in [low_s, high_s] (under a period): cut it off the bounds of the
        refreshes not seen yet."""
        assert self.low_s is not None and self.high_s is not None
        period_s = self.period_s
        for k in (self._seen + 1, self._seen + 2):
            refresh_low_s, refresh_high_s = self.low_s + k * period_s, self.high_s + k * period_s
            if low_s <= refresh_low_s and high_s >= refresh_high_s:
                self._relearn()  # no refresh left where the bounds said one was
                return
            if low_s <= refresh_low_s < high_s:
                self.low_s = high_s - k * period_s
            elif low_s < refresh_high_s <= high_s:
                self.high_s = low_s - k * period_s
        self._narrowed()

    def _placed(self, refresh: int) -> float:
        """The time a refresh is placed at: the placed phase's copy at its bounds."""
        assert self.low_s is not None and self.high_s is not None and self.phase_s is not None
        middle_s = 0.5 * (self.low_s + self.high_s) + refresh * self.period_s
        return self.phase_s + round((middle_s - self.phase_s) / self.period_s) * self.period_s

    def _rebase(self, refresh: int) -> None:
        """Count refreshes from `refresh` on (the bounds are its)."""
        assert self.low_s is not None and self.high_s is not None
        shift_s = refresh * self.period_s
        self.low_s, self.high_s = self.low_s + shift_s, self.high_s + shift_s
        self._seen -= refresh
        if self.phase_s is not None:  # its copy here, so a period's error does not add up
            self.phase_s = self._placed(0)

    def _place(self, low_s: float, high_s: float) -> None:
        """The bounds from one narrow bracket (learning, or after a contradiction)."""
        self.low_s, self.high_s, self._widened_s = low_s, high_s, high_s
        self._seen = 0
        self._stage = "steady"
        self._refreshes = 0  # the first read planned narrows the bounds
        self.phase_s, self._phase_width_s = None, math.inf
        self._narrowed()

    def _replace(self, low_s: float, high_s: float) -> float:
        """A new value where the bounds allowed none: they were wrong; start again."""
        if high_s - low_s <= self.narrow_s:
            self._place(low_s, high_s)
        else:
            self._relearn()
        return 0.5 * (low_s + high_s)

    def _relearn(self) -> None:
        self.low_s = self.high_s = self.phase_s = None
        self._stage = "learn"
        self.relearns += 1

    def _widen(self, now_s: float) -> None:
        """Widen the bounds by the drift over the periods since they last held."""
        assert self.low_s is not None and self.high_s is not None
        periods = (now_s - self._widened_s) / self.period_s
        if periods > 0:
            self.low_s -= self.drift_s * periods
            self.high_s += self.drift_s * periods
            self._widened_s = now_s

    def _narrowed(self) -> None:
        """Place refreshes anew where the bounds left the placed time, or halved since."""
        if self.low_s is None or self.high_s is None:
            return
        width_s = self.high_s - self.low_s
        inside = False
        if self.phase_s is not None:
            # Kept while within a probe's step of the bounds: moving it moves energy between
            # neighbouring windows (a knot's time splits an interval), so only for a gain.
            offset_s = (self.phase_s - self.low_s) % self.period_s
            slack_s = self.probe_s
            inside = offset_s <= width_s + slack_s or offset_s >= self.period_s - slack_s
        coarse = self._phase_width_s > 0.25 * self.narrow_s  # placed from a wide bracket
        if not inside or (coarse and width_s < 0.5 * self._phase_width_s):
            self.phase_s, self._phase_width_s = 0.5 * (self.low_s + self.high_s), width_s
        self._estimate_period()

    def _estimate_period(self) -> None:
        """Measure the period between an anchor and the bounds, once that beats the drift."""
        assert self.low_s is not None and self.high_s is not None
        middle_s, width_s = 0.5 * (self.low_s + self.high_s), self.high_s - self.low_s
        if self._anchor is None or (
            width_s < 0.25 * self._anchor[1] and self._anchor[1] > 0.25 * self.narrow_s
        ):
            self._anchor = (middle_s, width_s)  # a better one, while none is good
            return
        anchor_s, anchor_width_s = self._anchor
        count = round((middle_s - anchor_s) / self.period_s)
        if count > 0 and (width_s + anchor_width_s) / count < self.drift_s:
            self.period_s = (middle_s - anchor_s) / count
            self.drift_s = max((width_s + anchor_width_s) / count, MIN_DRIFT_S)

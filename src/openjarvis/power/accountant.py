"""The meter's accountant: splits each interval between two knots of a source once, in time
order, among the windows in it (by a batching engine's step ledger where the meter follows one,
else by time), and publishes each window once every source has passed its end, then its tail.

It runs under the meter's lock, in the sampler's thread (or a waiter's, without a sampler): a
pass costs what its new intervals cost, and no window waits for another's end. An interval
whose windows the ledger all follows is split once for all of them: its energy and the claims
of every step in it, summed by the ledger (`WorkInterval`); each window takes its part of it
from its own steps when it is published, so an interval costs the same however many windows
run in it.
"""

import bisect
import functools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from openjarvis.power.accounting import LOW_RESOLUTION_PERIODS, sum_scope
from openjarvis.power.edges import (
    Knot,
    Share,
    Span,
    WorkStep,
    attribute,
    before_split_fraction,
    claim_in_s,
    covered_s,
    mean_batch,
    work_pot_j,
)
from openjarvis.power.steps import Run, SharedSteps
from openjarvis.power.track import Track
from openjarvis.power.types import Scope, SourceEnergy, WindowEnergy
from openjarvis.power.windows import Ledger, WindowHandle

__all__ = ["REFRESH_GRACE_S", "Accountant"]

# How long a result waits for a counter that stopped refreshing, beyond its update period.
REFRESH_GRACE_S = 1.0
# A power source read at under a quarter of its sampling rate is integrated too coarsely.
MIN_SAMPLING_SHARE = 0.25


@dataclass(slots=True)
class WorkInterval:
    """An interval split by the ledger, kept until its windows are published: what the union of
    its windows gets (`pot_j`: its energy above idle plus idle over the union's time; without
    idle power, the union's time share) and above idle (`above_j`, None without idle power), the
    claims of all the followed steps in it (`claimed_s`), and whether windows shared it. A window
    gets `pot_j` times its own steps' claim in it over `claimed_s`.

    `batch_j` and `batch_net_j`: that part for a window whose shared pieces run through the
    whole interval (inside its `steps.Run`'s `from_s` to `to_s`): every such window has the same
    pieces there, so the first one published computes it for the others."""

    low_s: float
    high_s: float
    pot_j: float
    above_j: float | None
    claimed_s: float
    shared: bool
    batch_j: float | None = None
    batch_net_j: float = 0.0


_high_s = operator.attrgetter("high_s")
# A window's steps' claim on an interval (low_s, high_s): `Run.claim_s`, or `claim_in_s`.
Claim = Callable[[float, float], float]


class Accountant:
    """The windows not settled yet, how far each source has been split, and the ledger."""

    def __init__(
        self,
        tracks: Sequence[Track],
        scope: Scope,
        resolution_s: float,
        idle_of: Callable[[str], float | None],
        wake: Callable[[], None],
    ) -> None:
        self.tracks = tuple(tracks)
        self.scope: Scope = scope
        self.resolution_s = resolution_s  # the longest refresh period in scope
        self._idle_of = idle_of  # a source's idle power (None: not measured)
        self._wake = wake  # the sampler: the ledger is complete past an interval it waits on
        self.pending: list[WindowHandle] = []  # windows not settled yet, in opening order
        self.cursors: list[Knot | None] = [None] * len(self.tracks)  # the last knot split
        self.ledger: Ledger | None = None
        # Counters that refresh now and then first: how far they reach in a pass decides how
        # far a counter read at the windows' edges needs splitting in it (`_horizon_s`).
        self._order = sorted(range(len(self.tracks)), key=lambda i: not self.tracks[i].source.steps)
        self._spans: dict[int, Span] = {}  # id(window): its span, made once a pass
        # Per source, the intervals split by the ledger that an unpublished window may be in.
        self._split: list[list[WorkInterval]] = [[] for _ in self.tracks]
        self._shared = SharedSteps()  # the pieces most windows share, for their publication

    def account(self) -> bool:
        """Split every source's new intervals; whether any was split."""
        changed = False
        self._spans.clear()
        for index in self._order:
            changed |= self.account_track(index)
        self._spans.clear()
        return changed

    def _horizon_s(self, index: int) -> float | None:
        """Where the refreshing counters' splits reach, for a source read at the windows' edges
        (None: it is a refreshing counter, or no working one is in scope; a failing counter
        decides its windows now). A window ending later waits for them anyway."""
        if self.tracks[index].source.steps:
            return None
        reaches = [
            cursor.time_s if cursor is not None else -math.inf
            for track, cursor in zip(self.tracks, self.cursors, strict=True)
            if track.source.steps and track.failing() is None
        ]
        return min(reaches, default=None)

    def account_track(self, index: int) -> bool:
        """Split one source's new intervals among the windows in them; whether any was split."""
        track, cursor = self.tracks[index], self.cursors[index]
        knots, faults = track.knots_from(cursor.time_s if cursor is not None else -math.inf)
        if not knots:
            return False
        first = cursor
        if cursor is None:
            cursor = knots[0]
        idle_w = self._idle_of(track.source.name)
        pad_s = track.refresh.uncertainty_s if track.refresh is not None else 0.0
        last, horizon_s = knots[-1], self._horizon_s(index)
        for knot in knots[1:]:
            low_s, high_s = cursor.time_s, knot.time_s
            if self._merges(low_s, high_s, faults, horizon_s, knot is last):
                continue  # the interval goes on past this knot
            inside = [
                w
                for w in self.pending
                if w.start_s < high_s and (w.end_s is None or w.end_s > low_s)
            ]
            ledger = self.ledger
            keyed = ledger is not None and any(w.key is not None for w in inside)
            if keyed and ledger is not None and ledger.complete_s() < high_s:
                ledger.when_complete(high_s, self._wake)  # a step in it has not landed
                break
            fault = next((reason for time_s, reason in faults if low_s <= time_s <= high_s), None)
            claimed_s = 0.0
            every_followed = keyed and all(w.key is not None for w in inside)
            if every_followed and ledger is not None and fault is None:
                claimed_s = ledger.claimed_s(low_s, high_s)
            windows: list[WindowHandle] = inside
            shares: list[Share] | None = None
            if claimed_s > 0:  # work in it, every window followed: split once for all of them
                interval = self._work_interval(cursor, knot, inside, idle_w, claimed_s)
                self._split[index].append(interval)
            else:
                owner = self._gap_owner(low_s)
                if owner is not None and owner not in inside:
                    windows = [*inside, owner]
                if windows and fault is None:
                    made = [self._span(w) for w in windows]
                    shares = attribute([cursor, knot], made, idle_w, pad_s)
            for position, window in enumerate(windows):
                account = window.accounts[index]
                if shares is not None:
                    share, total = shares[position], account.share
                    total.energy_j += share.energy_j
                    total.net_j += share.net_j
                    total.tail_j += share.tail_j
                    total.shared |= share.shared
                    split_s = window.split_s  # an interval from the first token on: no prefill
                    if share.energy_j and (split_s is None or low_s < split_s):
                        account.intervals.append((low_s, high_s, share.energy_j, share.claim_s))
                elif fault is not None:  # the interval's energy is unknown
                    account.reason = account.reason or fault
                if position < len(inside) and not account.started:  # not the gap's owner
                    account.started = True
                    if low_s > window.start_s:  # the source missed the window's beginning
                        account.reason = account.reason or "no-refresh"
                end_s = window.end_s
                if end_s is not None and low_s < end_s <= high_s:
                    account.at_end = account.share.copy()
            cursor = knot
        self.cursors[index] = cursor
        return cursor is not first

    def _work_interval(
        self,
        low: Knot,
        high: Knot,
        inside: Sequence[WindowHandle],
        idle_w: float | None,
        claimed_s: float,
    ) -> WorkInterval:
        """An interval with work in it whose windows the ledger all follows: split by work as
        `attribute` would, for all its windows at once (`edges._split_by_work`, where each
        window's claim is its steps' and every claim comes from the ledger)."""
        low_s, high_s = low.time_s, high.time_s
        bounds = [(w.start_s, math.inf if w.end_s is None else w.end_s) for w in inside]
        union_s = covered_s(bounds, low_s, high_s)
        pot_j, above_j = work_pot_j(high.energy_j - low.energy_j, idle_w, high_s - low_s, union_s)
        return WorkInterval(low_s, high_s, pot_j, above_j, claimed_s, len(inside) > 1)

    def _merges(
        self,
        low_s: float,
        time_s: float,
        faults: Sequence[tuple[float, str]],
        horizon_s: float | None,
        last: bool,
    ) -> bool:
        """Whether the interval from `low_s` goes on past a knot at `time_s` rather than end
        there: a counter read at every window's edge (always current) places a knot at each,
        and with many windows at once splitting each short interval among all of them costs
        the meter what its requests cost it squared. While more than one window is open the
        split is by their work (or time) whatever the knots, so such an interval ends at the
        first knot at or past `horizon_s` (where the refreshing counters in scope reach: one
        split per refresh, no window waiting on it longer), or where none is, once it is as
        long as the coarsest refresh in scope or at the last knot so far. A knot where at most
        one window is open (one after another: exact edges), or a fault, always ends it; so
        does twice the coarsest refresh (a refreshing counter that stalled)."""
        length_s = time_s - low_s
        if horizon_s is None:
            if last or length_s >= self.resolution_s:
                return False
        elif low_s < horizon_s <= time_s or length_s >= 2 * self.resolution_s:
            return False
        elif last and time_s < horizon_s:
            return False  # behind the refreshing counters: windows wait on it
        if any(low_s <= t <= time_s for t, _ in faults):
            return False
        open_windows = 0
        for window in self.pending:
            end_s = window.end_s
            if window.start_s <= time_s and (end_s is None or end_s > time_s):
                open_windows += 1
                if open_windows > 1:
                    return True
        return False

    def _gap_owner(self, low_s: float) -> WindowHandle | None:
        """The window whose tail an interval from `low_s` would be: the one that closed last at
        or before it, while its tail is open."""
        closed = [
            w
            for w in self.pending
            if w.end_s is not None
            and w.end_s <= low_s
            and (w.tail_end_s is None or w.tail_end_s > low_s)
        ]
        return max(closed, key=lambda w: w.end_s or 0.0, default=None)

    def _span(self, window: WindowHandle) -> Span:
        """The window as `attribute` takes it, made once a pass (the ledger is read once for
        all sources); its prefill split is applied at publication."""
        span = self._spans.get(id(window))
        if span is not None:
            return span
        end_s = window.end_s if window.end_s is not None else math.inf
        if window.key is None or self.ledger is None:
            span = Span(window.start_s, end_s)
        else:
            work = self.ledger.pieces(window.key)
            span = Span(window.start_s, end_s, None, work, reported=True)
        self._spans[id(window)] = span
        return span

    def publish(self, now_s: float) -> list[WindowHandle]:
        """Publish each closed window whose sources are all decided, to its end and then with
        its tail; returns those settled now (their events are set by the caller, unlocked)."""
        ledger = self.ledger
        if ledger is not None:
            # The window open longest that ran since (pending: opening order) has the batch's
            # shared pieces, its prompt's long behind it.
            for window in self.pending:
                if window.end_s is None and window.key is not None:
                    work = ledger.pieces(window.key)
                    if work and work[-1].end_s > self._shared.last_s:
                        self._shared.extend(work)
                        break
        settled: list[WindowHandle] = []
        pending: list[WindowHandle] = []
        for window in self.pending:
            if window.end_s is not None and self._publish(window, now_s):  # open: not yet
                settled.append(window)
            else:
                pending.append(window)
        self.pending = pending
        # The intervals split by the ledger that no unpublished window can be in go.
        first_s = min((window.start_s for window in pending), default=math.inf)
        for intervals in self._split:
            del intervals[: bisect.bisect_right(intervals, first_s, key=_high_s)]
        self._shared.forget(first_s)
        if ledger is not None and all(cursor is not None for cursor in self.cursors):
            ledger.forget(min(cursor.time_s for cursor in self.cursors if cursor))
        return settled

    def _publish(self, window: WindowHandle, now_s: float) -> bool:
        """Publish one closed window as far as its sources are decided; whether it is
        settled."""
        end_s = window.end_s
        assert end_s is not None, "publish passes closed windows only"
        published = window.energy is None
        if published:
            if not self._decided(window, end_s, now_s):
                return False
            window.published_s = now_s
            if window.tail_end_s == end_s and _nothing_after_end(window):
                # Another window owned the time after its end (a batch): settled with its
                # publication, its tail known to be 0 J, so the figures to its end are final.
                window.energy = window.final = self._window_energy(window, final=True)
                window.resolved.set()
                return True
            window.energy = self._window_energy(window, final=False)
        tail_end_s = window.tail_end_s
        settled = tail_end_s is not None and self._decided(window, tail_end_s, now_s)
        if settled:
            window.final = self._window_energy(window, final=True)
        if published or settled:
            window.resolved.set()  # once where both are published at once
        return settled

    def _decided(self, window: WindowHandle, horizon_s: float, now_s: float) -> bool:
        """Whether every source's share of `window` up to `horizon_s` is known (or known to be
        unknown: a fault, a counter failing now, or one that stopped refreshing)."""
        decided = True
        deadline_s = horizon_s + self.resolution_s + REFRESH_GRACE_S
        for index, track in enumerate(self.tracks):
            account = window.accounts[index]
            cursor = self.cursors[index]
            if account.reason is not None:
                continue
            if cursor is not None and cursor.time_s >= horizon_s:
                if not account.started:
                    account.reason = "no-refresh"  # no interval of it was ever split
                continue
            if (failing := track.failing()) is not None:
                account.reason = failing
            elif not track.covers(horizon_s) and now_s >= deadline_s:
                account.reason = "no-refresh"  # the counter stopped refreshing
            else:
                decided = False
        return decided

    def _window_energy(self, window: WindowHandle, *, final: bool) -> WindowEnergy:
        assert window.end_s is not None
        # The window's steps are read at its first publication, and again only where its first
        # token was marked after it (its parts of the ledger's intervals are kept in between).
        work: Sequence[WorkStep] = ()
        run, claim = None, None
        if window.key is not None and self.ledger is not None and self._steps_needed(window):
            work = self.ledger.pieces(window.key)
            run = self._shared.find(work) if work else None
            claim = run.claim_s if run is not None else functools.partial(claim_in_s, work)
        sources = tuple(
            self._source_energy(index, window, final, claim, run)
            for index in range(len(self.tracks))
        )
        total = sum_scope(sources, self.scope)
        if window.energy is not None:  # published to its end before: the same steps
            batch = window.energy.mean_batch
        elif window.key is None or self.ledger is None:
            batch = None
        else:
            batch = run.mean_batch() if run is not None else mean_batch(work)
        return WindowEnergy(
            label=window.label,
            start_s=window.start_s,
            end_s=window.end_s,
            scope=self.scope,
            method=total.method,
            energy_j=total.energy_j,
            net_energy_j=total.net_energy_j,
            null_reason=total.null_reason,
            sources=sources,
            low_resolution=total.low_resolution,
            overlapped=window.overlapped,
            # Windows one after another may meet inside one interval, which their work then
            # splits too; only a window that ran beside another shared the engine.
            shared=window.overlapped and any(source.shared for source in sources),
            mean_batch=batch,
            tail_energy_j=total.tail_j,
            prefill_energy_j=total.prefill_j,
            decode_energy_j=(
                None
                if total.prefill_j is None or total.energy_j is None
                else total.energy_j - total.prefill_j
            ),
        )

    @staticmethod
    def _steps_needed(window: WindowHandle) -> bool:
        """Whether publishing the window reads its steps: its first publication, or a source
        whose part of the ledger's intervals was taken before its first token was marked."""
        return window.energy is None or any(
            account.reason is None and account.by_ledger_split_s != window.split_s
            for account in window.accounts
        )

    def _source_energy(
        self,
        index: int,
        window: WindowHandle,
        final: bool,
        claim: Claim | None,
        run: Run | None,
    ) -> SourceEnergy:
        track, account = self.tracks[index], window.accounts[index]
        source = track.source
        idle_w = self._idle_of(source.name)
        assert window.end_s is not None
        duration_s = window.end_s - window.start_s
        low_resolution = duration_s < LOW_RESOLUTION_PERIODS * source.update_period_s
        if source.reads == "power_w":  # integrated: too few readings inside the window
            knots, _ = track.knots_around(window.start_s, window.end_s)
            inside = sum(window.start_s <= k.time_s <= window.end_s for k in knots)
            low_resolution |= inside < MIN_SAMPLING_SHARE * duration_s / track.sample_period_s
        share = account.share if final else account.at_end or account.share
        if account.reason is not None:
            return SourceEnergy(
                source.name,
                source.domain,
                source.method,
                None,
                None,
                idle_w,
                account.reason,
                low_resolution,
            )
        tail_j: float | None = share.tail_j
        by_ledger = account.by_ledger
        if by_ledger is None or account.by_ledger_split_s != window.split_s:
            # A window the ledger does not follow is in no interval split by it.
            assert claim is not None or window.key is None or self.ledger is None
            by_ledger = Share() if claim is None else self._by_steps(index, window, claim, run)
            account.by_ledger, account.by_ledger_split_s = by_ledger, window.split_s
        energy_j = share.energy_j + by_ledger.energy_j
        net_j = share.net_j + by_ledger.net_j
        if not final or idle_w is None:
            energy_j, net_j, tail_j = energy_j - share.tail_j, net_j - share.tail_j, None
        prefill_j = None
        if window.split_s is not None:
            prefill_j = by_ledger.before_split_j
            if account.intervals:
                span = self._span(window)
                prefill_j += sum(
                    energy_j * before_split_fraction(span, window.split_s, low_s, high_s, claim_s)
                    for low_s, high_s, energy_j, claim_s in account.intervals
                    if low_s < window.split_s
                )
        return SourceEnergy(
            source=source.name,
            domain=source.domain,
            method=source.method,
            energy_j=energy_j,
            net_energy_j=net_j if idle_w is not None else None,
            idle_power_w=idle_w,
            low_resolution=low_resolution,
            tail_j=tail_j,
            prefill_j=prefill_j,
            shared=share.shared or by_ledger.shared,
        )

    def _by_steps(self, index: int, window: WindowHandle, claim: Claim, run: Run | None) -> Share:
        """The window's part of the intervals split by the ledger (`WorkInterval`): in each it
        is in, the pot times its steps' claim there (`claim(low_s, high_s)`) over all the
        claims there; the same before its first token in `before_split_j`."""
        part = Share()
        end_s, split_s = window.end_s, window.split_s
        assert end_s is not None
        intervals = self._split[index]
        # Where the window's shared pieces run through an interval, its part there is the
        # batch's (`WorkInterval.batch_j`).
        from_s, to_s = (run.from_s, run.to_s) if run is not None else (math.inf, -math.inf)
        for interval in intervals[bisect.bisect_right(intervals, window.start_s, key=_high_s) :]:
            low_s, high_s = interval.low_s, interval.high_s
            if low_s >= end_s:
                break
            part.shared |= interval.shared
            covered = from_s <= low_s and high_s <= to_s
            if covered and interval.batch_j is not None:
                energy_j, net_j = interval.batch_j, interval.batch_net_j
            else:
                claim_s = claim(low_s, high_s)
                if claim_s <= 0:  # it waited for its turn
                    continue
                fraction = claim_s / interval.claimed_s
                energy_j = interval.pot_j * fraction
                net_j = 0.0 if interval.above_j is None else interval.above_j * fraction
                if covered:
                    interval.batch_j, interval.batch_net_j = energy_j, net_j
            part.energy_j += energy_j
            part.net_j += net_j
            if split_s is not None and low_s < split_s:
                if high_s > split_s:  # its first token inside: its claim up to it
                    energy_j = interval.pot_j * claim(low_s, split_s) / interval.claimed_s
                part.before_split_j += energy_j
        return part


def _nothing_after_end(window: WindowHandle) -> bool:
    """No source split any energy to the window after its end (no tail, no later interval)."""
    return all(
        account.share.tail_j == 0 and (account.at_end is None or account.at_end == account.share)
        for account in window.accounts
    )

"""Window energies from a counter's refresh points, so that every joule is counted once.

A counter is known only at its refreshes (knots). The energy above idle of each interval between
two knots goes to the windows active in it, by overlap; an interval between windows (the device
winding down after a task) goes to the window that closed last before it, as that window's tail.
Where windows carry work (a batching engine's steps), an interval with work in it is split by the
work each window did there instead (`Piece`). Over a run the windows' energies add up to the
counter's.
"""

import bisect
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "Knot",
    "Piece",
    "Share",
    "Span",
    "WorkStep",
    "attribute",
    "before_split_fraction",
    "claim_in_s",
    "covered_s",
    "mean_batch",
    "work_pot_j",
]


class WorkStep(Protocol):
    """One engine step a window's sequence took part in, as a batching engine's step ledger
    holds it (runtime's `WorkPiece` has this shape; power imports nothing from runtime). Steps
    that compare equal have equal claims (a dataclass of these fields)."""

    @property
    def start_s(self) -> float: ...
    @property
    def end_s(self) -> float: ...
    @property
    def share(self) -> float: ...
    @property
    def batch(self) -> int: ...
    @property
    def claim_s(self) -> float:
        """share * (end_s - start_s): its claim on an interval that holds it whole."""
        ...

    @property
    def length_s(self) -> float:
        """end_s - start_s."""
        ...

    @property
    def batch_s(self) -> float:
        """batch * (end_s - start_s): its weight in the mean batch."""
        ...


@dataclass(frozen=True, slots=True)
class Piece:
    """One engine step of a window's sequence: its time (on the meter's clock), the sequence's
    share of the step's tokens and the step's batch size. Every sequence of a step does the same
    kind of work, so the step's measured time is the cost its tokens divide: the sequence's
    claim on an interval is `share * overlap(step, interval)`."""

    start_s: float
    end_s: float
    share: float
    batch: int
    claim_s: float = field(init=False, repr=False, compare=False)
    length_s: float = field(init=False, repr=False, compare=False)
    batch_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        length_s = self.end_s - self.start_s
        object.__setattr__(self, "claim_s", self.share * length_s)
        object.__setattr__(self, "length_s", length_s)
        object.__setattr__(self, "batch_s", self.batch * length_s)

    @classmethod
    def of(cls, step: WorkStep) -> "Piece":
        return cls(float(step.start_s), float(step.end_s), float(step.share), int(step.batch))


def mean_batch(pieces: Sequence[WorkStep]) -> float | None:
    """The batch size a sequence ran at, weighted by each step's time (None: no steps)."""
    if not pieces:
        return None
    # Comprehensions of fields each step computed once: half the time of one loop (Python 3.11).
    seconds = sum([piece.length_s for piece in pieces])
    if seconds <= 0:  # steps too short for the clock: every step counts alike
        return sum(p.batch for p in pieces) / len(pieces)
    return sum([piece.batch_s for piece in pieces]) / seconds


@dataclass(frozen=True, slots=True)
class Knot:
    """The counter's cumulative energy at one instant: a refresh, or a read of a counter that
    is always current."""

    time_s: float
    energy_j: float


@dataclass(slots=True)  # not frozen: the accountant makes one per window and interval, and
class Span:  # a frozen dataclass's __init__ takes three times as long
    """A window's time; `split_s` (the first token) divides prefill from decode; `work` holds
    the engine steps its sequence took part in, in time order. `reported`: the engine's ledger
    follows this window, so no steps means it did no work (it waited); otherwise empty `work`
    means the engine did not say."""

    start_s: float
    end_s: float  # float("inf") while the window is open
    split_s: float | None = None
    work: Sequence[WorkStep] = ()
    reported: bool = False


@dataclass(slots=True)
class Share:
    """One window's part of one source's energy over the knots given to `attribute`.

    With idle power known: `net_j` is energy above idle inside the window, `tail_j` above idle
    in the gaps it owns; `energy_j` adds idle power over the window's own time. Without it,
    `energy_j` is the window's time share of each interval and there is no net or tail.
    """

    energy_j: float = 0.0
    net_j: float = 0.0
    tail_j: float = 0.0
    before_split_j: float = 0.0  # gross, window start to split
    shared: bool = False  # another window was in an interval that was split by work
    # Its steps' claims (share * time) in the intervals split by work, for its prefill part
    # later (`before_split_fraction`).
    claim_s: float = 0.0

    def copy(self) -> "Share":
        """A copy of the share so far (copy.copy takes several times as long)."""
        return Share(
            self.energy_j,
            self.net_j,
            self.tail_j,
            self.before_split_j,
            self.shared,
            self.claim_s,
        )


def _overlap_s(start_s: float, end_s: float, low_s: float, high_s: float) -> float:
    return max(0.0, min(end_s, high_s) - max(start_s, low_s))


def _owner(spans: Sequence[Span], time_s: float) -> int | None:
    """The span that closed last at or before `time_s` (None: an earlier one, or none)."""
    closed = [(span.end_s, index) for index, span in enumerate(spans) if span.end_s <= time_s]
    return max(closed)[1] if closed else None


def attribute(
    knots: Sequence[Knot], spans: Sequence[Span], idle_power_w: float | None, pad_s: float = 0.0
) -> list[Share]:
    """Each span's share of the energy between consecutive knots (times ascending).

    An interval that a span touches gives its energy above idle to the spans in it, by
    overlap; the idle part of an interval goes to each span for its own time. An interval no
    span touches is a gap: its energy above idle is the tail of the span that closed last
    before it. `pad_s` widens each span by the uncertainty of the knots' times, so that work
    just before a refresh is not mistaken for a gap. Pass every span that overlaps the knots'
    range; a gap whose owner closed before the range is left out.

    An interval in which some span's work falls is split by work instead (`_split_by_work`).
    """
    shares = [Share() for _ in spans]
    for first, last in itertools.pairwise(knots):
        length_s = last.time_s - first.time_s
        if length_s <= 0:
            continue
        energy_j = last.energy_j - first.energy_j
        low_s, high_s = first.time_s, last.time_s
        # _overlap_s written out: a call per span costs as much as the rest of the line.
        owns = [
            max(
                0.0,
                (s.end_s if s.end_s < high_s else high_s)
                - (s.start_s if s.start_s > low_s else low_s),
            )
            for s in spans
        ]
        work_s = _work_claims_s(spans, low_s, high_s)
        if sum(work_s) > 0:
            _split_by_work(shares, spans, low_s, high_s, energy_j, idle_power_w, owns, work_s)
            continue
        claims = [_overlap_s(s.start_s - pad_s, s.end_s + pad_s, low_s, high_s) for s in spans]
        if idle_power_w is None:
            for share, span, own_s in zip(shares, spans, owns, strict=True):
                _add(share, span, low_s, high_s, own_s, energy_j / length_s * own_s)
            continue
        above_j = energy_j - idle_power_w * length_s
        claimed_s = sum(claims)
        # Idle power over the time at least one span covers, counted once: spans that overlap
        # share it in proportion to their own time (one after another, each has its own).
        owned_s = sum(owns)
        idle_scale = _union_s(spans, low_s, high_s) / owned_s if owned_s > 0 else 1.0
        if claimed_s <= 0:
            owner = _owner(spans, low_s)
            if owner is not None:
                shares[owner].tail_j += above_j
                shares[owner].net_j += above_j
                shares[owner].energy_j += above_j
            continue
        for share, span, own_s, claim_s in zip(shares, spans, owns, claims, strict=True):
            net_j = above_j * claim_s / claimed_s
            share.net_j += net_j
            _add(share, span, low_s, high_s, own_s, net_j + idle_power_w * own_s * idle_scale)
    return shares


def before_split_fraction(
    span: Span, split_s: float, low_s: float, high_s: float, claim_s: float | None = None
) -> float:
    """The part of a span's share of the interval [low_s, high_s] that came before `split_s`
    (its first token): by its steps' claims where it did work in the interval, else by time.
    `claim_s`: its claim on the whole interval where known (`Share.claim_s`)."""
    if claim_s is None or claim_s <= 0:
        claim_s = _work_claim_s(span, span.end_s, low_s, high_s)
    if claim_s > 0:
        return _work_claim_s(span, split_s, low_s, high_s) / claim_s
    own_s = _overlap_s(span.start_s, span.end_s, low_s, high_s)
    return _overlap_s(span.start_s, split_s, low_s, high_s) / own_s if own_s > 0 else 0.0


def _work_claims_s(spans: Sequence[Span], low_s: float, high_s: float) -> list[float]:
    """Each span's `_work_claim_s` on the interval, over its whole time."""
    return [_work_claim_s(span, span.end_s, low_s, high_s) if span.work else 0.0 for span in spans]


def _work_claim_s(span: Span, until_s: float, low_s: float, high_s: float) -> float:
    """A span's claim on an interval: its share of each step, times the step's time inside the
    interval (and inside the span, up to `until_s`)."""
    return claim_in_s(span.work, max(low_s, span.start_s), min(high_s, span.end_s, until_s))


def claim_in_s(work: Sequence[WorkStep], low_s: float, high_s: float) -> float:
    """The claims of steps (one window's, in time order) on [low_s, high_s]: each step's share
    times its time inside the interval. Those in it are summed by their whole claims, less the
    parts outside of the steps that an edge cuts."""
    first = bisect.bisect_right(work, low_s, key=_end_s)  # the first step ending after low_s
    # The first starting at high_s or later (none before `first`, or the interval is empty).
    last = bisect.bisect_left(work, high_s, lo=first, key=_start_s)
    if first >= last:
        return 0.0
    claim_s = sum([step.claim_s for step in work[first:last]])
    return _cut_edges(work, first, last, claim_s, low_s, high_s)


def _cut_edges(
    work: Sequence[WorkStep], first: int, last: int, claim_s: float, low_s: float, high_s: float
) -> float:
    """The whole claims of work[first:last] less the parts of its steps outside [low_s,
    high_s]. Steps are one engine's, one after another: a window's several sequences share a
    step's time or none of it, so the steps cut by an edge are the first (or last) few alike."""
    index = first
    while index < last and work[index].start_s < low_s:
        claim_s -= work[index].share * (low_s - work[index].start_s)
        index += 1
    index = last - 1
    while index >= first and work[index].end_s > high_s:
        claim_s -= work[index].share * (work[index].end_s - high_s)
        index -= 1
    return max(claim_s, 0.0)


# Keys read at C speed (bisect calls its key at every probe).
_start_s = operator.attrgetter("start_s")
_end_s = operator.attrgetter("end_s")


def _union_s(spans: Sequence[Span], low_s: float, high_s: float) -> float:
    """Time inside [low_s, high_s] covered by at least one span."""
    return covered_s([(span.start_s, span.end_s) for span in spans], low_s, high_s)


def covered_s(bounds: list[tuple[float, float]], low_s: float, high_s: float) -> float:
    """Time inside [low_s, high_s] covered by at least one of the (start, end) given."""
    total_s, reached_s = 0.0, low_s
    for start_s, end_s in sorted(bounds):
        start_s, end_s = max(start_s, reached_s), min(end_s, high_s)
        if end_s > start_s:
            total_s += end_s - start_s
            reached_s = end_s
    return total_s


def work_pot_j(
    energy_j: float, idle_power_w: float | None, length_s: float, union_s: float
) -> tuple[float, float | None]:
    """What the windows of an interval with work in it get together (`_split_by_work`), and its
    energy above idle (None without idle power): the interval's energy above idle plus idle
    power over the windows' union, or without idle power the union's time share."""
    if idle_power_w is None:
        return energy_j / length_s * union_s, None
    above_j = energy_j - idle_power_w * length_s
    return above_j + idle_power_w * union_s, above_j


def _split_by_work(
    shares: list[Share],
    spans: Sequence[Span],
    low_s: float,
    high_s: float,
    energy_j: float,
    idle_power_w: float | None,
    owns: list[float],
    work_s: list[float],
) -> None:
    """Split an interval in which work was done among the spans in it, by work.

    The pot is what one window covering the spans' union would get by the rules above: the
    energy above idle of the whole interval plus idle power over the union's time (without idle
    power, the union's time share), so idle is counted once however many windows overlap. Each
    span's part is its claim over all claims. A span that carries no work at all (its engine
    did not report steps) claims its time in the interval at the mean rate of the spans that
    worked there, as an average sequence would; a span that carries work but did none in this
    interval (it waited for its turn) claims nothing.
    """
    working = [i for i, claim_s in enumerate(work_s) if claim_s > 0]
    rate = sum(work_s[i] for i in working) / max(sum(owns[i] for i in working), 1e-12)
    claims = [
        claim_s if span.work or span.reported else own_s * rate
        for span, own_s, claim_s in zip(spans, owns, work_s, strict=True)
    ]
    claimed_s = sum(claims)
    present = [i for i, own_s in enumerate(owns) if own_s > 0 or work_s[i] > 0]
    union_s = _union_s([spans[i] for i in present], low_s, high_s)
    pot_j, above_j = work_pot_j(energy_j, idle_power_w, high_s - low_s, union_s)
    for i in present:
        share, span, fraction = shares[i], spans[i], claims[i] / claimed_s
        share.shared |= len(present) > 1
        share.claim_s += work_s[i]
        share.energy_j += pot_j * fraction
        if above_j is not None:
            share.net_j += above_j * fraction
        if span.split_s is None or fraction <= 0:
            continue
        if span.work or span.reported:  # the steps before the first token, by claim
            before = _work_claim_s(span, span.split_s, low_s, high_s) / work_s[i]
        else:
            before = _overlap_s(span.start_s, span.split_s, low_s, high_s) / owns[i]
        share.before_split_j += pot_j * fraction * before


def _add(
    share: Share, span: Span, low_s: float, high_s: float, own_s: float, energy_j: float
) -> None:
    """Add a span's gross share of one interval; the split divides it by time."""
    share.energy_j += energy_j
    if span.split_s is not None and own_s > 0:
        before_s = _overlap_s(span.start_s, span.split_s, low_s, high_s)
        share.before_split_j += energy_j * before_s / own_s

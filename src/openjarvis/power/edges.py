"""Window energies from a counter's refresh points, so that every joule is counted once.

A counter is known only at its refreshes (knots). The energy above idle of each interval between
two knots goes to the windows active in it, by overlap; an interval between windows (the device
winding down after a task) goes to the window that closed last before it, as that window's tail.
Over a run the windows' energies above idle add up to the counter's.
"""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Knot", "Share", "Span", "attribute"]


@dataclass(frozen=True, slots=True)
class Knot:
    """The counter's cumulative energy at one instant: a refresh, or a read of a counter that
    is always current."""

    time_s: float
    energy_j: float


@dataclass(frozen=True, slots=True)
class Span:
    """A window's time; `split_s` (the first token) divides prefill from decode."""

    start_s: float
    end_s: float  # float("inf") while the window is open
    split_s: float | None = None


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
    """
    shares = [Share() for _ in spans]
    for first, last in itertools.pairwise(knots):
        length_s = last.time_s - first.time_s
        if length_s <= 0:
            continue
        energy_j = last.energy_j - first.energy_j
        low_s, high_s = first.time_s, last.time_s
        owns = [_overlap_s(s.start_s, s.end_s, low_s, high_s) for s in spans]
        claims = [_overlap_s(s.start_s - pad_s, s.end_s + pad_s, low_s, high_s) for s in spans]
        if idle_power_w is None:
            for share, span, own_s in zip(shares, spans, owns, strict=True):
                _add(share, span, low_s, high_s, own_s, energy_j / length_s * own_s)
            continue
        above_j = energy_j - idle_power_w * length_s
        claimed_s = sum(claims)
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
            _add(share, span, low_s, high_s, own_s, net_j + idle_power_w * own_s)
    return shares


def _add(
    share: Share, span: Span, low_s: float, high_s: float, own_s: float, energy_j: float
) -> None:
    """Add a span's gross share of one interval; the split divides it by time."""
    share.energy_j += energy_j
    if span.split_s is not None and own_s > 0:
        before_s = _overlap_s(span.start_s, span.split_s, low_s, high_s)
        share.before_split_j += energy_j * before_s / own_s

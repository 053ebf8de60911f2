"""The accountant's fast paths (a window's steps found among the batch's shared pieces and
summed from their running sums, the steps of an interval found by bisection, a scope's sources
added in one pass) against the straightforward computation: every step of every window, one by
one, on random engines."""

import itertools
import math
import random
from collections import Counter
from typing import TypedDict

import pytest

from openjarvis.power.accounting import sum_scope
from openjarvis.power.edges import (
    Knot,
    Piece,
    Share,
    Span,
    WorkStep,
    _union_s,
    attribute,
    before_split_fraction,
    mean_batch,
)
from openjarvis.power.steps import MAX_OWN, SharedSteps
from openjarvis.power.types import Scope, SourceEnergy


class Tolerance(TypedDict):
    rel: float
    abs: float


# A few parts in 1e12: sums taken in another order, nothing more.
CLOSE: Tolerance = {"rel": 1e-9, "abs": 1e-12}


def overlap_s(start_s: float, end_s: float, low_s: float, high_s: float) -> float:
    return max(0.0, min(end_s, high_s) - max(start_s, low_s))


def claim_s(span: Span, until_s: float, low_s: float, high_s: float) -> float:
    """Each step's share times its time inside the interval, the span and `until_s`."""
    low_s, high_s = max(low_s, span.start_s), min(high_s, span.end_s, until_s)
    return sum(
        step.share * overlap_s(step.start_s, step.end_s, low_s, high_s) for step in span.work
    )


def union_s(bounds: list[tuple[float, float]], low_s: float, high_s: float) -> float:
    """Time inside [low_s, high_s] that some (start, end) covers: clip, sort, merge."""
    clipped = sorted(
        (max(s, low_s), min(e, high_s)) for s, e in bounds if min(e, high_s) > max(s, low_s)
    )
    covered_s, open_start_s = 0.0, 0.0  # the start is read only once an end is set
    open_end_s: float | None = None
    for start_s, end_s in clipped:
        if open_end_s is None or start_s > open_end_s:
            if open_end_s is not None:
                covered_s += open_end_s - open_start_s
            open_start_s, open_end_s = start_s, end_s
        else:
            open_end_s = max(open_end_s, end_s)
    if open_end_s is not None:
        covered_s += open_end_s - open_start_s
    return covered_s


def straightforward(
    knots: list[Knot], spans: list[Span], idle_w: float | None, pad_s: float
) -> list[Share]:
    """docs/energy.md's rules, one window and one step at a time."""
    shares = [Share() for _ in spans]
    for first, last in itertools.pairwise(knots):
        low_s, high_s = first.time_s, last.time_s
        length_s, energy_j = high_s - low_s, last.energy_j - first.energy_j
        if length_s <= 0:
            continue
        owns = [overlap_s(s.start_s, s.end_s, low_s, high_s) for s in spans]
        work = [claim_s(s, s.end_s, low_s, high_s) for s in spans]
        if sum(work) > 0:  # by work
            working = [i for i, w in enumerate(work) if w > 0]
            rate = sum(work[i] for i in working) / max(sum(owns[i] for i in working), 1e-12)
            claims = [
                w if s.work or s.reported else o * rate
                for s, o, w in zip(spans, owns, work, strict=True)
            ]
            present = [i for i in range(len(spans)) if owns[i] > 0 or work[i] > 0]
            covered_s = union_s(
                [(spans[i].start_s, spans[i].end_s) for i in present], low_s, high_s
            )
            above_j: float | None = None
            if idle_w is None:
                pot_j = energy_j / length_s * covered_s
            else:
                above_j = energy_j - idle_w * length_s
                pot_j = above_j + idle_w * covered_s
            for i in present:
                share, span, fraction = shares[i], spans[i], claims[i] / sum(claims)
                share.shared |= len(present) > 1
                share.energy_j += pot_j * fraction
                share.net_j += 0.0 if above_j is None else above_j * fraction
                if span.split_s is not None and fraction > 0:
                    if span.work or span.reported:
                        before = claim_s(span, span.split_s, low_s, high_s) / work[i]
                    else:
                        before = overlap_s(span.start_s, span.split_s, low_s, high_s) / owns[i]
                    share.before_split_j += pot_j * fraction * before
            continue
        gross = [0.0] * len(spans)  # by time
        if idle_w is None:
            gross = [energy_j / length_s * own_s for own_s in owns]
        else:
            pads = [overlap_s(s.start_s - pad_s, s.end_s + pad_s, low_s, high_s) for s in spans]
            above_j = energy_j - idle_w * length_s
            if sum(pads) <= 0:
                closed = [(s.end_s, i) for i, s in enumerate(spans) if s.end_s <= low_s]
                if closed:
                    owner = shares[max(closed)[1]]
                    owner.tail_j += above_j
                    owner.net_j += above_j
                    owner.energy_j += above_j
                continue
            covered_s = union_s([(s.start_s, s.end_s) for s in spans], low_s, high_s)
            scale = covered_s / sum(owns) if sum(owns) > 0 else 1.0
            for i, pad in enumerate(pads):
                shares[i].net_j += above_j * pad / sum(pads)
                gross[i] = above_j * pad / sum(pads) + idle_w * owns[i] * scale
        for share, span, own_s, gross_j in zip(shares, spans, owns, gross, strict=True):
            share.energy_j += gross_j
            if span.split_s is not None and own_s > 0:
                before_s = overlap_s(span.start_s, span.split_s, low_s, high_s)
                share.before_split_j += gross_j * before_s / own_s
    return shares


def engine(rng: random.Random, batches: bool = False) -> tuple[list[Span], float]:
    """Windows on one batching engine: steps one after another (a gap now and then), each
    sequence in the steps of its time but a skipped one now and then; most rows share their
    step's piece, some are equal copies of it, some have a share of their own; a few windows
    the engine does not report, or that it reports and that waited. Returns them and the end.
    `batches`: steps of 1 to 64 sequences (else 8 each)."""
    steps, time_s = [], 0.0
    for _ in range(rng.randint(20, 120)):
        time_s += rng.choice([0.0, 0.0, 0.0, rng.uniform(0.0, 0.01)])
        length_s = rng.uniform(0.0005, 0.005)
        batch = rng.randint(1, 64) if batches else 8
        steps.append(Piece(time_s, time_s + length_s, 1 / batch, batch))
        time_s += length_s
    spans = []
    for _ in range(rng.randint(1, 40)):
        start_s, end_s = sorted(rng.uniform(-0.01, time_s + 0.01) for _ in range(2))
        if rng.random() < 0.2:
            end_s = math.inf  # still open
        kind = rng.random()
        work: list[Piece] = []
        if kind > 0.15:
            for step in steps:
                if start_s <= step.start_s and step.end_s <= end_s and rng.random() < 0.95:
                    row = rng.random()
                    if row < 0.1:
                        step = Piece(step.start_s, step.end_s, step.share, step.batch)
                    elif row < 0.15:
                        step = Piece(step.start_s, step.end_s, rng.uniform(0.05, 1.0), step.batch)
                    work.append(step)
        split_s = rng.choice([None, rng.uniform(start_s, min(end_s, time_s + 0.01))])
        spans.append(Span(start_s, end_s, split_s, work, reported=kind > 0.07))
    return spans, time_s


def assert_shares_equal(fast: list[Share], slow: list[Share]) -> None:
    for got, want in zip(fast, slow, strict=True):
        assert got.energy_j == pytest.approx(want.energy_j, **CLOSE)
        assert got.net_j == pytest.approx(want.net_j, **CLOSE)
        assert got.tail_j == pytest.approx(want.tail_j, **CLOSE)
        assert got.before_split_j == pytest.approx(want.before_split_j, **CLOSE)
        assert got.shared == want.shared


@pytest.mark.parametrize("seed", range(40))
def test_attribute_equals_the_straightforward_split_on_random_engines(seed: int) -> None:
    rng = random.Random(seed)
    spans, end_s = engine(rng)
    times_s = sorted(rng.uniform(-0.02, end_s + 0.02) for _ in range(rng.randint(2, 12)))
    energy_j, knots = 0.0, []
    for time_s in times_s:
        knots.append(Knot(time_s, energy_j))
        energy_j += rng.uniform(0.0, 60.0)
    for idle_w in (None, 100.0):
        pad_s = rng.choice([0.0, 0.004])
        fast = attribute(knots, spans, idle_w, pad_s)
        assert_shares_equal(fast, straightforward(knots, spans, idle_w, pad_s))
    # One interval at a time, as the accountant splits them: the same. The accountant splits
    # without the first token (known at publication) and takes the prefill part then, from the
    # claim the split kept: the same as splitting with it.
    unsplit = [Span(s.start_s, s.end_s, None, s.work, s.reported) for s in spans]
    for first, last in itertools.pairwise(knots):
        want = straightforward([first, last], spans, 100.0, 0.0)
        assert_shares_equal(attribute([first, last], spans, 100.0), want)
        low_s, high_s = first.time_s, last.time_s
        for span, share, reference in zip(
            spans, attribute([first, last], unsplit, 100.0), want, strict=True
        ):
            if span.split_s is None or share.energy_j == 0:
                continue
            part = before_split_fraction(span, span.split_s, low_s, high_s, share.claim_s)
            assert share.energy_j * part == pytest.approx(reference.before_split_j, **CLOSE)


@pytest.mark.parametrize("seed", range(20))
def test_a_window_found_among_the_shared_pieces_has_the_claims_and_mean_batch_of_its_own(
    seed: int,
) -> None:
    """Claims on random intervals and the mean batch from the shared pieces' running sums
    (`steps.Run`) against each piece summed, for every window found there; a window whose
    pieces, past at most MAX_OWN of its own first, are a run of the shared ones is found."""
    rng = random.Random(seed)
    spans, end_s = engine(rng, batches=True)
    # The pieces most windows took, one a step (copies and shares of their own aside).
    counts = Counter(id(piece) for span in spans for piece in span.work)
    by_step: dict[float, WorkStep] = {}
    for piece in sorted((p for s in spans for p in s.work), key=lambda p: -counts[id(p)]):
        by_step.setdefault(piece.end_s, piece)
    steps = [by_step[end_s] for end_s in sorted(by_step)]
    shared = SharedSteps()
    shared.extend([Piece(-1.0, -0.5, 1.0, 1), *steps])  # a window's own first piece is skipped
    runs = []
    for _ in range(10):  # windows made as such runs, with 0 to MAX_OWN pieces of their own
        first = rng.randrange(len(steps))
        last = rng.randrange(first, len(steps)) + 1
        start_s = steps[first].start_s
        own = [
            Piece(start_s - 0.001 * (k + 1), start_s - 0.001 * k, rng.uniform(0.1, 1.0), 3)
            for k in reversed(range(rng.randint(0, MAX_OWN)))
        ]
        runs.append(Span(-math.inf, math.inf, work=[*own, *steps[first:last]]))
    for span in [*spans, *runs]:
        run = shared.find(span.work)
        if span in runs:
            assert run is not None
        if run is None:
            continue
        assert run.mean_batch() == pytest.approx(mean_batch(span.work), **CLOSE)
        whole = Span(-math.inf, math.inf, work=span.work)
        for _ in range(10):
            low_s, high_s = sorted(rng.uniform(-0.02, end_s + 0.01) for _ in range(2))
            want = claim_s(whole, math.inf, low_s, high_s)
            assert run.claim_s(low_s, high_s) == pytest.approx(want, **CLOSE)


@pytest.mark.parametrize("seed", range(20))
def test_the_union_of_spans_equals_sorting_and_merging_them(seed: int) -> None:
    rng = random.Random(seed)
    low_s, high_s = sorted(rng.uniform(0.0, 1.0) for _ in range(2))
    bounds = []
    for _ in range(rng.randint(0, 30)):
        start_s, end_s = rng.uniform(-0.5, 1.5), rng.uniform(-0.5, 1.5)
        if rng.random() < 0.7:
            start_s, end_s = sorted((start_s, end_s))  # the rest end before they start
        bounds.append((start_s, rng.choice([end_s, math.inf])))
    spans = [Span(start_s, end_s) for start_s, end_s in bounds]
    assert _union_s(spans, low_s, high_s) == pytest.approx(union_s(bounds, low_s, high_s), **CLOSE)


@pytest.mark.parametrize("seed", range(20))
def test_a_scope_sums_its_sources_as_the_rules_say(seed: int) -> None:
    rng = random.Random(seed)
    sources = tuple(
        SourceEnergy(
            source=f"s{i}",
            domain=rng.choice(["gpu", "cpu", "dram", "platform"]),
            method=rng.choice(["counter", "integrated", "estimate"]),
            energy_j=rng.choice([None, rng.uniform(0, 10), rng.uniform(0, 10)]),
            net_energy_j=rng.choice([None, rng.uniform(0, 10)]),
            idle_power_w=None,
            null_reason=f"reason-{i}",
            low_resolution=rng.random() < 0.3,
            tail_j=rng.choice([None, rng.uniform(0, 1)]),
            prefill_j=rng.choice([None, rng.uniform(0, 1)]),
        )
        for i in range(rng.randint(0, 5))
    )
    scopes: tuple[tuple[Scope, set[str]], ...] = (
        ("accelerator", {"gpu"}),
        ("system", {"gpu", "cpu", "dram"}),
    )
    for scope, domains in scopes:
        total = sum_scope(sources, scope)
        chosen = [s for s in sources if s.domain in domains]
        if not chosen:
            assert (total.energy_j, total.null_reason, total.method) == (None, "no-device", None)
            continue
        rank = ["counter", "integrated", "estimate"]
        assert total.method == max((s.method for s in chosen), key=rank.index)
        assert total.low_resolution == any(s.low_resolution for s in chosen)
        failed = [s for s in chosen if s.energy_j is None]
        if failed:
            assert (total.energy_j, total.net_energy_j) == (None, None)
            assert total.null_reason == failed[0].null_reason
            continue
        assert total.null_reason is None
        assert total.energy_j == pytest.approx(sum(s.energy_j or 0.0 for s in chosen))
        for field in ("net_energy_j", "tail_j", "prefill_j"):
            parts = [getattr(s, field) for s in chosen]
            want = None if None in parts else pytest.approx(sum(parts))
            assert getattr(total, field) == want

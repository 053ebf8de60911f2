"""Attribution of a counter's refresh intervals to windows: shares, tails, splits, and every
joule above idle counted once."""

import itertools

import pytest

from openjarvis.power.edges import Knot, Span, attribute

IDLE_W = 100.0


def knots_at(times_s: list[float], power_w: dict[float, float]) -> list[Knot]:
    """Knots of a counter whose interval ending at t drew power_w.get(t, IDLE_W) on average."""
    energy_j, knots = 0.0, [Knot(times_s[0], 0.0)]
    for start_s, end_s in itertools.pairwise(times_s):
        energy_j += power_w.get(end_s, IDLE_W) * (end_s - start_s)
        knots.append(Knot(end_s, energy_j))
    return knots


def test_a_burst_inside_one_interval_gets_all_of_its_energy_and_the_gap_after_is_its_tail():
    # Refreshes every 0.1 s; a 20 ms burst at 0.13-0.15 s; the interval ending at 0.2 s drew
    # 300 W on average (the burst), the next one 150 W (the wind-down), then idle.
    knots = knots_at([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], {0.2: 300.0, 0.3: 150.0})
    (burst,) = attribute(knots, [Span(0.13, 0.15)], IDLE_W)
    assert burst.net_j == pytest.approx(20.0 + 5.0)  # (300 - 100) W * 0.1 s + (150 - 100) * 0.1
    assert burst.tail_j == pytest.approx(5.0)
    assert burst.energy_j == pytest.approx(25.0 + IDLE_W * 0.02)  # idle for its own 20 ms


def test_an_interval_shared_by_two_windows_is_split_by_overlap_and_nothing_is_lost():
    knots = knots_at([0.0, 0.1, 0.2, 0.3], {0.1: 200.0, 0.2: 400.0, 0.3: 250.0})
    first, second = attribute(knots, [Span(0.0, 0.15), Span(0.15, 0.25)], IDLE_W)
    assert first.net_j == pytest.approx(10.0 + 15.0)  # all of 0-0.1, half of 0.1-0.2
    assert second.net_j == pytest.approx(15.0 + 15.0)  # half of 0.1-0.2, all of 0.2-0.3
    above_idle_j = knots[-1].energy_j - IDLE_W * 0.3
    assert first.net_j + second.net_j == pytest.approx(above_idle_j)


def test_without_idle_power_each_window_gets_its_time_share_and_no_tail():
    knots = knots_at([0.0, 0.1, 0.2], {0.1: 200.0, 0.2: 400.0})
    (share,) = attribute(knots, [Span(0.05, 0.1)], None)
    assert share.energy_j == pytest.approx(200.0 * 0.05)
    assert share.tail_j == 0.0


def test_the_first_token_splits_prefill_from_decode():
    knots = knots_at([0.0, 0.1, 0.2, 0.3], {0.1: 500.0, 0.2: 200.0, 0.3: 200.0})
    (share,) = attribute(knots, [Span(0.0, 0.3, split_s=0.1)], IDLE_W)
    assert share.before_split_j == pytest.approx(500.0 * 0.1)
    assert share.energy_j - share.before_split_j == pytest.approx(200.0 * 0.2)


def test_padding_keeps_work_just_before_a_refresh_in_its_window():
    # The refresh placed at 0.1 s may really be 3 ms later: a window from 0.102 s still claims
    # the interval ending at 0.1 s, which holds its first joules.
    knots = knots_at([0.0, 0.1, 0.2], {0.1: 130.0, 0.2: 400.0})
    previous, burst = attribute(knots, [Span(-0.2, -0.1), Span(0.102, 0.18)], IDLE_W, pad_s=0.004)
    assert burst.net_j == pytest.approx(3.0 + 30.0)
    assert previous.tail_j == 0.0


def test_a_claim_sums_whole_steps_and_cuts_those_an_edge_crosses() -> None:
    """The accountant's fast claim (whole steps summed, edges cut) against the overlap of every
    step with the interval, one by one: one engine's steps one after another, a window with two
    sequences sharing some of them, random intervals and spans."""
    import heapq
    import random

    from openjarvis.power.edges import Piece, _work_claim_s

    rng = random.Random(7)
    steps, time_s = [], 0.0
    for _ in range(400):
        time_s += rng.choice([0.0, 0.0, rng.uniform(0.0, 0.002)])  # gaps between some steps
        length_s = rng.uniform(0.0005, 0.004)
        steps.append((time_s, time_s + length_s, rng.randint(1, 8)))
        time_s += length_s
    one = [Piece(start, end, 1 / batch, batch) for start, end, batch in steps if rng.random() < 0.8]
    other = [
        Piece(start, end, 1 / batch, batch) for start, end, batch in steps if rng.random() < 0.5
    ]
    work = list(heapq.merge(one, other, key=lambda piece: piece.end_s))
    for _ in range(300):
        low_s, high_s = sorted(rng.uniform(-0.01, time_s + 0.01) for _ in range(2))
        span = Span(
            rng.uniform(-0.01, time_s / 2), rng.uniform(time_s / 2, time_s + 0.01), work=work
        )
        until_s = rng.choice([span.end_s, rng.uniform(low_s, high_s)])
        lo, hi = max(low_s, span.start_s), min(high_s, span.end_s, until_s)
        expected = sum(
            piece.share * max(0.0, min(piece.end_s, hi) - max(piece.start_s, lo)) for piece in work
        )
        assert _work_claim_s(span, until_s, low_s, high_s) == pytest.approx(expected, abs=1e-12)

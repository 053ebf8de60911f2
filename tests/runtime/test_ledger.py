"""The step ledger's sums: an interval's followed claims from running sums equal each step's
followed shares times its time inside, one step at a time, also once steps are forgotten and
where steps landed apart overlap."""

import random

import pytest

from openjarvis.runtime.ledger import StepLedger


def by_hand(steps: list[tuple[float, float, float]], low_s: float, high_s: float) -> float:
    return sum(f * max(0.0, min(e, high_s) - max(s, low_s)) for s, e, f in steps)


@pytest.mark.parametrize(("seed", "overlap"), [(0, False), (1, False), (2, True), (3, True)])
def test_claimed_equals_each_steps_claim_summed(seed: int, overlap: bool) -> None:
    rng = random.Random(seed)
    ledger = StepLedger(clock=lambda: 0.0)
    steps: list[tuple[float, float, float]] = []
    end_s = 0.0
    for _ in range(400):
        start_s = end_s - (rng.uniform(0.0, 0.02) if overlap else -rng.uniform(0.0, 0.001))
        end_s = max(start_s, end_s) + rng.choice((0.0014, 0.002, 0.05))
        followed = rng.choice((0.0, 0.25, 1.0))
        ledger.landed(start_s, end_s, followed)
        steps.append((start_s, end_s, followed))
    forgotten_s = 0.0
    for _ in range(200):
        low_s = rng.uniform(forgotten_s, end_s)
        high_s = low_s + rng.uniform(0.0, 0.3)
        assert ledger.claimed_s(low_s, high_s) == pytest.approx(
            by_hand(steps, low_s, high_s), rel=1e-9, abs=1e-12
        )
        if rng.random() < 0.1:  # the meter split every interval up to here
            forgotten_s = max(forgotten_s, low_s)
            ledger.forget(forgotten_s)

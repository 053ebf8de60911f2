"""Short windows on a counter that refreshes every 100 ms at an unknown phase, with the board
winding down after each burst: every window gets its burst and its tail, and the windows of a
run add up to the counter's energy over the run (conservation)."""

import itertools
import math
import random

import pytest

from openjarvis.power.meter import Meter
from tests.fakes.clock import FakeClock
from tests.fakes.nvml import FakeGpu, SteppingCounter, install_fake_nvml
from tests.power.test_meter import known, spend

UUID = "GPU-aaaa1111-0000-0000-0000-000000000000"
IDLE_W, BURST_W, TAIL_W, TAIL_S = 120.0, 600.0, 200.0, 0.05


class Board:
    """Power of a GPU running bursts: idle, the burst, then a decaying tail above idle."""

    def __init__(self) -> None:
        self.bursts: list[tuple[float, float]] = []

    def power_w(self, time_s: float) -> float:
        power_w = IDLE_W
        for start_s, end_s in self.bursts:
            if start_s <= time_s < end_s:
                return BURST_W
            if time_s >= end_s:
                power_w = max(power_w, IDLE_W + TAIL_W * math.exp(-(time_s - end_s) / TAIL_S))
        return power_w


@pytest.mark.parametrize("burst_s", [0.01, 0.02, 0.05, 0.2, 1.0])
def test_short_bursts_are_counted_whole_with_their_tail_and_the_run_adds_up(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, burst_s: float
) -> None:
    rng = random.Random(burst_s)
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID)])
    board = Board()
    counter = SteppingCounter(clock, fake.gpus[0], board.power_w, phase_s=rng.uniform(0, 0.1))
    meter = Meter.discover(
        "accelerator", "/nonexistent", estimate_cpu=False, clock=clock, sleep=clock.sleep
    )
    spend(meter, clock, 0.5)
    assert meter.measure_idle(2.0).power_w[f"nvml:{UUID}"] == pytest.approx(IDLE_W, rel=1e-3)
    run_start_s = clock.now_s
    windows = []
    for _ in range(12):
        spend(meter, clock, rng.uniform(0.3, 0.5))  # scoring, between windows
        with meter.window("burst") as window:
            board.bursts.append((clock.now_s, clock.now_s + burst_s))
            spend(meter, clock, burst_s)
        windows.append(window)
    spend(meter, clock, 0.5)
    meter.settle()
    run_end_s = clock.now_s
    results = [window.wait_settled() for window in windows]

    # Each window: its burst above idle, plus its tail until the next window opened.
    starts = [w.start_s for w in windows] + [run_end_s]
    truths = [
        counter.true_energy_j(start_s, next_s) - IDLE_W * (next_s - start_s)
        for start_s, next_s in itertools.pairwise(starts)
    ]
    nets = known([r.net_energy_j for r in results])
    ratios = [net / truth for net, truth in zip(nets, truths, strict=True)]
    assert sum(ratios) / len(ratios) == pytest.approx(1.0, abs=0.03)
    # Settled windows carry their tail (part of it may fall in the window's own last interval).
    tails = [r.tail_energy_j for r in results]
    assert None not in tails and sum(known(tails)) > 0

    # Conservation: the windows' net energies add up to the counter's above idle over the run.
    bracket_j = counter.true_energy_j(run_start_s, run_end_s) - IDLE_W * (run_end_s - run_start_s)
    assert sum(nets) == pytest.approx(bracket_j, rel=0.01)

    # Gross is net plus idle over the window's own time, so its ratio holds too.
    gross_truth = sum(t + IDLE_W * burst_s for t in truths)
    gross = known([r.energy_j for r in results])
    assert sum(gross) == pytest.approx(gross_truth, rel=0.03)


def test_prefill_and_decode_are_split_at_the_first_token(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID)])
    board = Board()
    SteppingCounter(clock, fake.gpus[0], board.power_w, phase_s=0.042)
    meter = Meter.discover(
        "accelerator", "/nonexistent", estimate_cpu=False, clock=clock, sleep=clock.sleep
    )
    spend(meter, clock, 0.5)
    meter.measure_idle(1.0)  # with idle known, the edges' intervals go to the window whole
    with meter.window("task") as window:
        board.bursts.append((clock.now_s, clock.now_s + 1.0))  # 600 W throughout
        spend(meter, clock, 0.3)
        window.mark_first_token(clock.now_s)
        spend(meter, clock, 0.7)
    spend(meter, clock, 0.2)
    result = window.result  # its tail is still open: decode is the window's own energy
    assert result.prefill_energy_j == pytest.approx(600.0 * 0.3, rel=0.02)
    # Decode also holds the wind-down in the interval the window ends in (the whole tail is
    # 200 W * 50 ms = 10 J).
    assert result.decode_energy_j is not None
    assert 600.0 * 0.7 * 0.98 <= result.decode_energy_j <= (600.0 * 0.7 + TAIL_W * TAIL_S) * 1.02


def test_a_window_waits_for_nobody_and_settles_when_the_next_one_opens(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID)])
    SteppingCounter(clock, fake.gpus[0], lambda t: IDLE_W)
    meter = Meter.discover(
        "accelerator", "/nonexistent", estimate_cpu=False, clock=clock, sleep=clock.sleep
    )
    spend(meter, clock, 0.5)
    meter.measure_idle(1.0)

    def no_sleep(seconds: float) -> None:
        raise AssertionError("a window slept in its caller")

    meter._sleep = no_sleep
    with meter.window("a") as first:
        clock.advance(0.01)
    assert first.settled() is None  # its tail runs until the next window opens
    with meter.window("b"):
        clock.advance(0.01)
    assert first.settled() is None  # the counter has not refreshed past b's start yet
    meter._sleep = clock.sleep
    spend(meter, clock, 0.4)  # a read every second refresh: one lands past b's start
    settled = first.settled()
    assert settled is not None and settled.net_energy_j == pytest.approx(0.0, abs=1e-3)


def test_a_caller_waiting_for_a_result_gets_it_right_after_the_next_refresh(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID)])
    SteppingCounter(clock, fake.gpus[0], lambda t: IDLE_W, phase_s=0.0)
    meter = Meter.discover(
        "accelerator", "/nonexistent", estimate_cpu=False, clock=clock, sleep=clock.sleep
    )
    spend(meter, clock, 1.0)  # phase learned; reads now come every second refresh, halfway
    clock.advance(0.3 - (clock.now_s % 0.1) + 0.001)  # just after a refresh
    with meter.window("request") as window:
        clock.advance(0.01)
    ended_s = clock.now_s
    assert window.result.energy_j == pytest.approx(IDLE_W * 0.01, rel=1e-3)
    # The next refresh is 0.089 s after the end; the planned read would come up to 0.25 s on.
    waited_s = clock.now_s - ended_s
    refresh = meter._tracks[0].refresh
    assert refresh is not None
    assert waited_s <= 0.089 + refresh.margin_s + 0.003  # the wait re-checks every 2 ms

"""A source read at every window's edge (always current: RAPL, the CPU estimate) beside a
stepping counter: many windows at once cost the meter a pass per counter refresh, not one
per request, and its intervals are split once per refresh while windows overlap."""

from collections.abc import Sequence
from typing import Any, NamedTuple

import pytest

from openjarvis.power import accountant
from openjarvis.power.accountant import Accountant
from openjarvis.power.edges import Knot, Share
from openjarvis.power.meter import Meter
from tests.fakes.clock import FakeClock
from tests.fakes.nvml import FakeGpu, SteppingCounter, install_fake_nvml
from tests.power.test_meter import by_name, known, spend

UUID = "GPU-aaaa1111-0000-0000-0000-000000000000"


class CpuTimes(NamedTuple):
    user: float
    idle: float


def gpu_and_estimate(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Meter:
    """The GPU's counter, and the CPU estimate with the CPUs half busy on the fake clock."""
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID)])
    busy = lambda: CpuTimes(0.5 * clock.now_s, 0.5 * clock.now_s)  # noqa: E731
    monkeypatch.setattr("openjarvis.power.estimate.psutil.cpu_times", busy)
    SteppingCounter(clock, fake.gpus[0], lambda t: 300.0, phase_s=0.037)
    meter = Meter.discover("accelerator", "/nonexistent", clock=clock, sleep=clock.sleep)
    assert [s.name for s in meter.sources][1:] == ["estimate:cpu"]  # no RAPL here
    spend(meter, clock, 0.5)
    return meter


def cursor_s(meter: Meter, index: int) -> float:
    """How far the accountant has split source `index`'s intervals."""
    cursor = meter._accountant.cursors[index]
    assert cursor is not None
    return cursor.time_s


def staggered(meter: Meter, clock: FakeClock, count: int) -> list:
    """`count` windows opened 5 ms apart, each 50 ms long; the sampler's thread reads each
    source when it is due (the delay its last pass returned), as it does in a server."""
    contexts = [meter.window(f"request-{i}") for i in range(count)]
    handles = []
    due_s = clock.now_s
    for step in range(count + 10):
        if step < count:
            handles.append(contexts[step].__enter__())
        if step >= 10:
            contexts[step - 10].__exit__(None, None, None)
        end_s = clock.now_s + 0.005
        while clock.now_s < end_s - 1e-12:
            if clock.now_s >= due_s:
                due_s = clock.now_s + max(meter.poll(), 1e-4)
            clock.advance(min(due_s, end_s) - clock.now_s)
    spend(meter, clock, 0.3)
    return [handle.result for handle in handles]


def test_windows_ending_within_one_refresh_wake_one_pass_not_one_each(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    meter = gpu_and_estimate(monkeypatch, clock)
    passes = []
    account = meter._account

    def counted_account() -> None:
        passes.append(clock.now_s)
        account()

    monkeypatch.setattr(meter, "_account", counted_account)
    contexts = [meter.window(f"request-{i}") for i in range(8)]
    for context in contexts:
        context.__enter__()
    clock.advance(0.05)
    for context in contexts:  # all end inside one refresh of the GPU's counter
        context.__exit__(None, None, None)
        clock.advance(0.001)
    # The first end moves the counter's next read earlier; the others wait for that read
    # (the estimate, read at each edge, has its knot and needs no pass of its own).
    assert len(passes) <= 1


def test_short_intervals_of_an_edge_read_source_split_once_a_refresh_and_still_add_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    split = accountant.attribute

    def counted_split(*args: Any) -> list[Share]:
        calls.append(1)
        return split(*args)

    monkeypatch.setattr(accountant, "attribute", counted_split)
    # Each run on a clock of its own from the same start, so the counter is read at the same
    # times in both (where the meter places a refresh depends on when it read the counter).
    clock = FakeClock()
    merged = staggered(gpu_and_estimate(monkeypatch, clock), clock, 20)
    merged_calls = len(calls)
    calls.clear()
    monkeypatch.setattr(Accountant, "_merges", lambda self, *args: False)
    clock = FakeClock()
    each = staggered(gpu_and_estimate(monkeypatch, clock), clock, 20)
    # 40 edges in 0.15 s: an interval at each without merging, a few with it.
    assert len(calls) >= 40 and merged_calls <= len(calls) // 3
    for results in (merged, each):
        assert all(r.energy_j is not None for r in results)
    # A steady draw split by time is the same for each window, whichever knots end the
    # intervals (merging moves energy between overlapping windows only by their work).
    estimate = [[by_name(r.sources, "estimate:cpu").energy_j for r in rs] for rs in (merged, each)]
    assert estimate[0] == pytest.approx(estimate[1], rel=1e-6)
    assert sum(known(estimate[0])) > 0
    gpu = [[by_name(r.sources, f"nvml:{UUID}").energy_j for r in rs] for rs in (merged, each)]
    assert gpu[0] == pytest.approx(gpu[1], rel=1e-9)  # its knots are a refresh apart anyway


def test_an_edge_read_source_under_load_ends_its_intervals_where_the_counter_reaches(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    meter = gpu_and_estimate(monkeypatch, clock)
    gpu = meter._tracks[0]
    contexts = [meter.window(f"request-{i}") for i in range(3)]
    for context in contexts:
        context.__enter__()
    spend(meter, clock, 0.35)  # three windows open over a few refreshes
    splits: list[tuple[float, float]] = []
    split = accountant.attribute

    def noted_split(knots: Sequence[Knot], *rest: Any) -> list[Share]:
        splits.append((knots[0].time_s, knots[-1].time_s))
        return split(knots, *rest)

    monkeypatch.setattr(accountant, "attribute", noted_split)
    for _ in range(3):
        clock.advance(gpu.next_due_s - clock.now_s)
        splits.clear()
        meter.poll()  # the counter's read past a refresh, and the estimate's beside it
        reach_s = cursor_s(meter, 0)
        # The estimate's interval ends at its first knot at or past the counter's reach (its
        # read in the same poll), once; the rest waits for the next refresh.
        estimate_reach_s = cursor_s(meter, 1)
        assert reach_s <= estimate_reach_s <= clock.now_s
        assert [high for low, high in splits if high != reach_s] == [estimate_reach_s]
        clock.advance(0.005)
        contexts.append(meter.window("another"))
        contexts[-1].__enter__()  # a knot of the estimate at its start
        meter.poll()  # a pass with nothing new from the counter splits nothing of either
        assert cursor_s(meter, 1) == estimate_reach_s
    for context in contexts:
        context.__exit__(None, None, None)

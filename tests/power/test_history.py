"""A meter without history (a long-lived server): its knots stay bounded however many windows
it measures, every window's energy is what a meter with history gives, and total() refuses."""

from pathlib import Path

import pytest

from openjarvis.power.meter import Meter
from openjarvis.power.sources import EnergySource, ReadError
from openjarvis.power.track import Track
from tests.fakes.clock import FakeClock
from tests.fakes.nvml import FakeGpu, SteppingCounter, install_fake_nvml
from tests.fakes.sysfs import FakePowercap, one_socket
from tests.power.test_meter import spend

UUID = "GPU-aaaa1111-0000-0000-0000-000000000000"
WINDOWS = 2000


class Package:
    """A RAPL package at 50 W whose energy_uj file is rewritten every 10 ms of fake time (the
    real one every millisecond: rewriting it at every step of the clock makes the test slow)."""

    def __init__(self, tree: FakePowercap, clock: FakeClock) -> None:
        self.tree, self.written_s = tree, -1.0
        self.follow(clock.now_s)  # not the count a previous meter left there
        clock.hooks.append(self.follow)

    def follow(self, now_s: float) -> None:
        if now_s - self.written_s >= 0.01:
            self.tree.set_energy_uj("intel-rapl:0", round(50e6 * now_s))
            self.written_s = now_s


def serve_windows(
    monkeypatch: pytest.MonkeyPatch, tree: FakePowercap, *, keep_history: bool
) -> tuple[Meter, list[float | None], list[int]]:
    """WINDOWS requests one after another, each read as it closes (as `jarvis serve` does),
    over a GPU (a counter refreshing every 100 ms) and a RAPL package (read at the edges too);
    returns the meter, the energies and the meter's knot count after each window."""
    clock = FakeClock()
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID)])
    SteppingCounter(clock, fake.gpus[0], lambda t: 200.0 + 100.0 * (int(t * 7) % 3), phase_s=0.04)
    Package(tree, clock)
    meter = Meter.discover("system", clock=clock, sleep=clock.sleep, keep_history=keep_history)
    spend(meter, clock, 0.5)
    energies, knots = [], []
    for index in range(WINDOWS):
        with meter.window(f"request-{index}") as window:
            spend(meter, clock, 0.05 + 0.01 * (index % 7))
        energies.append(window.result.energy_j)
        spend(meter, clock, 0.02 * (index % 3))  # between requests
        knots.append(sum(len(track._knots) for track in meter._tracks))
    return meter, energies, knots


def test_without_history_knots_stay_bounded_and_windows_resolve_the_same(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    tree = one_socket(no_hardware)
    bounded, energies, knots = serve_windows(monkeypatch, tree, keep_history=False)
    kept, kept_energies, kept_knots = serve_windows(monkeypatch, tree, keep_history=True)
    assert None not in energies
    assert energies == kept_energies  # the very same numbers, window by window
    # The run lasts minutes; knots are kept only back to the oldest window not yet settled and
    # to what the accountant has split (a tail ends a second after its window at the latest).
    # So the knot count levels off within the first half, while with history it keeps growing.
    half = WINDOWS // 2
    assert max(knots[half:]) <= 1.1 * max(knots[:half])
    assert kept_knots[-1] > 1.8 * kept_knots[half - 1]
    assert max(knots) < kept_knots[-1] / 3
    assert not bounded._spans and not bounded._tails
    with pytest.raises(RuntimeError, match="keep_history=False"):
        bounded.total()
    assert kept.total().windows == WINDOWS  # the default meter still totals its run


def test_forgetting_keeps_the_knot_that_brackets_the_horizon_and_the_faults_after_it(
    clock: FakeClock,
) -> None:
    failing_at = {2, 7, 12}  # seconds after the first read

    class Counter(EnergySource):
        name, domain, method, reads = "fake:gpu", "gpu", "counter", "energy_j"
        update_period_s = sample_period_s = 1.0

        def read(self) -> float:
            if round(clock.now_s - 1000.0) in failing_at:
                raise ReadError("read-error", "a fake fault")
            return 10.0 * clock.now_s

    track = Track(Counter(), clock)
    for _ in range(13):  # a knot every second, but a fault at 2, 7 and 12 s
        track.advance()
        clock.advance(1.0)
    track.forget_before(1004.5)
    assert [k.time_s - 1000.0 for k in track._knots] == [4, 5, 6, 8, 9, 10, 11]
    assert [time_s - 1000.0 for time_s, _ in track._faults] == [7, 12]
    knots, fault = track.knots_around(1004.5, 1006.0)  # a bracket after the horizon still works
    assert ([k.time_s - 1000.0 for k in knots], fault) == ([4, 5, 6], None)
    assert track.knots_around(1006.5, 1008.0)[1] == "read-error"
    assert track.failing() == "read-error"  # failing since its last knot: still known

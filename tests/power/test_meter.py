"""The Meter over fake hardware: scopes, estimates, windows that never wait, overlap, idle, nulls,
traces."""

import threading
import time
from pathlib import Path

import pytest

from openjarvis.power.meter import Meter
from openjarvis.power.sources import EnergySource
from openjarvis.power.types import Scope, SourceEnergy
from tests.fakes.clock import FakeClock
from tests.fakes.nvml import FakeGpu, FakeNvml, SteppingCounter, install_fake_nvml
from tests.fakes.sysfs import FakePowercap, laptop_with_psys, one_socket, two_sockets

J = 1_000_000  # microjoules per joule
UUID_A = "GPU-aaaa1111-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbb2222-0000-0000-0000-000000000000"


def by_name(sources: tuple[SourceEnergy, ...], name: str) -> SourceEnergy:
    return next(source for source in sources if source.source == name)


def known(values: list[float | None]) -> list[float]:
    """The values, none of them None (asserted)."""
    assert None not in values
    return [value for value in values if value is not None]


def follow_power(clock: FakeClock, fake: FakeNvml, watts: dict[int, float]) -> None:
    """Make GPU i's energy counter grow at watts[i] as the fake clock moves (no refresh steps:
    for the trace tests, which read it once a second)."""

    def hook(now_s: float) -> None:
        del now_s
        for index, power_w in watts.items():
            fake.gpus[index].energy_mj = round(power_w * (clock.now_s - 1000.0) * 1000)

    clock.hooks.append(hook)


def spend(meter: Meter, clock: FakeClock, seconds: float) -> None:
    """Let `seconds` pass as the sampler thread would see them: reading each source when due."""
    end_s = clock.now_s + seconds
    while clock.now_s < end_s - 1e-12:
        delay_s = meter.poll()
        clock.advance(min(max(delay_s, 1e-4), end_s - clock.now_s))


@pytest.fixture
def server(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, clock: FakeClock
) -> tuple[FakeNvml, FakePowercap]:
    """Two GPUs whose counters refresh every 100 ms (300 W and 200 W), and two sockets."""
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID_A), FakeGpu(UUID_B)])
    SteppingCounter(clock, fake.gpus[0], lambda t: 300.0, phase_s=0.037)
    SteppingCounter(clock, fake.gpus[1], lambda t: 200.0, phase_s=0.081)
    return fake, two_sockets(no_hardware)


def run_server_window(
    meter: Meter, clock: FakeClock, fake: FakeNvml, tree: FakePowercap
) -> float | None:
    spend(meter, clock, 0.5)  # the sampler learns when each counter refreshes
    with meter.window("task") as window:
        spend(meter, clock, 2.0)  # the GPUs: 600 J + 400 J
        tree.set_energy_uj("intel-rapl:0", 100 * J)
        tree.set_energy_uj("intel-rapl:0:0", 80 * J)  # core: inside the package
        tree.set_energy_uj("intel-rapl:1", 90 * J)
        tree.set_energy_uj("intel-rapl:0:2", 20 * J)
        tree.set_energy_uj("intel-rapl:1:2", 10 * J)
    return window.result.energy_j


@pytest.mark.parametrize(("scope", "expected_j"), [("accelerator", 1000.0), ("system", 1220.0)])
def test_scope_sums(server: tuple, clock: FakeClock, scope: Scope, expected_j: float) -> None:
    fake, tree = server
    meter = Meter.discover(scope, clock=clock, sleep=clock.sleep)
    assert "estimate:cpu" not in [source.name for source in meter.sources]
    assert meter.method == "counter"
    assert run_server_window(meter, clock, fake, tree) == pytest.approx(expected_j)
    meter.close()


def test_psys_is_never_added_to_the_system_sum(no_hardware: Path, clock: FakeClock) -> None:
    tree = laptop_with_psys(no_hardware)
    meter = Meter.discover("system", clock=clock)
    with meter.window("task") as window:
        clock.advance(1.0)
        tree.set_energy_uj("intel-rapl:0", 7 * J)
        tree.set_energy_uj("intel-rapl:1", 30 * J)
    assert window.result.energy_j == pytest.approx(7.0)
    assert by_name(window.result.sources, "rapl:psys").energy_j == pytest.approx(30.0)


def test_estimate_stands_in_only_without_a_readable_cpu_counter(
    no_hardware: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    def names(estimate_cpu: bool = True) -> list[str]:
        meter = Meter.discover("system", clock=clock, estimate_cpu=estimate_cpu)
        return [source.name for source in meter.sources]

    assert names() == ["estimate:cpu"]
    assert names(estimate_cpu=False) == []
    tree = one_socket(no_hardware)
    assert names() == ["rapl:package-0"]
    tree.deny_read("intel-rapl:0")
    tree.install(monkeypatch)
    meter = Meter.discover("system", clock=clock)
    assert [source.name for source in meter.sources] == ["estimate:cpu"]
    unavailable = [s for s in meter.statuses if s.name.startswith(("nvml", "rapl"))]
    assert [(s.name, s.reason) for s in unavailable if not s.available] == [
        ("nvml", "unsupported"),
        ("rapl:package-0", "permission"),
    ]


def test_an_estimate_beside_a_measured_source_of_its_domain_is_refused(
    no_hardware: Path, clock: FakeClock
) -> None:
    one_socket(no_hardware)
    rapl_sources = list(Meter.discover("system", estimate_cpu=False).sources)
    estimate = list(Meter.discover("system", sysfs_root=no_hardware / "none").sources)
    with pytest.raises(ValueError, match="estimate"):
        Meter(rapl_sources + estimate, "system", clock=clock)


def test_accelerator_scope_without_gpus_is_none_no_device(
    no_hardware: Path, clock: FakeClock
) -> None:
    meter = Meter.discover("accelerator", clock=clock)
    with meter.window("task") as window:
        clock.advance(1.0)
    result = window.result
    assert (result.energy_j, result.null_reason, result.method) == (None, "no-device", None)
    assert meter.method is None
    assert Meter.discover("system", clock=clock).method == "estimate"
    assert by_name(result.sources, "estimate:cpu").energy_j is not None


@pytest.mark.parametrize(("seconds", "low_resolution"), [(0.02, True), (0.5, True), (2.0, False)])
def test_windows_close_at_once_and_resolve_from_the_refreshes(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, seconds: float, low_resolution: bool
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID_A)])
    SteppingCounter(clock, fake.gpus[0], lambda t: 100.0, phase_s=0.063)
    meter = Meter.discover("accelerator", sysfs_root="/nonexistent", clock=clock, sleep=clock.sleep)
    assert meter.resolution_s == pytest.approx(0.1)
    spend(meter, clock, 0.5)
    reads = fake.calls
    opened_s = clock.now_s
    with meter.window("task") as window:
        assert clock.now_s == opened_s  # opening waited for nothing
        clock.advance(seconds)
    assert clock.now_s == opened_s + seconds  # nor did closing: no sleep in the caller
    assert fake.calls == reads  # and NVML (milliseconds a call) is never read at the edges
    result = window.result  # waits, after the window, for the refresh past its end
    assert result.duration_s == pytest.approx(seconds)
    assert result.energy_j == pytest.approx(100.0 * seconds, rel=1e-6)
    assert (result.null_reason, result.low_resolution) == (None, low_resolution)


def test_a_counter_that_stops_refreshing_gives_none_not_a_stale_number(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID_A)])
    counter = SteppingCounter(clock, fake.gpus[0], lambda t: 100.0)
    meter = Meter.discover("accelerator", sysfs_root="/nonexistent", clock=clock, sleep=clock.sleep)
    spend(meter, clock, 0.5)
    with meter.window("task") as window:
        clock.hooks.remove(counter.follow)  # the counter freezes
        spend(meter, clock, 0.3)
    assert (window.result.energy_j, window.result.null_reason) == (None, "no-refresh")


def test_overlapping_windows_are_marked_and_counted_once_in_the_total(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID_A)])
    SteppingCounter(clock, fake.gpus[0], lambda t: 100.0, phase_s=0.02)
    meter = Meter.discover("accelerator", sysfs_root="/nonexistent", clock=clock, sleep=clock.sleep)
    spend(meter, clock, 0.5)
    first, second = meter.window("a"), meter.window("b")
    a = first.__enter__()
    spend(meter, clock, 1.0)
    b = second.__enter__()
    spend(meter, clock, 1.0)
    first.__exit__(None, None, None)
    spend(meter, clock, 1.0)
    second.__exit__(None, None, None)
    spend(meter, clock, 5.0)  # outside every window: not in the total (no idle: no tails)
    with meter.window("c") as c:
        spend(meter, clock, 1.0)
    energies = (a.result.energy_j, b.result.energy_j, c.result.energy_j)
    assert energies == pytest.approx((200.0, 200.0, 100.0), rel=1e-3)
    assert (a.result.overlapped, b.result.overlapped, c.result.overlapped) == (True, True, False)
    total = meter.total()
    assert total.energy_j == pytest.approx(400.0, rel=1e-3)
    assert (total.covered_s, total.windows) == pytest.approx((4.0, 3))


def test_concurrent_windows_from_threads_never_count_a_joule_twice() -> None:
    class HundredWatts(EnergySource):
        name, domain, method, reads = "fake:gpu", "gpu", "counter", "energy_j"
        update_period_s = sample_period_s = 0.0001

        def read(self) -> float:
            return 100.0 * time.monotonic()

    meter = Meter([HundredWatts()], "accelerator")

    def worker() -> None:
        for _ in range(20):
            with meter.window("w"):
                time.sleep(0.001)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = meter.total()
    assert total.windows == 80
    # Double counting would add the overlaps (4 threads): far beyond this tolerance.
    assert total.energy_j == pytest.approx(100.0 * total.covered_s, rel=0.01)


def test_idle_power_is_measured_and_subtracted(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID_A)])
    busy: list[tuple[float, float]] = []  # (start_s, end_s) at 300 W; 80 W otherwise
    SteppingCounter(
        clock, fake.gpus[0], lambda t: 300.0 if any(a <= t < b for a, b in busy) else 80.0
    )
    meter = Meter.discover(
        "accelerator", "/nonexistent", estimate_cpu=False, clock=clock, sleep=clock.sleep
    )
    spend(meter, clock, 0.5)
    with meter.window("before idle") as early:
        spend(meter, clock, 1.0)
    assert early.result.net_energy_j is None
    baseline = meter.measure_idle(3.0)
    # Refresh times are placed to within a few ms: over 3 s, a few tenths of a percent.
    assert baseline.power_w == {f"nvml:{UUID_A}": pytest.approx(80.0, rel=5e-3)}
    error_w = baseline.error_w[f"nvml:{UUID_A}"]
    assert error_w is not None and 0.0 <= error_w < 1.0
    assert baseline.seconds == pytest.approx(3.0)
    with meter.window("task") as window:
        busy.append((clock.now_s, clock.now_s + 2.0))
        spend(meter, clock, 2.0)
    spend(meter, clock, 1.0)
    meter.settle()
    settled = window.wait_settled()  # the tail too (result alone does not wait for it)
    (gpu,) = settled.sources
    # Within the idle baseline's own error (refresh times placed to a few ms over 3 s).
    assert gpu.energy_j == pytest.approx(600.0, rel=2e-3)
    assert gpu.idle_power_w == pytest.approx(80.0, rel=5e-3)
    assert gpu.net_energy_j == pytest.approx(440.0, rel=2e-3)
    assert settled.net_energy_j == gpu.net_energy_j
    assert settled.tail_energy_j == pytest.approx(0.0, abs=0.5)
    assert meter.total().net_energy_j == pytest.approx(440.0, rel=2e-3)


def test_one_failed_source_makes_the_sum_none_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID_A), FakeGpu(UUID_B)])
    SteppingCounter(clock, fake.gpus[0], lambda t: 25.0)
    SteppingCounter(clock, fake.gpus[1], lambda t: 25.0)
    meter = Meter.discover("accelerator", sysfs_root="/nonexistent", clock=clock, sleep=clock.sleep)
    spend(meter, clock, 0.5)
    with meter.window("task") as window:
        spend(meter, clock, 1.0)
        fake.gpus[1].lost = True
        spend(meter, clock, 1.0)
    result = window.result
    assert (result.energy_j, result.net_energy_j, result.null_reason) == (None, None, "vanished")
    assert result.method == "counter"
    assert by_name(result.sources, f"nvml:{UUID_A}").energy_j == pytest.approx(50.0, rel=1e-3)
    assert meter.total().energy_j is None
    assert meter.total().null_reason == "vanished"


def test_trace_records_mean_watts_and_drains(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID_A)])
    watts = {0: 100.0}
    follow_power(clock, fake, watts)
    meter = Meter.discover("accelerator", "/nonexistent", estimate_cpu=False, clock=clock)
    for _ in range(4):
        meter.poll()
        clock.advance(1.0)  # the counter is sampled every second, for the trace only
    samples = meter.drain_trace()
    assert [sample.power_w for sample in samples] == pytest.approx([100.0, 100.0, 100.0])
    assert [sample.source for sample in samples] == [f"nvml:{UUID_A}"] * 3
    assert meter.trace() == []


def test_trace_memory_is_bounded(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    install_fake_nvml(monkeypatch, [FakeGpu(UUID_A)])
    (gpu,) = Meter.discover("accelerator", "/nonexistent", estimate_cpu=False).sources
    meter = Meter([gpu], "accelerator", clock=clock, max_trace_samples=2)
    for _ in range(6):
        meter.poll()
        clock.advance(1.0)
    assert len(meter.trace()) == 2
    assert meter.dropped_samples == 3  # 5 samples, 2 kept


def test_the_sampler_thread_records_a_trace_and_close_releases_nvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID_A, energy_mj=None, power_mw=90_000)])
    with Meter.discover("accelerator", "/nonexistent", estimate_cpu=False) as meter:
        with meter.window("task") as window:
            time.sleep(1.1)  # over 10 update periods of 0.1 s
        assert meter.running
    assert not meter.running and fake.init_count == 0
    assert len(meter.trace()) >= 2
    assert window.result.energy_j == pytest.approx(90.0 * window.result.duration_s, rel=1e-3)
    assert not window.result.low_resolution


def test_a_sampler_that_dies_is_reported_not_ignored() -> None:
    class Broken(EnergySource):
        name, domain, method, reads = "fake:broken", "gpu", "counter", "energy_j"
        update_period_s = sample_period_s = 0.01

        def read(self) -> float:
            raise ZeroDivisionError("a bug, not a hardware problem")

    meter = Meter([Broken()], "accelerator", statuses=[])
    meter.start()
    time.sleep(0.05)
    with pytest.raises(RuntimeError, match="sampler"):
        meter.stop()


def test_an_exception_in_the_window_still_leaves_a_result(
    no_hardware: Path, clock: FakeClock
) -> None:
    meter = Meter.discover("system", clock=clock)
    with pytest.raises(KeyError), meter.window("task") as window:
        clock.advance(1.0)
        raise KeyError("engine failed")
    assert window.result.duration_s == 1.0
    with pytest.raises(RuntimeError, match="still open"), meter.window("open") as open_window:
        open_window.result  # noqa: B018 - reading it is the test


def test_a_result_awaited_when_the_sampler_dies_raises_instead_of_hanging() -> None:
    """Results are published by the sampler's thread: a waiter whose sampler died is told."""

    class BreaksLater(EnergySource):
        name, domain, method, reads = "fake:breaks", "gpu", "counter", "energy_j"
        update_period_s = sample_period_s = 0.01
        edge_reads = False  # read by the sampler only
        broken = False

        def read(self) -> float:
            if self.broken:
                raise ZeroDivisionError("a bug, not a hardware problem")
            return 100.0 * time.monotonic()

    source = BreaksLater()
    meter = Meter([source], "accelerator", statuses=[])
    meter.start()
    with meter.window("task") as window:
        source.broken = True  # the sampler dies before the counter passes the window's end
    started_s = time.monotonic()
    with pytest.raises(RuntimeError, match="sampler"):
        window.result  # noqa: B018 - reading it is the test
    assert time.monotonic() - started_s < 5.0

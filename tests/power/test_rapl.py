"""RAPL over fake powercap trees: zones chosen, sockets, psys, wraps, permission, vanishing."""

from pathlib import Path

import pytest

from openjarvis.power.meter import Meter
from openjarvis.power.rapl import RaplZone, discover_rapl
from openjarvis.power.sources import ReadError
from openjarvis.power.track import Track
from openjarvis.power.types import SourceEnergy
from tests.fakes.clock import FakeClock
from tests.fakes.sysfs import (
    DEFAULT_RANGE_UJ,
    FakePowercap,
    laptop_with_psys,
    one_socket,
    two_sockets,
)

J = 1_000_000  # microjoules per joule


def by_name(sources: tuple[SourceEnergy, ...], name: str) -> SourceEnergy:
    return next(source for source in sources if source.source == name)


def test_one_socket_reads_the_package_in_joules(tmp_path: Path) -> None:
    tree = one_socket(tmp_path)
    tree.set_energy_uj("intel-rapl:0", 5_250_000)
    found = discover_rapl(tmp_path)
    assert [source.name for source in found.sources] == ["rapl:package-0"]
    package = found.sources[0]
    assert (package.domain, package.method) == ("cpu", "counter")
    assert package.read() == 5.25
    assert package.wrap_j == DEFAULT_RANGE_UJ / 1e6
    assert [status.available for status in found.statuses] == [True]


def test_two_sockets_add_packages_and_dram_but_never_core_or_uncore(
    tmp_path: Path, clock: FakeClock
) -> None:
    tree = two_sockets(tmp_path)
    found = discover_rapl(tmp_path)
    names = {source.name: source.domain for source in found.sources}
    assert names == {
        "rapl:package-0": "cpu",
        "rapl:dram-0": "dram",
        "rapl:package-1": "cpu",
        "rapl:dram-1": "dram",
    }
    meter = Meter(found.sources, "system", clock=clock)
    with meter.window("task") as window:
        clock.advance(1.0)
        for zone, joules in [("0", 10), ("0:0", 7), ("0:1", 2), ("0:2", 3), ("1", 20), ("1:2", 4)]:
            tree.set_energy_uj(f"intel-rapl:{zone}", joules * J)
    assert window.result.energy_j == pytest.approx(37.0, abs=1e-9)  # 10 + 3 + 20 + 4
    assert by_name(window.result.sources, "rapl:dram-1").energy_j == pytest.approx(4.0)


def test_psys_is_reported_alone_and_the_mmio_duplicate_is_skipped(
    tmp_path: Path, clock: FakeClock
) -> None:
    tree = laptop_with_psys(tmp_path)
    found = discover_rapl(tmp_path)
    assert [(s.name, s.domain) for s in found.sources] == [
        ("rapl:package-0", "cpu"),
        ("rapl:psys", "platform"),
    ]
    meter = Meter(found.sources, "system", clock=clock)
    with meter.window("task") as window:
        clock.advance(1.0)
        tree.set_energy_uj("intel-rapl:0", 10 * J)
        tree.set_energy_uj("intel-rapl:1", 50 * J)
    assert window.result.energy_j == pytest.approx(10.0)
    assert by_name(window.result.sources, "rapl:psys").energy_j == pytest.approx(50.0)


def _wrapping_meter(tmp_path: Path, clock: FakeClock, range_j: int) -> tuple[FakePowercap, Meter]:
    tree = FakePowercap(tmp_path)
    tree.add_zone("intel-rapl:0", "package-0", 900 * J, max_energy_range_uj=range_j * J)
    return tree, Meter(discover_rapl(tmp_path).sources, "system", clock=clock)


def test_one_wrap_is_unwrapped(tmp_path: Path, clock: FakeClock) -> None:
    tree, meter = _wrapping_meter(tmp_path, clock, range_j=1000)
    with meter.window("task") as window:
        clock.advance(0.5)
        tree.set_energy_uj("intel-rapl:0", 5 * J)
    assert window.result.energy_j == pytest.approx(105.0)  # 900 -> 1000 = 0 -> 5


def test_three_wraps_in_one_window_with_the_sampler_reading_between(
    tmp_path: Path, clock: FakeClock
) -> None:
    tree, meter = _wrapping_meter(tmp_path, clock, range_j=1000)
    with meter.window("long") as window:
        for value_j in [300, 800, 200, 700, 100]:  # wraps after 900, 800 and 700
            clock.advance(0.4)
            tree.set_energy_uj("intel-rapl:0", value_j * J)
            meter.poll()
        clock.advance(0.4)
        tree.set_energy_uj("intel-rapl:0", 150 * J)
    assert window.result.energy_j == pytest.approx(400 + 500 + 400 + 500 + 400 + 50)


def test_sampler_reads_twice_per_shortest_wrap_period(tmp_path: Path, clock: FakeClock) -> None:
    _, meter = _wrapping_meter(tmp_path, clock, range_j=100)
    zone = meter.sources[0]
    assert zone.max_read_interval_s == pytest.approx(0.1)  # 100 J at 1000 W
    assert Track(zone, clock).sample_period_s == pytest.approx(0.05)


def test_reads_too_far_apart_to_count_wraps_give_none(tmp_path: Path, clock: FakeClock) -> None:
    tree, meter = _wrapping_meter(tmp_path, clock, range_j=1000)
    with meter.window("unsampled") as window:
        clock.advance(2.0)  # over 1 s: the counter might have wrapped twice unseen
        tree.set_energy_uj("intel-rapl:0", 950 * J)
    assert window.result.energy_j is None
    assert window.result.null_reason == "missed-wrap"


def test_permission_denied_is_reported_with_the_fix_never_as_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = one_socket(tmp_path)
    tree.deny_read("intel-rapl:0")
    tree.install(monkeypatch)
    found = discover_rapl()  # from $OPENJARVIS_SYSFS_ROOT
    assert found.sources == ()
    (status,) = found.statuses
    assert (status.name, status.available, status.reason) == ("rapl:package-0", False, "permission")
    assert status.detail is not None
    assert f"sudo chmod o+r {tmp_path}/class/powercap/intel-rapl:*/energy_uj" in status.detail
    zone = RaplZone("rapl:package-0", "cpu", tree.class_dir / "intel-rapl:0", 1000.0)
    with pytest.raises(ReadError) as raised:
        zone.read()
    assert raised.value.reason == "permission"


def test_a_zone_that_disappears_gives_none_for_it_and_numbers_for_the_rest(
    tmp_path: Path, clock: FakeClock
) -> None:
    tree = two_sockets(tmp_path)
    meter = Meter(discover_rapl(tmp_path).sources, "system", clock=clock)
    with meter.window("task") as window:
        clock.advance(1.0)
        tree.set_energy_uj("intel-rapl:0", 10 * J)
        tree.remove_zone("intel-rapl:1")
        meter.poll()
    result = window.result
    assert (result.energy_j, result.null_reason) == (None, "vanished")
    assert by_name(result.sources, "rapl:package-0").energy_j == pytest.approx(10.0)
    assert by_name(result.sources, "rapl:package-1").null_reason == "vanished"
    assert by_name(result.sources, "rapl:dram-1").null_reason == "vanished"


def test_garbage_in_energy_uj_is_a_read_error(tmp_path: Path) -> None:
    tree = one_socket(tmp_path)
    (tree.class_dir / "intel-rapl:0" / "energy_uj").write_text("not a number\n")
    (status,) = discover_rapl(tmp_path).statuses
    assert (status.available, status.reason) == (False, "read-error")


def test_no_powercap_tree_says_no_device(tmp_path: Path) -> None:
    (status,) = discover_rapl(tmp_path).statuses
    assert (status.name, status.available, status.reason) == ("rapl", False, "no-device")
    assert status.detail is not None and "intel_rapl_msr" in status.detail

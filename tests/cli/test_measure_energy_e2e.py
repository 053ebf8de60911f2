"""`ipw measure` end to end against a counter whose power is known: the real embedded model and
meter over a fake RAPL tree whose package draws 20 W (its core zone, inside it, 12 W) and DRAM
5 W, refreshed every 2 ms. Every task's energy must be 25 W times its windows' time: adding the
core zone to its package (37 W), or a window counted twice (50 W), gives another number.

The counter is a function of the clock at the moment it is read, stepping every 2 ms as the
hardware's does whatever the machine is doing (a writer thread was late by tens of milliseconds
on a busy two-core machine, and a task of 0.1 s then drew 20 % more than its power). The 10 %
allowed covers the 2 ms steps at a window's two ends and the meter's placing of them."""

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from openjarvis.evals.config import RunConfig, prepare
from openjarvis.evals.runner import run_measure
from openjarvis.evals.suites import SuiteConfig
from openjarvis.power import rapl
from openjarvis.store import open_store
from tests.fakes.nvml import install_fake_nvml
from tests.fakes.sysfs import FakePowercap

pytestmark = pytest.mark.e2e

PACKAGE_W, CORE_W, DRAM_W = 20.0, 12.0, 5.0
REFRESH_S = 0.002
TOLERANCE = 0.1
ZONES = {"intel-rapl:0": PACKAGE_W, "intel-rapl:0:0": CORE_W, "intel-rapl:0:2": DRAM_W}
SUITE = "\n".join(
    f'{{"task_id": "sum{i}", "kind": "exact_match", "prompt": "Question: What is {i} + {i}?'
    f'\\nAnswer:", "answer": {2 * i}, "normalize": ["number"], "max_tokens": 8}}'
    for i in range(1, 4)
)


def _fake_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePowercap:
    """The fake tree in place of /sys, and no GPU."""
    tree = FakePowercap(tmp_path / "sys")
    tree.add_zone("intel-rapl:0", "package-0")
    tree.add_zone("intel-rapl:0:0", "core")
    tree.add_zone("intel-rapl:0:2", "dram")
    monkeypatch.setenv(rapl.SYSFS_ROOT_ENV, str(tree.sysfs_root))
    install_fake_nvml(monkeypatch, [])
    return tree


def _energy_uj(power_w: float, since_s: float) -> str:
    """A counter of `power_w` started at `since_s`, now, in whole refreshes."""
    refreshed_s = (time.monotonic() - since_s) // REFRESH_S * REFRESH_S
    return f"{round(power_w * refreshed_s * 1e6)}\n"


@pytest.fixture
def steady_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each zone's energy_uj answers, when this process reads it, its power times the time
    since the start."""
    _fake_machine(tmp_path, monkeypatch)
    started_s = time.monotonic()
    read_file = rapl.read_sysfs

    def read_counter(path: Path, permission_fix: str) -> bytes:
        power_w = ZONES.get(path.parent.name)
        if path.name != "energy_uj" or power_w is None:
            return read_file(path, permission_fix)
        return _energy_uj(power_w, started_s).encode()

    monkeypatch.setattr(rapl, "read_sysfs", read_counter)


@pytest.fixture
def steady_machine_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The same counters for a command in another process: a thread writes each file whole
    (as the kernel's reads) every refresh. It can be late on a busy machine, so only tasks of
    seconds, where that lateness is small, are judged by it."""
    tree = _fake_machine(tmp_path, monkeypatch)
    started_s = time.monotonic()
    stop = threading.Event()

    def advance() -> None:
        while not stop.wait(REFRESH_S):
            for zone, power_w in ZONES.items():
                counter = tree.class_dir / zone / "energy_uj"
                fresh = counter.with_name("energy_uj.new")
                fresh.write_text(_energy_uj(power_w, started_s))
                os.replace(fresh, counter)

    writer = threading.Thread(target=advance, daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


@pytest.mark.usefixtures("steady_machine")
def test_each_task_draws_the_known_power_over_its_windows(tmp_path: Path) -> None:
    suite = tmp_path / "sums.jsonl"
    suite.write_text(SUITE + "\n", encoding="utf-8")
    db = str(tmp_path / "runs.db")
    config = RunConfig(suite=SuiteConfig(str(suite), limit=None), idle_seconds=1.0)
    result = run_measure(prepare(config), db)
    with open_store(db) as store:
        run = store.get_run(result.run_id)
        tasks = store.task_results(result.run_id)
    assert run.energy_method == "counter"
    assert run.idle_power_w == {
        "rapl:package-0": pytest.approx(PACKAGE_W, rel=TOLERANCE),
        "rapl:dram-0": pytest.approx(DRAM_W, rel=TOLERANCE),
    }
    assert len(tasks) == 3
    for task in tasks:
        assert task.latency_s > 0.05
        by_source = {reading.source: reading.energy_j for reading in task.energy}
        assert set(by_source) == {"rapl:package-0", "rapl:dram-0"}  # the core zone is inside
        seconds = task.latency_s
        assert by_source["rapl:package-0"] == pytest.approx(PACKAGE_W * seconds, rel=TOLERANCE)
        assert by_source["rapl:dram-0"] == pytest.approx(DRAM_W * seconds, rel=TOLERANCE)
        assert task.energy_j == pytest.approx((PACKAGE_W + DRAM_W) * seconds, rel=TOLERANCE)
        # Power never rose above idle: nothing is left after idle is taken off, nor in a tail.
        assert task.net_energy_j is not None and task.energy_j is not None
        assert abs(task.net_energy_j) < TOLERANCE * task.energy_j
        assert task.tail_energy_j is not None
        assert abs(task.tail_energy_j) < TOLERANCE * task.energy_j
    # The run's mean power is the machine's, and its windows add up to the counters.
    mean_j = sum(t.energy_j for t in tasks if t.energy_j is not None) / 3
    assert result.figures.mean_energy_j.value == pytest.approx(mean_j, rel=1e-6)
    assert result.conservation["ratio"] == pytest.approx(1.0, abs=0.01)

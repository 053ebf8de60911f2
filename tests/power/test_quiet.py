"""The busy-machine check (power/quiet.py): another process burning a core, and other
processes on a metered GPU (fake NVML, the only fake), are found and given as evidence."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from openjarvis.power.estimate import CpuEstimate, busy_cpu_s, power_model
from openjarvis.power.nvml import discover_nvml
from openjarvis.power.quiet import (
    MATERIAL_OTHER_CORES,
    Activity,
    check_machine,
    watching,
)
from openjarvis.power.types import IdleBaseline
from tests.fakes.nvml import FakeGpu, install_fake_nvml

__all__: list[str] = []


@pytest.fixture
def burner() -> Iterator[int]:
    """Another program keeping one core busy: started through a shell that exits at once, so
    it is no child of this process (as another user's job would not be)."""
    started = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(started.stdout.strip())
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGKILL)


def test_another_process_burning_a_core_is_evidence_of_a_busy_machine(burner: int) -> None:
    assert burner not in {child.pid for child in psutil.Process().children(recursive=True)}
    with watching("tasks", []) as watch:
        time.sleep(1.5)
    activity = watch.activity
    assert activity is not None and activity.other_cores is not None
    assert activity.other_cores >= MATERIAL_OTHER_CORES
    check = check_machine([activity], None, [])
    assert check.busy
    assert check.evidence[0].startswith("other processes kept ")
    assert "busy during the tasks" in check.evidence[0]
    stored = check.to_dict()
    assert stored["busy"] is True and stored["evidence"] == list(check.evidence)


def test_this_process_working_is_not_another_process() -> None:
    """Our own CPU time is ours: a watch over this process spinning does not blame others for
    it (others' share is the machine's busy time less ours)."""
    machine_s = busy_cpu_s(psutil.cpu_times())
    with watching("tasks", []) as watch:
        spun_s = time.process_time()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            pass
        spun_s = time.process_time() - spun_s
    machine_s = busy_cpu_s(psutil.cpu_times()) - machine_s
    activity = watch.activity
    assert activity is not None and activity.other_cpu_s is not None
    # The machine's busy time over the watch, less ours (within the counters' 10 ms ticks).
    assert spun_s > 0.1
    assert activity.other_cpu_s <= machine_s - spun_s + 0.1


def test_a_live_child_working_is_ours_not_another_process() -> None:
    """A child that works through the watch and is still running at its end (as a GPU engine's
    core process does) is this run's own work, not a busy machine's."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass",
        ]
    )
    try:
        machine_s = busy_cpu_s(psutil.cpu_times())
        with watching("tasks", []) as watch:
            time.sleep(1.5)
        machine_s = busy_cpu_s(psutil.cpu_times()) - machine_s
        assert child.poll() is None  # still running at the watch's end
    finally:
        child.kill()
        child.wait()
    activity = watch.activity
    assert activity is not None and activity.other_cpu_s is not None
    assert machine_s > 1.0  # the child did burn a core meanwhile
    assert activity.other_cpu_s <= machine_s - 1.0 + 0.2


def test_other_processes_on_a_metered_gpu_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    other = psutil.Process().parent()
    assert other is not None
    gpu = FakeGpu("GPU-aaaa1111-0000-0000-0000-000000000000")
    install_fake_nvml(monkeypatch, [gpu])
    sources = discover_nvml(None).sources
    # This process, a visible other one, and a pid this process cannot see (another container).
    gpu.processes = [os.getpid(), other.pid, 4_000_000]
    with watching("idle", sources) as watch:
        pass
    activity = watch.activity
    assert activity is not None
    assert activity.other_gpu_pids == (other.pid,)
    assert activity.unseen_gpu_pids == (4_000_000,)
    assert f"other processes on the metered GPUs during the idle: {other.pid}" in (
        activity.evidence()
    )
    for source in sources:
        source.close()


def test_an_idle_baseline_well_above_the_models_idle_is_evidence() -> None:
    source = CpuEstimate(power_model("AMD EPYC 7B13", 2))
    model_w = source.model.idle_power_w
    quiet_idle = IdleBaseline(10.0, {source.name: model_w * 1.1})
    busy_idle = IdleBaseline(10.0, {source.name: model_w * 3})
    calm = Activity("idle", 10.0, 0.1)
    assert not check_machine([calm], quiet_idle, [source]).busy
    (line,) = check_machine([calm], busy_idle, [source]).evidence
    assert line == (
        f"idle baseline of estimate:cpu {model_w * 3:.3g} W against the model's "
        f"{model_w:.3g} W idle"
    )

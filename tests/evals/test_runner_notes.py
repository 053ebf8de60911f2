"""The note `ipw measure` prints under its figures: why energy is estimated or missing, and how
many tasks' energy could not be measured (a run total with an unknown task is unknown)."""

from types import SimpleNamespace

from openjarvis.evals.run_energy import energy_note, estimated_window
from openjarvis.power.types import WindowEnergy
from openjarvis.records import TaskResultRecord
from openjarvis.runtime.types import Completion, EnergyEstimate


def _task(task_id: str, energy_j: float | None, reason: str | None = None) -> TaskResultRecord:
    return TaskResultRecord(
        task_id=task_id, samples=1, passed=0, latency_s=0.1, ttft_s=0.01,
        decode_tokens_per_s=100.0, prompt_tokens=10, completion_tokens=9, energy_j=energy_j,
        net_energy_j=None, energy_null_reason=reason, completions=("x",), statuses=("failed",),
    )  # fmt: skip


def test_measured_run_with_every_task_known_has_no_note() -> None:
    meter, engine = SimpleNamespace(method="counter"), SimpleNamespace(kind="torch")
    assert energy_note(meter, engine, [_task("a", 5.0), _task("b", 6.0)]) is None  # type: ignore[arg-type]  # namespaces stand in for the meter and engine


def test_tasks_without_energy_are_counted_with_their_reasons() -> None:
    meter, engine = SimpleNamespace(method="counter"), SimpleNamespace(kind="torch")
    tasks = [_task("a", 5.0), _task("b", None, "window-too-short"), _task("c", None, "read-error")]
    tasks.append(_task("d", None, "window-too-short"))
    note = energy_note(meter, engine, tasks)  # type: ignore[arg-type]  # namespaces stand in for the meter and engine
    assert note == (
        "energy unknown for 3 of 4 tasks (2 window-too-short, 1 read-error), "
        "so the run's energy figures are null"
    )


def test_an_estimate_says_so_beside_the_unknown_tasks() -> None:
    meter, engine = SimpleNamespace(method="estimate"), SimpleNamespace(kind="llamacpp")
    note = energy_note(meter, engine, [_task("a", None, "read-error")])  # type: ignore[arg-type]  # namespaces stand in for the meter and engine
    assert note is not None
    assert note.startswith("energy is an estimate from CPU utilisation")
    assert "energy unknown for 1 of 1 tasks (1 read-error)" in note


def test_a_cloud_estimate_has_no_time_split_of_this_machines_draw() -> None:
    """The window around a cloud reply measured this machine (idle, mostly); its estimate is
    tokens times the table's joules. The window's split at the first token and its tail are
    this machine's and are not carried over to the estimate, which the table does not split."""
    local = WindowEnergy(
        label="t#0",
        start_s=0.0,
        end_s=2.0,
        scope="system",
        method="counter",
        energy_j=30.0,
        net_energy_j=4.0,
        null_reason=None,
        sources=(),
        tail_energy_j=1.0,
        prefill_energy_j=12.0,  # by time: this machine's draw until the first token
        decode_energy_j=18.0,
    )
    estimate = EnergyEstimate("estimate:cloud:frontier", 9.0, "test constants")
    reply = Completion("hi", 100, 20, "stop", 2.0, 0.5, 1.5, energy_estimate=estimate)
    window = estimated_window(local, reply)
    assert (window.energy_j, window.method, window.net_energy_j) == (9.0, "estimate", None)
    assert (window.prefill_energy_j, window.decode_energy_j, window.tail_energy_j) == (
        None,
        None,
        None,
    )

"""The note `ipw measure` prints under its figures: why energy is estimated or missing, and how
many tasks' energy could not be measured (a run total with an unknown task is unknown)."""

from types import SimpleNamespace

from openjarvis.evals.run_energy import energy_note
from openjarvis.records import TaskResultRecord


def _task(task_id: str, energy_j: float | None, reason: str | None = None) -> TaskResultRecord:
    return TaskResultRecord(
        task_id=task_id, samples=1, passed=0, latency_s=0.1, ttft_s=0.01,
        decode_tokens_per_s=100.0, prompt_tokens=10, completion_tokens=9, energy_j=energy_j,
        net_energy_j=None, energy_null_reason=reason, completions=("x",), statuses=("failed",),
    )  # fmt: skip


def test_measured_run_with_every_task_known_has_no_note() -> None:
    meter, engine = SimpleNamespace(method="counter"), SimpleNamespace(kind="torch")
    assert energy_note(meter, engine, [_task("a", 5.0), _task("b", 6.0)]) is None  # type: ignore[arg-type]


def test_tasks_without_energy_are_counted_with_their_reasons() -> None:
    meter, engine = SimpleNamespace(method="counter"), SimpleNamespace(kind="torch")
    tasks = [_task("a", 5.0), _task("b", None, "window-too-short"), _task("c", None, "read-error")]
    tasks.append(_task("d", None, "window-too-short"))
    note = energy_note(meter, engine, tasks)  # type: ignore[arg-type]
    assert note == (
        "energy unknown for 3 of 4 tasks (2 window-too-short, 1 read-error), "
        "so the run's energy figures are null"
    )


def test_an_estimate_says_so_beside_the_unknown_tasks() -> None:
    meter, engine = SimpleNamespace(method="estimate"), SimpleNamespace(kind="llamacpp")
    note = energy_note(meter, engine, [_task("a", None, "read-error")])  # type: ignore[arg-type]
    assert note is not None
    assert note.startswith("energy is an estimate from CPU utilisation")
    assert "energy unknown for 1 of 1 tasks (1 read-error)" in note

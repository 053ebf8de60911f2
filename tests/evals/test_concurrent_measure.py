"""`ipw measure --concurrency N`: tasks in flight at once through a batching engine, each in its
own window, sharing the energy by the work each did; the shares add up to the union of the
windows, the run's exact J/task is the union over the tasks, and interrupting keeps what was
finished. Faked at the edges only: a batching engine with scripted replies (its steps drive the
board's power) and NVML (its counter refreshes every 100 ms, as on an H200)."""

import _thread
import gc
import io
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from openjarvis.cli.ipw import app
from openjarvis.cli.summary import print_summary, summary_dict
from openjarvis.errors import RunInterrupted, UserError
from openjarvis.evals import config, runner
from openjarvis.evals.config import RunConfig, prepare
from openjarvis.evals.runner import MeasureResult, resume_measure, run_measure
from openjarvis.evals.suites import SuiteConfig, load_suite, reference_solutions
from openjarvis.power import rapl
from openjarvis.runtime.ledger import StepLedger
from openjarvis.runtime.types import (
    Completion,
    GenerationRequest,
    Request,
    StreamChunk,
    WorkPiece,
)
from openjarvis.store import open_store
from tests.fakes.nvml import FakeGpu, install_fake_nvml

__all__: list[str] = []

UUID = "GPU-aaaa1111-0000-0000-0000-000000000000"
IDLE_W, TOKEN_W, STEP_S, REFRESH_S = 100.0, 50.0, 0.01, 0.1
SUITE = "humaneval"


class Board:
    """The GPU's power: idle, plus TOKEN_W per sequence in the engine's current step."""

    def __init__(self) -> None:
        self.origin_s = time.monotonic()
        self.steps: list[list[float]] = []  # [start, end, tokens]; end inf while running
        self.lock = threading.Lock()

    def energy_j(self, time_s: float) -> float:
        with self.lock:
            steps = [tuple(step) for step in self.steps]
        busy_j = sum(
            TOKEN_W * tokens * max(0.0, min(end, time_s) - start) for start, end, tokens in steps
        )
        return IDLE_W * (time_s - self.origin_s) + busy_j


class LiveGpu(FakeGpu):
    """A fake GPU whose counter follows the board in real time, refreshed every 100 ms."""

    board: Board

    @property
    def energy_mj(self) -> int:
        now_s = time.monotonic()
        refreshed_s = now_s - (now_s - self.board.origin_s) % REFRESH_S
        return round(self.board.energy_j(refreshed_s) * 1000)

    @energy_mj.setter
    def energy_mj(self, value: int) -> None:
        del value  # FakeGpu's __init__ sets it; the board decides


def _prompt_of(request: Request) -> str:
    """The text the scripted replies are keyed by: the prompt, or the last chat message."""
    if isinstance(request, GenerationRequest):
        return request.prompt
    return request.messages[-1].content


class Sequence:
    def __init__(self, text: str, tokens: int) -> None:
        self.text, self.left = text, tokens
        self.start_s = time.monotonic()
        self.first_token_s: float | None = None
        self.pieces: list[WorkPiece] = []
        self.followed = False
        self.done = threading.Event()
        self.completion: Completion | None = None


class BatchingEngine:
    """Runs every sequence in flight in one decode step of STEP_S; replies are scripted: the
    reference solution for even tasks, a wrong body for odd ones, 20 to 40 tokens long."""

    kind = "torch"
    model_name = "fake-batching"
    devices = (0,)

    def __init__(self, board: Board, concurrency: int = 4) -> None:
        self.board = board
        self.concurrency = concurrency
        tasks = load_suite(SUITE)
        solutions = reference_solutions(SUITE)
        self.replies = {
            task.prompt: (solutions[task.task_id] if i % 2 == 0 else "    return None\n", 20 + i)
            for i, task in enumerate(tasks[:20])
        }
        self.batches: list[int] = []
        self._active: list[Sequence] = []
        self._wake = threading.Condition()
        self._closed = True
        self._thread = threading.Thread()
        self.ledger = StepLedger()  # the engine's record of its steps, for the meter

    def open(self) -> "BatchingEngine":
        """Start the engine's loop (again, for a resumed run)."""
        assert self._closed
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def settings_dict(self) -> dict[str, object]:
        return {"fake": "batching"}

    def generate(self, request: Request) -> Completion:
        prompt = _prompt_of(request)
        text, tokens = self.replies[prompt]
        sequence = Sequence(text, tokens)
        sequence.followed = self.ledger.attach(request.ledger_key, sequence.pieces)
        with self._wake:
            self._active.append(sequence)
            self._wake.notify()
        sequence.done.wait()
        assert sequence.completion is not None
        return sequence.completion

    def stream(self, request: Request) -> Generator[StreamChunk]:
        completion = self.generate(request)
        yield StreamChunk(completion.text, time.monotonic(), completion)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._wake:
                if not self._active:
                    self.ledger.idle()
                while not self._active and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                batch = list(self._active)
            self.ledger.busy()
            step = [time.monotonic(), math.inf, float(len(batch))]
            with self.board.lock:
                self.board.steps.append(step)
            time.sleep(STEP_S)
            end_s = time.monotonic()
            with self.board.lock:
                step[1] = end_s
            self.batches.append(len(batch))
            for sequence in batch:
                sequence.pieces.append(WorkPiece(step[0], end_s, 1 / len(batch), len(batch)))
                sequence.first_token_s = sequence.first_token_s or end_s
                sequence.left -= 1
                if sequence.left == 0:
                    self._finish(sequence, end_s)
            followed = sum(1 / len(batch) for sequence in batch if sequence.followed)
            self.ledger.landed(step[0], end_s, followed)

    def _finish(self, sequence: Sequence, end_s: float) -> None:
        assert sequence.first_token_s is not None
        sequence.completion = Completion(
            text=sequence.text,
            prompt_tokens=100,
            completion_tokens=len(sequence.pieces),
            finish_reason="stop",
            wall_s=end_s - sequence.start_s,
            ttft_s=sequence.first_token_s - sequence.start_s,
            decode_s=end_s - sequence.first_token_s,
            work=tuple(sequence.pieces),
        )
        with self._wake:
            self._active.remove(sequence)
        sequence.done.set()


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[BatchingEngine]:
    """The batching engine in place of the torch engine, and a fake NVML over its board."""
    board = Board()
    gpu = LiveGpu(UUID)
    gpu.board = board
    install_fake_nvml(monkeypatch, [gpu])
    (tmp_path / "sys" / "class" / "powercap").mkdir(parents=True)
    monkeypatch.setenv(rapl.SYSFS_ROOT_ENV, str(tmp_path / "sys"))
    fake = BatchingEngine(board)
    monkeypatch.setattr(config, "resolve_engine_model", lambda spec: None)
    monkeypatch.setattr(runner, "open_engine", lambda spec, model: fake.open())
    yield fake
    fake.close()


def row(table: str, field: str) -> str:
    """A row of a two-column Rich table, as `field │ value` without the borders."""
    line = next(line for line in table.splitlines() if line.strip("│┃ ").startswith(f"{field} "))
    return " ".join(line.strip("│ ").split())


def measure(
    tmp_path: Path,
    limit: int = 8,
    on_task: runner.ProgressCallback | None = None,
    **changes: object,
) -> MeasureResult:
    """`ipw measure --engine torch --scope accelerator --concurrency 4 --limit 8` on the fakes."""
    settings: dict[str, Any] = {
        "suite": SuiteConfig(SUITE, limit=limit),
        "engine": "torch",
        "scope": "accelerator",
        "idle_seconds": 0.5,
        "concurrency": 4,
    }
    settings.update(changes)
    run_config = RunConfig(**settings)
    prepared = prepare(run_config)
    if on_task is None:
        return run_measure(prepared, str(tmp_path / "runs.db"))
    return run_measure(prepared, str(tmp_path / "runs.db"), on_task=on_task)


def test_tasks_in_flight_share_the_energy_and_add_up_to_the_union(
    engine: BatchingEngine, tmp_path: Path
) -> None:
    result = measure(tmp_path)
    assert max(engine.batches) == 4  # four sequences did run in one step
    # Hardware the fake machine lacks (AMD, Apple, Jetson) is no news in the summary.
    assert result.unavailable_sources == []
    with open_store(str(tmp_path / "runs.db")) as store:
        run = store.get_run(result.run_id)
        tasks = store.task_results(result.run_id)
    assert run.concurrency == 4 and run.config is not None and run.config["concurrency"] == 4
    assert len(tasks) == 8 and sum(t.passed for t in tasks) == 4  # the even tasks' replies pass
    # A task is shared when it ran beside another (on a busy machine one may run alone for a
    # moment, so not every task need be); one that shared ran at a batch above 1.
    shared = [t for t in tasks if t.shared]
    assert [t.shared for t in tasks] == [t.overlapped for t in tasks] and len(shared) >= 6
    assert all(t.mean_batch is not None and t.mean_batch > 1 for t in shared)
    assert result.window_flags["overlapped"] == 0  # split by work, not by time: nothing to flag
    # The tasks' shares add up to the union of their windows (conservation), gross and net.
    assert result.conservation["ratio"] == pytest.approx(1.0, abs=0.01)
    figures = result.concurrency
    assert figures["concurrency"] == 4 and figures["shared_tasks"] == len(shared)
    energies = [t.energy_j for t in tasks if t.energy_j is not None]
    assert len(energies) == len(tasks)
    assert sum(energies) == pytest.approx(figures["union_energy_j"], rel=0.01)
    # The exact J/task is the union over the tasks; the mean of the shares agrees with it.
    assert figures["joules_per_task"] == pytest.approx(result.figures.mean_energy_j.value, rel=0.01)
    assert figures["net_joules_per_task"] == pytest.approx(
        result.figures.mean_net_energy_j.value, rel=0.01
    )
    # The union is what the board drew above idle over the run.
    assert figures["union_net_energy_j"] == pytest.approx(
        sum(TOKEN_W * tokens * (end - start) for start, end, tokens in engine.board.steps),
        rel=0.01,
    )
    assert summary_dict(result)["concurrency"] == figures  # --json carries it
    assert run.summary is not None and run.summary["concurrency"] == figures  # ipw show reads it

    printed = io.StringIO()
    console = Console(file=printed, width=240)
    print_summary(result, console, as_json=False)
    summary = printed.getvalue()
    assert row(summary, "tasks in flight").startswith(
        f"tasks in flight │ 4 · {len(shared)} tasks shared the engine · mean batch"
    )
    per_task = f"{figures['joules_per_task']:.3g} · net {figures['net_joules_per_task']:.3g}"
    assert row(summary, "J per task, exact") == (
        f"J per task, exact · net │ {per_task} (union of the windows of 8 tasks)"
    )
    shown = CliRunner().invoke(
        app, ["show", result.run_id, "--db", str(tmp_path / "runs.db")], env={"COLUMNS": "240"}
    )
    assert shown.exit_code == 0, shown.exception
    assert row(shown.output, "concurrency") == "concurrency │ 4 task(s) in flight at once"
    assert row(shown.output, "J per task, exact").endswith(
        f"{per_task} (union of the windows of 8 tasks)"
    )
    assert shown.output.count("shared, batch") == len(shared)
    assert "add up to 1.0000 of the counters over the union of their windows" in shown.output


def test_one_task_at_a_time_on_a_batching_engine_shares_nothing(
    engine: BatchingEngine, tmp_path: Path
) -> None:
    """Windows one after another may meet inside a refresh interval, which their work splits,
    but no task ran beside another: none is shared, and the summary has no concurrency rows."""
    result = measure(tmp_path, limit=4, concurrency=1)
    assert max(engine.batches) == 1
    with open_store(str(tmp_path / "runs.db")) as store:
        tasks = store.task_results(result.run_id)
    assert [(t.shared, t.mean_batch) for t in tasks] == [(False, 1.0)] * 4
    assert result.conservation["ratio"] == pytest.approx(1.0, abs=0.01)
    assert result.concurrency["concurrency"] == 1 and result.concurrency["shared_tasks"] == 0
    printed = io.StringIO()
    console = Console(file=printed, width=240)
    print_summary(result, console, as_json=False)
    assert "tasks in flight" not in printed.getvalue()


def test_the_task_phase_ends_with_the_last_task_not_with_the_idle_measured_after_it(
    engine: BatchingEngine, tmp_path: Path
) -> None:
    """The run's `tasks` stretch (what benchmarks/measure_phase.py sets against the
    generations alone) holds neither idle measurement: with both inside the run's wall time,
    the stretch and the two idles fit in it."""
    started = time.monotonic()
    result = measure(tmp_path, limit=2, concurrency=2, idle_seconds=1.0)
    wall_s = time.monotonic() - started
    with open_store(str(tmp_path / "runs.db")) as store:
        summary = store.get_run(result.run_id).summary
    assert summary is not None and isinstance(summary["machine"], dict)
    stretches = {s["stretch"]: s["seconds"] for s in summary["machine"]["stretches"]}
    assert stretches["tasks"] > 0
    assert stretches["tasks"] + 2 * 1.0 <= wall_s


def test_a_slow_test_does_not_hold_back_the_next_tasks_generation(
    engine: BatchingEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first task's program sleeps in its tests for seconds; the tasks after it start
    generating as soon as it has generated, while its tests still run (scored in this thread
    one at a time, it had held them back until it was scored, and the batch drained)."""
    first = load_suite(SUITE)[0]
    engine.replies[first.prompt] = ("    import time\n    time.sleep(3)\n    return None\n", 20)
    started: dict[str, float] = {}
    generate = engine.generate

    def timed(request: Request) -> Completion:
        prompt = _prompt_of(request)
        started[prompt] = time.monotonic()
        return generate(request)

    scored: dict[str, float] = {}
    score = runner.score_completions

    def timed_score(items, sandbox, timeout_s):
        outcomes = score(items, sandbox, timeout_s=timeout_s)
        scored[items[0][0].task_id] = time.monotonic()
        return outcomes

    monkeypatch.setattr(engine, "generate", timed)
    monkeypatch.setattr(runner, "score_completions", timed_score)
    result = measure(tmp_path, limit=6, concurrency=2)
    assert result.figures.tasks == 6
    later = load_suite(SUITE)[2:6]
    # Every later task began generating before the first task's slow tests ended.
    assert all(started[task.prompt] < scored[first.task_id] for task in later)


def test_more_tasks_in_flight_than_the_engine_takes_is_refused_before_any_file(
    engine: BatchingEngine, tmp_path: Path
) -> None:
    with pytest.raises(UserError) as refused:
        measure(tmp_path, concurrency=65)
    assert str(refused.value) == (
        "--concurrency 65 is more than the torch engine runs at once (64); "
        "use --concurrency 64 or less"
    )
    assert engine._closed  # refused before the engine was opened
    assert not (tmp_path / "runs.db").exists()  # and before the database was created


@pytest.mark.parametrize(
    ("concurrency", "message"),
    [
        ("1000", r"--concurrency 1000 is more than the llamacpp engine runs at once \((\d+)\); "
         r"use --concurrency \1 or less"),
        ("0", r"--concurrency must be at least 1 task \(got 0\)"),
    ],
)  # fmt: skip
def test_the_refusal_is_one_line_and_exit_2_as_a_user_runs_it(
    tmp_path: Path, concurrency: str, message: str
) -> None:
    """The real embedded model and its llama.cpp engine, in a process of its own."""
    db = tmp_path / "runs.db"
    done = subprocess.run(
        [sys.executable, "-m", "openjarvis", "measure", "--concurrency", concurrency,
         "--limit", "1", "--idle-seconds", "0", "--db", str(db)],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")},
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and re.search(message, done.stderr), done.stderr
    assert not db.exists()  # refused before the database was created


def test_an_interrupted_run_keeps_finished_tasks_and_resumes_the_rest(
    engine: BatchingEngine, tmp_path: Path
) -> None:
    saved: list[str] = []

    def stop_after_three(task_id: str, passed: int, samples: int) -> None:
        saved.append(task_id)
        if len(saved) == 3:
            raise KeyboardInterrupt  # as Ctrl-C (or SIGTERM, which the CLI turns into one)

    with pytest.raises(RunInterrupted) as stopped:
        measure(tmp_path, on_task=stop_after_three)
    run_id = stopped.value.run_id
    with open_store(str(tmp_path / "runs.db")) as store:
        assert store.get_run(run_id).state == "interrupted"
        kept = {t.task_id for t in store.task_results(run_id)}
    # Finished tasks are kept (those settled, and those finished but waiting for their
    # neighbours' work); tasks still in flight are dropped and run again.
    assert 3 <= len(kept) < 8
    assert len(engine._active) == 0  # nothing left generating when the run returned
    resumed = resume_measure(run_id, str(tmp_path / "runs.db"))
    assert resumed.resumed_tasks == len(kept)
    with open_store(str(tmp_path / "runs.db")) as store:
        run = store.get_run(run_id)
        tasks = store.task_results(run_id)
    assert run.state == "complete" and run.concurrency == 4
    assert sorted(t.task_id for t in tasks) == sorted(t.task_id for t in load_suite(SUITE)[:8])


def test_ctrl_c_while_tasks_generate_waits_for_them_and_marks_the_run_interrupted(
    engine: BatchingEngine, tmp_path: Path
) -> None:
    """Ctrl-C (SIGTERM becomes one in the CLI) arriving while this thread waits for the tasks
    in flight: no more start, those in flight end before the engine closes."""
    timer = threading.Timer(0.15, _thread.interrupt_main)  # KeyboardInterrupt in this thread
    generate, first = engine.generate, threading.Lock()

    def generate_and_interrupt_soon(request: Request) -> Completion:
        if first.acquire(blocking=False):  # once, when the first task generates
            timer.start()
        return generate(request)

    engine.generate = generate_and_interrupt_soon  # type: ignore[method-assign]  # the test wraps the fake's generate
    try:
        with pytest.raises(RunInterrupted) as stopped:
            measure(tmp_path, limit=20)
    finally:
        timer.cancel()
    assert len(engine._active) == 0 and not engine._thread.is_alive()  # closed after they ended
    with open_store(str(tmp_path / "runs.db")) as store:
        run = store.get_run(stopped.value.run_id)
        saved = store.task_results(stopped.value.run_id)
    assert run.state == "interrupted"
    assert stopped.value.tasks_saved == len(saved) < 20


def test_the_start_up_heap_is_left_out_of_collections_while_tasks_run(
    engine: BatchingEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full collection walks every object and stops every thread while it does: what start-up
    built is frozen while the tasks run (runtime/heap.py), and given back after the run."""
    frozen: list[int] = []
    generate = engine.generate

    def counting(request: Request) -> Completion:
        frozen.append(gc.get_freeze_count())
        return generate(request)

    monkeypatch.setattr(engine, "generate", counting)
    measure(tmp_path, limit=2, concurrency=2)
    assert len(frozen) == 2 and min(frozen) > 0
    assert gc.get_freeze_count() == 0

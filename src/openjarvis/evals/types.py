"""Plain data for evals: tasks of a suite and the outcome of running a completion's tests.

A task is one of three kinds (docs/suites.md): code, multiple_choice or exact_match.
"""

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "NORMALIZE_STEPS",
    "TASK_KINDS",
    "ExecutionResult",
    "ExecutionStatus",
    "Normalize",
    "Task",
    "TaskKind",
]

TaskKind = Literal["code", "multiple_choice", "exact_match"]
TASK_KINDS: tuple[TaskKind, ...] = ("code", "multiple_choice", "exact_match")
Normalize = Literal["strip", "lower", "number"]
NORMALIZE_STEPS: tuple[Normalize, ...] = ("strip", "lower", "number")


@dataclass(frozen=True, slots=True)
class Task:
    """One prompt of a suite, and what a correct completion is for its kind.

    code: `test` defines check(candidate), run on `entry_point` in the sandbox.
    multiple_choice: `prompt` is rendered from the question and `choices`; `answer` is a letter.
    exact_match: `answer` compared with the completion after the `normalize` steps.
    """

    task_id: str
    prompt: str
    kind: TaskKind
    test: str = ""
    entry_point: str = ""
    stop: tuple[str, ...] = ()
    max_tokens: int = 512
    choices: tuple[str, ...] = ()
    answer: str = ""
    normalize: tuple[Normalize, ...] = ()


ExecutionStatus = Literal["passed", "failed", "timeout", "error"]


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """What happened when a program ran in the sandbox, or when an answer was checked."""

    status: ExecutionStatus
    detail: str  # last lines of stderr, or why it was stopped, or why an answer is wrong
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"

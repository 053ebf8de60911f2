"""Plain data for evals: tasks of a suite and the outcome of running a completion's tests."""

from dataclasses import dataclass
from typing import Literal

__all__ = ["ExecutionResult", "ExecutionStatus", "Task"]


@dataclass(frozen=True, slots=True)
class Task:
    """One prompt of a suite. For code tasks, `test` and `entry_point` check a completion."""

    task_id: str
    prompt: str
    kind: Literal["code"]
    test: str
    entry_point: str
    stop: tuple[str, ...] = ()
    max_tokens: int = 512


ExecutionStatus = Literal["passed", "failed", "timeout", "error"]


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """What happened when a program ran in the sandbox."""

    status: ExecutionStatus
    detail: str  # last lines of stderr, or why it was stopped
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"

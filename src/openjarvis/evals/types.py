"""Plain data for evals: tasks of a suite and the outcome of running a completion's tests.

A suite file's task is one of four kinds (docs/suites.md): code, multiple_choice, exact_match or
open_ended (scored by a judge model); lm-eval documents are tasks of kind harness (docs/harness.md).
"""

from dataclasses import dataclass
from typing import Literal, Protocol

from openjarvis.runtime.types import Completion, Engine, Request

__all__ = [
    "NORMALIZE_STEPS",
    "TASK_KINDS",
    "ExecutionResult",
    "ExecutionStatus",
    "Normalize",
    "Task",
    "TaskKind",
    "TaskProcedure",
]

TaskKind = Literal["code", "multiple_choice", "exact_match", "open_ended", "harness"]
# The kinds a suite file may hold; harness tasks come from lm-eval's own task definitions.
TASK_KINDS: tuple[TaskKind, ...] = ("code", "multiple_choice", "exact_match", "open_ended")
Normalize = Literal["strip", "lower", "number"]
NORMALIZE_STEPS: tuple[Normalize, ...] = ("strip", "lower", "number")


@dataclass(frozen=True, slots=True)
class Task:
    """One prompt of a suite, and what a correct completion is for its kind.

    code: `test` defines check(candidate), run on `entry_point` in the sandbox.
    multiple_choice: `prompt` is rendered from the question and `choices`; `answer` is a letter.
    exact_match: `answer` compared with the completion after the `normalize` steps.
    open_ended: a judge model gives the verdict (`answer`, when given, is a reference for it).
    harness: one lm-eval document; its `procedure` sends the harness's requests and scores them.
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
    # Set where the task brings its own requests or scorer (lm-eval documents, judged tasks).
    procedure: "TaskProcedure | None" = None


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


class TaskProcedure(Protocol):
    """How a task that is more than one request and a string check is answered and scored: an
    lm-eval document (several requests, the harness's own metric) or a judged answer."""

    def answer(self, engine: Engine, request: Request) -> Completion:
        """Run the task's requests on `engine` (inside the task's energy window) as one
        completion; `request` is what the task would send alone (its temperature and seed)."""
        ...

    def score(self, completion: str) -> ExecutionResult:
        """Passed or failed, outside the energy window."""
        ...

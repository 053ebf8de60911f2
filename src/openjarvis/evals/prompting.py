"""How a suite's task is put to a model: as plain text to continue ("completion"), or as a user
turn rendered by the model's own chat template ("chat-template"); each run records its choice.
"""

from collections.abc import Mapping, Sequence
from typing import Literal

from openjarvis.evals.harness import ChatContext
from openjarvis.evals.types import Task, TaskKind
from openjarvis.runtime.types import (
    ChatMessage,
    ChatRequest,
    Completion,
    Engine,
    GenerationRequest,
    Request,
)

__all__ = [
    "PROMPTINGS",
    "Prompting",
    "answer_task",
    "describe_prompting",
    "run_prompting",
    "task_request",
]

Prompting = Literal["completion", "chat-template"]
PROMPTINGS: tuple[Prompting, ...] = ("completion", "chat-template")


def _prompting(kind: TaskKind, model_kind: str | None) -> Prompting:
    # Code prompts are code to continue (HumanEval's own protocol), whatever the model. A base
    # model only continues text, and a model of unknown kind may have no template: completion.
    # lm-eval documents come formatted as the harness publishes them (its default: no template).
    if kind in ("code", "harness") or model_kind != "chat":
        return "completion"
    return "chat-template"


def run_prompting(tasks: Sequence[Task], model_kind: str | None) -> dict[str, Prompting]:
    """The prompting of each task kind in `tasks`, for a model of this kind (base, chat, None);
    lm-eval documents are prompted as the suite's apply_chat_template option says."""
    return {
        task.kind: "chat-template"
        if isinstance(task.prompt, ChatContext)
        else _prompting(task.kind, model_kind)
        for task in tasks
    }


def task_request(task: Task, prompting: Prompting, temperature: float, seed: int) -> Request:
    if prompting == "chat-template":
        return ChatRequest(
            messages=(ChatMessage("user", task.prompt),),
            max_tokens=task.max_tokens,
            stop=task.stop,
            temperature=temperature,
            seed=seed,
        )
    return GenerationRequest(
        prompt=task.prompt,
        max_tokens=task.max_tokens,
        stop=task.stop,
        temperature=temperature,
        seed=seed,
    )


def answer_task(engine: Engine, task: Task, request: Request) -> Completion:
    """The task's completion: its own requests where it brings them (TaskProcedure), else the
    one request; called inside the task's energy window."""
    if task.procedure is not None:
        return task.procedure.answer(engine, request)
    return engine.generate(request)


def describe_prompting(prompting: object) -> str:
    """A run's stored prompting in one line: "completion", or per kind when kinds differ; runs
    stored before prompting was recorded prompted every task by completion (the only way)."""
    if not isinstance(prompting, Mapping) or not prompting:
        return "completion (not recorded: the run predates it, when every task was a completion)"
    ways = set(prompting.values())
    if len(ways) == 1:
        return str(ways.pop())
    return ", ".join(f"{way} ({kind})" for kind, way in prompting.items())

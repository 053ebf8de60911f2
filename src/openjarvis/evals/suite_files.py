"""Read suites that users bring: JSONL files with one task per line (docs/suites.md).

A broken file is a UserError naming the file, the line and the fix; nothing in a file runs here.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any

from openjarvis.errors import UserError
from openjarvis.evals.scoring import parse_number
from openjarvis.evals.types import NORMALIZE_STEPS, TASK_KINDS, Task, TaskKind

__all__ = ["HUMANEVAL_STOP", "SuiteFile", "parse_suite", "render_choices"]

# HumanEval's standard stops: a completion is one function body, so a new top-level
# statement means the model has moved on. Code tasks of suite files default to them too.
HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
# Answers are short; a blank line means the model has moved on to inventing the next question.
_ANSWER_STOP = ("\n\n",)
_DEFAULT_STOP: dict[TaskKind, tuple[str, ...]] = {
    "code": HUMANEVAL_STOP,
    "multiple_choice": _ANSWER_STOP,
    "exact_match": _ANSWER_STOP,
    "open_ended": (),  # an open answer may run over paragraphs: the model's end of turn ends it
}
_DEFAULT_MAX_TOKENS: dict[TaskKind, int] = {
    "code": 512,
    "multiple_choice": 32,
    "exact_match": 32,
    "open_ended": 512,
}
_COMMON_FIELDS = ("task_id", "kind", "stop", "max_tokens")
_REQUIRED: dict[TaskKind, tuple[str, ...]] = {
    "code": ("prompt", "test", "entry_point"),
    "multiple_choice": ("question", "choices", "answer"),
    "exact_match": ("prompt", "answer"),
    "open_ended": ("prompt",),
}
_OPTIONAL: dict[TaskKind, tuple[str, ...]] = {
    "code": ("canonical_solution",),
    "multiple_choice": (),
    "exact_match": ("normalize",),
    "open_ended": ("reference",),  # shown to the judge as a reference answer
}
_LETTERS = string.ascii_uppercase


@dataclass(frozen=True, slots=True)
class SuiteFile:
    tasks: tuple[Task, ...]
    references: dict[str, str]  # task_id -> a completion that must pass (where the file has one)


class _LineError(Exception):
    """What is wrong with one line and how to fix it; parse_suite adds the file and line."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; fix: {fix}")


def render_choices(question: str, choices: tuple[str, ...]) -> str:
    """The prompt of a multiple-choice task: question, lettered choices, then 'Answer:'."""
    lines = [question.strip(), ""]
    lines += [f"{letter}. {choice}" for letter, choice in zip(_LETTERS, choices, strict=False)]
    lines += ["", "Answer with the letter of the correct choice.", "Answer:"]
    return "\n".join(lines)


def parse_suite(text: str, source: str) -> SuiteFile:
    """The tasks of a suite file's text; `source` names the file in error messages."""
    tasks: list[Task] = []
    references: dict[str, str] = {}
    first_line_of: dict[str, int] = {}
    # Editors on Windows save UTF-8 with a byte-order mark; it is no part of the first task.
    text = text.removeprefix("\ufeff")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue  # blank lines (a trailing newline, spacing) carry no task
        try:
            task, reference = _parse_line(line)
            if task.task_id in first_line_of:
                raise _LineError(
                    f"duplicate task_id {task.task_id!r} (first on line "
                    f"{first_line_of[task.task_id]})",
                    "give every task its own task_id",
                )
        except _LineError as error:
            raise UserError(f"suite file {source}, line {number}: {error}") from None
        first_line_of[task.task_id] = number
        tasks.append(task)
        if reference is not None:
            references[task.task_id] = reference
    if not tasks:
        raise UserError(
            f"suite file {source} has no tasks; fix: write one JSON object per line "
            "(format in docs/suites.md)"
        )
    return SuiteFile(tuple(tasks), references)


def _parse_line(line: str) -> tuple[Task, str | None]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise _LineError(
            f"not valid JSON ({error.msg} at column {error.colno})",
            "write one complete JSON object per line (format in docs/suites.md)",
        ) from None
    if not isinstance(record, dict):
        raise _LineError(f"a JSON {type(record).__name__}, not an object", "write one object")
    kind = record.get("kind")
    if kind not in TASK_KINDS:
        problem = "missing field 'kind'" if "kind" not in record else f"unknown kind {kind!r}"
        raise _LineError(problem, f'set "kind" to one of {", ".join(TASK_KINDS)}')
    allowed = (*_COMMON_FIELDS, *_REQUIRED[kind], *_OPTIONAL[kind])
    for name in record:
        if name not in allowed:
            raise _LineError(
                f"unknown field {name!r} for kind {kind!r}",
                f"remove it or rename it; fields of {kind} tasks: {', '.join(allowed)}",
            )
    common: dict[str, Any] = {
        "task_id": _text(record, "task_id"),
        "kind": kind,
        "stop": _stop(record, kind),
        "max_tokens": _max_tokens(record, kind),
    }
    if kind == "code":
        return _code_task(record, common)
    if kind == "multiple_choice":
        return _choice_task(record, common)
    if kind == "open_ended":
        return _open_task(record, common)
    return _exact_task(record, common)


def _code_task(record: dict[str, Any], common: dict[str, Any]) -> tuple[Task, str | None]:
    test = _text(record, "test")
    try:
        compile(test, "test", "exec")  # compiling runs nothing; it catches a broken test early
    except SyntaxError as error:
        raise _LineError(
            f"field 'test' is not valid Python ({error.msg}, test line {error.lineno})",
            "make 'test' a Python program that defines check(candidate)",
        ) from None
    entry_point = _text(record, "entry_point")
    if not entry_point.isidentifier():
        raise _LineError(
            f"entry_point {entry_point!r} is not a Python name",
            "set it to the name of the function that check(candidate) receives",
        )
    reference = _text(record, "canonical_solution") if "canonical_solution" in record else None
    task = Task(prompt=_text(record, "prompt"), test=test, entry_point=entry_point, **common)
    return task, reference


def _choice_task(record: dict[str, Any], common: dict[str, Any]) -> tuple[Task, str | None]:
    choices = record.get("choices")
    if (
        not isinstance(choices, list)
        or not all(isinstance(c, str) and c.strip() for c in choices)
        or not 2 <= len(choices) <= len(_LETTERS)
    ):
        raise _LineError(
            "field 'choices' must be a list of 2 to 26 non-empty strings",
            'write e.g. "choices": ["3", "4", "5"]',
        )
    if len({c.strip().casefold() for c in choices}) < len(choices):
        raise _LineError("two choices have the same text", "make every choice different")
    letters = _LETTERS[: len(choices)]
    answer = record.get("answer")
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        letter = letters[answer]
    elif isinstance(answer, str) and len(answer.strip()) == 1 and answer.strip().upper() in letters:
        letter = answer.strip().upper()
    else:
        raise _LineError(
            f"answer {answer!r} does not name one of the {len(choices)} choices",
            f"give a letter {letters[0]}-{letters[-1]} or a 0-based index 0-{len(choices) - 1}",
        )
    question = _text(record, "question")
    prompt = render_choices(question, tuple(choices))
    return Task(prompt=prompt, choices=tuple(choices), answer=letter, **common), letter


def _exact_task(record: dict[str, Any], common: dict[str, Any]) -> tuple[Task, str | None]:
    answer = record.get("answer")
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise _LineError("field 'answer' must be a non-empty string or a number", 'add "answer"')
    steps = record.get("normalize", ["strip"])
    if (
        not isinstance(steps, list)
        or not all(step in NORMALIZE_STEPS for step in steps)
        or len(set(steps)) < len(steps)
    ):
        raise _LineError(
            f"normalize {steps!r} is not a list of distinct steps",
            f'use a list of {", ".join(NORMALIZE_STEPS)} (default ["strip"])',
        )
    if "number" in steps and parse_number(answer, whole=True) is None:
        raise _LineError(
            f"answer {answer!r} is not a number but normalize has 'number'",
            "write the answer as a number such as 42 or -1.5, or drop 'number'",
        )
    task = Task(prompt=_text(record, "prompt"), answer=answer, normalize=tuple(steps), **common)
    return task, answer


def _open_task(record: dict[str, Any], common: dict[str, Any]) -> tuple[Task, str | None]:
    """A prompt whose answer a judge model rates (evals/judge.py); no reference completion."""
    reference = _text(record, "reference") if "reference" in record else ""
    return Task(prompt=_text(record, "prompt"), answer=reference, **common), None


def _text(record: dict[str, Any], name: str) -> str:
    if name not in record:
        raise _LineError(f"missing field {name!r}", f'add "{name}" (format in docs/suites.md)')
    value = record[name]
    if not isinstance(value, str) or not value.strip():
        raise _LineError(f"field {name!r} must be a non-empty string", f'give "{name}" text')
    return value


def _stop(record: dict[str, Any], kind: TaskKind) -> tuple[str, ...]:
    stop = record.get("stop", list(_DEFAULT_STOP[kind]))
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _LineError("field 'stop' must be a list of non-empty strings", 'e.g. "stop": ["\\n"]')
    return tuple(stop)


def _max_tokens(record: dict[str, Any], kind: TaskKind) -> int:
    value = record.get("max_tokens", _DEFAULT_MAX_TOKENS[kind])
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _LineError(f"max_tokens {value!r} is not a positive integer", "e.g. 64")
    return value

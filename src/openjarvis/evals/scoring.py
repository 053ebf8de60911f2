"""Score completions of every task kind, and estimate pass@k.

Code runs its tests in the sandbox, in parallel; other kinds are string checks in this process.
"""

from __future__ import annotations

import os
import re
import string
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

from openjarvis.evals.sandbox import Sandbox
from openjarvis.evals.types import ExecutionResult, Task

__all__ = [
    "build_program",
    "check_answer",
    "extract_choice",
    "parse_number",
    "score_completions",
]

_NUMBER = r"-?\d+(?:,\d{3})*(?:\.\d+)?(?!\d)"  # -1,234.5; thousands commas only in groups of three
_NUMBER_PATTERN = re.compile(rf"(?<![\d.]){_NUMBER}")
# "Answer: B", "the answer is (C)": an explicit statement anywhere in the completion.
_STATED_CHOICE = re.compile(r"(?i:answer)\s*(?:is\s*:?\s*|:\s*)\(?([A-Z])(?![A-Za-z])")
# "B", "(B)", "B.", "B) 42" at the very start.
_LEADING_CHOICE = re.compile(r"\s*\(?([A-Z])(?![A-Za-z0-9])")
# "A" and "I" are also English words: "A list is ..." starts with a word, not a choice.
_LEADING_WORD = re.compile(r"\s*[AI]\s+[a-z]")
# Lines that start like a listed choice ("B. 54"): a completion with two or more of them
# repeats the list, and its first letter is no answer (it would favour choice A).
_LISTED_CHOICE = re.compile(r"^\s*\(?([A-Z])[.)]", re.MULTILINE)


def build_program(task: Task, completion: str) -> str:
    """The prompt, the model's completion, the task's tests, and the call that runs them."""
    # Newlines between the parts keep a completion without a final newline from running into
    # the test code; a test block indented under the completion would change its meaning.
    return f"{task.prompt}{completion}\n\n{task.test}\n\ncheck({task.entry_point})\n"


def score_completions(
    items: list[tuple[Task, str]],
    sandbox: Sandbox | None,
    timeout_s: float = 10.0,
    workers: int | None = None,
) -> list[ExecutionResult]:
    """Score each (task, completion); results come back in the order given.

    Code tasks run in the sandbox (None is allowed only when there are none). The timeout is
    per program and generous on purpose: a loaded machine must not fail a correct, slow solution.
    """
    code = [(index, item) for index, item in enumerate(items) if item[0].kind == "code"]
    ran: dict[int, ExecutionResult] = {}
    if code:
        if sandbox is None:
            raise ValueError("code tasks need a sandbox to run their tests")
        workers = workers or os.cpu_count() or 1
        # Threads only wait on subprocesses, so the GIL is no bottleneck here.
        with ThreadPoolExecutor(max_workers=min(workers, len(code))) as pool:
            outcomes = pool.map(
                lambda item: sandbox.run_python(build_program(*item), timeout_s),
                [item for _, item in code],
            )
            ran = dict(zip([index for index, _ in code], outcomes, strict=True))
    return [
        ran[index] if task.kind == "code" else check_answer(task, completion)
        for index, (task, completion) in enumerate(items)
    ]


def check_answer(task: Task, completion: str) -> ExecutionResult:
    """Judge a multiple-choice or exact-match completion by its text alone (nothing runs), or
    hand it to the task's own scorer (lm-eval's metric, a judge model)."""
    if task.procedure is not None:
        return task.procedure.score(completion)
    started = time.perf_counter()
    if task.kind == "multiple_choice":
        chosen = extract_choice(completion, task.choices)
        passed = chosen == task.answer
        detail = "no choice found in the completion" if chosen is None else f"chose {chosen}"
        detail += f"; the answer is {task.answer}"
    elif task.kind == "exact_match" and "number" in task.normalize:
        found = parse_number(completion)
        passed = found is not None and found == parse_number(task.answer, whole=True)
        detail = "no number in the completion" if found is None else f"found {found}"
        detail += f"; expected {task.answer}"
    elif task.kind == "exact_match":
        got, expected = _normalize(completion, task), _normalize(task.answer, task)
        passed = got == expected
        detail = f"got {got[:200]!r}; expected {expected!r}"
    elif task.kind == "code":
        raise ValueError(f"{task.kind} tasks are scored in the sandbox, not by their text")
    else:
        raise ValueError(f"{task.kind} tasks are scored by their own procedure, which is unset")
    duration_s = time.perf_counter() - started
    return ExecutionResult("passed" if passed else "failed", "" if passed else detail, duration_s)


def extract_choice(completion: str, choices: tuple[str, ...]) -> str | None:
    """The letter a completion chose among `choices`, or None (docs/suites.md, in this order).

    1. a letter at the start: "B", "(B)", "B.", "B) 42", unless the completion lists two or
    more choices; 2. "answer is B" or "Answer: B" anywhere; 3. a first line that is one
    choice's text ("42" for "B. 42").
    """
    letters = string.ascii_uppercase[: len(choices)]
    leading = _LEADING_CHOICE.match(completion)
    plain = not _LEADING_WORD.match(completion) and len(set(_LISTED_CHOICE.findall(completion))) < 2
    if leading and leading.group(1) in letters and plain:
        return leading.group(1)
    stated = _STATED_CHOICE.search(completion)
    if stated and stated.group(1) in letters:
        return stated.group(1)
    first_line = next((line for line in completion.splitlines() if line.strip()), "")
    wanted = first_line.strip().rstrip(".").strip().casefold()
    for letter, choice in zip(letters, choices, strict=True):
        if choice.strip().casefold() == wanted:
            return letter
    return None


def parse_number(text: str, whole: bool = False) -> Decimal | None:
    """The first number in text (or, with whole, text that is just a number); None if none.

    Decimal compares 42 and 42.0 as equal and never rounds 0.1 + 0.2 into a false match.
    """
    match = re.fullmatch(_NUMBER, text.strip()) if whole else _NUMBER_PATTERN.search(text)
    return Decimal(match.group(0).replace(",", "")) if match else None


def _normalize(text: str, task: Task) -> str:
    if "strip" in task.normalize:
        text = text.strip()
    if "lower" in task.normalize:
        text = text.casefold()
    return text

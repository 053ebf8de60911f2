"""Suites users bring (docs/suites.md): the example suites, loading by path, and broken files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openjarvis.errors import UserError
from openjarvis.evals.sandbox import Sandbox
from openjarvis.evals.scoring import score_completions
from openjarvis.evals.suite_files import HUMANEVAL_STOP
from openjarvis.evals.suites import list_suites, load_suite, reference_solutions

EXAMPLES = ("python-basics", "basics-choice", "arithmetic")

CODE = {
    "task_id": "t/code",
    "kind": "code",
    "prompt": "def double(x):\n",
    "test": "def check(candidate):\n    assert candidate(2) == 4\n",
    "entry_point": "double",
    "canonical_solution": "    return 2 * x\n",
}
CHOICE = {
    "task_id": "t/choice",
    "kind": "multiple_choice",
    "question": "What is 2 + 2?",
    "choices": ["3", "4", "5"],
    "answer": 1,
}
EXACT = {
    "task_id": "t/exact",
    "kind": "exact_match",
    "prompt": "Q: 6 * 7?\nA:",
    "answer": 42,
    "normalize": ["number"],
    "stop": ["\n"],
    "max_tokens": 8,
}


def _write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "mine.jsonl"
    text = [line if isinstance(line, str) else json.dumps(line) for line in lines]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_suite_passes_with_its_own_references(name: str) -> None:
    tasks = load_suite(name)
    references = reference_solutions(name)
    assert len(tasks) == 10
    assert set(references) == {task.task_id for task in tasks}
    results = score_completions([(t, references[t.task_id]) for t in tasks], Sandbox.detect())
    assert [r.status for r in results] == ["passed"] * 10, [r.detail for r in results]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_suites_fail_wrong_answers(name: str) -> None:
    tasks = load_suite(name)
    wrong = "    return None\n" if tasks[0].kind == "code" else " banana"
    results = score_completions([(t, wrong) for t in tasks], Sandbox.detect())
    assert not any(r.passed for r in results)


def test_example_names_never_shadow_built_in_ones() -> None:
    names = [suite.name for suite in list_suites()]
    assert len(names) == len(set(names))


def test_a_file_with_every_kind_loads_by_path(tmp_path: Path) -> None:
    path = _write(tmp_path, CODE, "", CHOICE, EXACT)  # a blank line is allowed
    code, choice, exact = load_suite(str(path))
    assert (code.kind, code.entry_point, code.stop, code.max_tokens) == (
        "code", "double", HUMANEVAL_STOP, 512,
    )  # fmt: skip
    assert choice.answer == "B"  # the 0-based index 1
    assert choice.choices == ("3", "4", "5")
    assert choice.prompt.startswith("What is 2 + 2?\n\nA. 3\nB. 4\nC. 5\n")
    assert choice.prompt.endswith("Answer:")
    assert (choice.stop, choice.max_tokens) == (("\n\n",), 32)
    assert (exact.answer, exact.normalize, exact.stop, exact.max_tokens) == (
        "42", ("number",), ("\n",), 8,
    )  # fmt: skip
    assert reference_solutions(str(path)) == {
        "t/code": "    return 2 * x\n", "t/choice": "B", "t/exact": "42",
    }  # fmt: skip


def test_exact_match_defaults_to_strip_and_letters_are_case_insensitive(tmp_path: Path) -> None:
    exact = {k: v for k, v in EXACT.items() if k != "normalize"}
    choice = {**CHOICE, "answer": "c"}
    exact_task, choice_task = load_suite(str(_write(tmp_path, exact, choice)))
    assert exact_task.normalize == ("strip",)
    assert choice_task.answer == "C"


def test_example_suite_names_are_case_insensitive() -> None:
    assert load_suite("Python-Basics") == load_suite("python-basics")


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        ([CODE, "{not json"], 2, r"not valid JSON .*fix: write one complete JSON object"),
        ([[1, 2]], 1, r"a JSON list, not an object"),
        ([{**CODE, "kind": "essay"}], 1, r"unknown kind 'essay'; fix: set \"kind\" to one of"),
        ([{k: v for k, v in CODE.items() if k != "kind"}], 1, r"missing field 'kind'"),
        ([{k: v for k, v in CODE.items() if k != "test"}], 1, r"missing field 'test'; fix: add"),
        ([CHOICE, EXACT, CHOICE], 3, r"duplicate task_id 't/choice' \(first on line 1\)"),
        ([{**CODE, "entrypoint": "f"}], 1, r"unknown field 'entrypoint' for kind 'code'"),
        ([{**CODE, "test": "def check(:\n"}], 1, r"field 'test' is not valid Python"),
        ([{**CODE, "entry_point": "not a name"}], 1, r"is not a Python name"),
        ([{**CHOICE, "answer": "D"}], 1, r"answer 'D' does not name one of the 3 choices"),
        ([{**CHOICE, "answer": 3}], 1, r"0-based index 0-2"),
        ([{**CHOICE, "choices": ["only"]}], 1, r"2 to 26 non-empty strings"),
        ([{**CHOICE, "choices": ["4", " 4"]}], 1, r"two choices have the same text"),
        ([{**EXACT, "answer": "forty-two"}], 1, r"is not a number but normalize has 'number'"),
        ([{**EXACT, "normalize": ["upper"]}], 1, r"is not a list of distinct steps"),
        ([{**EXACT, "max_tokens": 0}], 1, r"max_tokens 0 is not a positive integer"),
        ([{**EXACT, "stop": "\n"}], 1, r"'stop' must be a list of non-empty strings"),
        ([{**EXACT, "task_id": ""}], 1, r"'task_id' must be a non-empty string"),
    ],
)
def test_broken_suite_file_names_the_file_the_line_and_the_fix(
    tmp_path: Path, lines: list[object], line: int, message: str
) -> None:
    path = _write(tmp_path, *lines)
    with pytest.raises(UserError, match=message) as caught:
        load_suite(str(path))
    text = str(caught.value)
    assert text.startswith(f"suite file {path}, line {line}: ")
    assert "fix: " in text
    assert "\n" not in text


def test_empty_suite_file_says_what_to_write(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"suite file {path} has no tasks; fix: write one JSON"):
        load_suite(str(path))


def test_missing_suite_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"suite file .*absent\.jsonl not found"):
        load_suite(str(tmp_path / "absent.jsonl"))


def test_a_suite_file_saved_with_a_utf8_byte_order_mark_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, EXACT, CHOICE)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as Notepad saves UTF-8
    exact, choice = load_suite(str(path))
    assert (exact.task_id, exact.answer, choice.answer) == ("t/exact", "42", "B")

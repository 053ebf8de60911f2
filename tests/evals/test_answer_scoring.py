"""Scoring multiple-choice and exact-match completions by their text, beside code in one call."""

from __future__ import annotations

from decimal import Decimal

import pytest

from openjarvis.evals.sandbox import Sandbox
from openjarvis.evals.scoring import check_answer, extract_choice, parse_number, score_completions
from openjarvis.evals.types import Normalize, Task

CHOICES = ("3", "4", "5", "none of these")


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (" B", "B"),
        ("B", "B"),
        (" (C)", "C"),
        (" D. none of these", "D"),
        (" A) 3\n\nQuestion: next", "A"),
        (" The answer is C.", "C"),
        (" I think the answer is: (B)", "B"),
        ("Answer: D", "D"),
        (" 4", "B"),  # the text of choice B
        (" none of these.", "D"),
        (" A list of numbers", None),  # the English word "A", not a choice
        ("\nA. 3\nB. 4\nC. 5", None),  # the list repeated: no answer, and not A
        ("\nA. 3\nB. 4\nThe answer is B", "B"),
        (" E", None),  # not one of the four letters
        (" Banana", None),
        ("", None),
    ],
)
def test_extract_choice(completion: str, expected: str | None) -> None:
    assert extract_choice(completion, CHOICES) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (" 42", Decimal(42)),
        ("42.0", Decimal(42)),
        ("The total is 1,234.5 apples", Decimal("1234.5")),
        (" -5 degrees", Decimal(-5)),
        ("7 and then 8", Decimal(7)),
        ("seven", None),
    ],
)
def test_parse_number_finds_the_first_number(text: str, expected: Decimal | None) -> None:
    assert parse_number(text) == expected


def test_parse_number_whole_needs_the_text_to_be_a_number() -> None:
    assert parse_number(" 12,000 ", whole=True) == Decimal(12000)
    assert parse_number("12 apples", whole=True) is None


def _choice() -> Task:
    return Task("c", "prompt", "multiple_choice", choices=CHOICES, answer="B")


def _exact(answer: str, *steps: Normalize) -> Task:
    return Task("e", "prompt", "exact_match", answer=answer, normalize=steps)


@pytest.mark.parametrize(
    ("task", "completion", "passed"),
    [
        (_choice(), " B", True),
        (_choice(), " C", False),
        (_exact("42", "number"), " 42.00\n", True),
        (_exact("42", "number"), " 41", False),
        (_exact("42", "number"), " forty-two", False),
        (_exact("Seven", "strip", "lower"), "  seven \n", True),
        (_exact("Seven", "strip"), "seven", False),  # case counts without "lower"
        (_exact("seven"), " seven", False),  # no steps: the text must be identical
        (_exact("seven"), "seven", True),
    ],
)
def test_check_answer(task: Task, completion: str, passed: bool) -> None:
    result = check_answer(task, completion)
    assert result.passed is passed
    assert result.status == ("passed" if passed else "failed")
    assert (result.detail == "") is passed
    assert result.duration_s >= 0


def test_failed_answers_say_what_was_found_and_expected() -> None:
    assert check_answer(_choice(), " C").detail == "chose C; the answer is B"
    assert (
        check_answer(_choice(), " ?").detail == "no choice found in the completion; the answer is B"
    )
    assert check_answer(_exact("42", "number"), "41").detail == "found 41; expected 42"
    assert check_answer(_exact("a", "strip"), " b ").detail == "got 'b'; expected 'a'"


def test_check_answer_refuses_code_tasks() -> None:
    code = Task("x", "def f():\n", "code", test="def check(c):\n    pass\n", entry_point="f")
    with pytest.raises(ValueError, match="scored in the sandbox"):
        check_answer(code, "    return 1\n")


def test_every_kind_scores_in_one_call_in_the_order_given() -> None:
    code = Task(
        "x", "def f():\n", "code", test="def check(c):\n    assert c() == 1\n", entry_point="f"
    )
    items = [
        (_choice(), " B"),
        (code, "    return 1\n"),
        (_exact("3", "number"), "4"),
        (code, "    return 2\n"),
        (_exact("3", "number"), "3"),
    ]
    results = score_completions(items, Sandbox.detect(), workers=2)
    assert [r.status for r in results] == ["passed", "passed", "failed", "failed", "passed"]
    assert "AssertionError" in results[3].detail


def test_text_kinds_need_no_sandbox_but_code_does() -> None:
    assert score_completions([(_choice(), "B")], None)[0].passed
    code = Task("x", "def f():\n", "code", test="def check(c):\n    pass\n", entry_point="f")
    with pytest.raises(ValueError, match="need a sandbox"):
        score_completions([(code, "    return 1\n")], None)

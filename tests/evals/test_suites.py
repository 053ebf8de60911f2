"""Loading suites from data shipped with installed packages, and naming unknown ones."""

from __future__ import annotations

import pytest

from openjarvis.errors import UserError
from openjarvis.evals.suites import SuiteInfo, list_suites, load_suite, reference_solutions


def test_humaneval_has_its_164_problems_in_order() -> None:
    tasks = load_suite("humaneval")
    assert [task.task_id for task in tasks] == [f"HumanEval/{i}" for i in range(164)]
    first = tasks[0]
    assert first.entry_point == "has_close_elements"
    assert first.prompt.startswith("from typing import List")
    assert "def has_close_elements(" in first.prompt
    assert "def check(candidate):" in first.test


def test_humaneval_tasks_are_code_tasks_with_the_standard_stops() -> None:
    for task in load_suite("humaneval"):
        assert task.kind == "code"
        assert task.stop == ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
        assert task.max_tokens == 512
        assert f"def {task.entry_point}(" in task.prompt
        assert "def check(" in task.test


def test_suite_names_are_case_insensitive_and_lists_are_fresh() -> None:
    tasks = load_suite("HumanEval")
    tasks.clear()
    assert len(load_suite("humaneval")) == 164


def test_reference_solutions_cover_every_task() -> None:
    references = reference_solutions("humaneval")
    assert set(references) == {task.task_id for task in load_suite("humaneval")}
    assert all(solution.strip() for solution in references.values())


def test_list_suites_gives_each_suite_its_size_and_kinds() -> None:
    assert list_suites() == [
        SuiteInfo("humaneval", "built-in", 164, ("code",)),
        SuiteInfo("arithmetic", "example", 10, ("exact_match",)),
        SuiteInfo("basics-choice", "example", 10, ("multiple_choice",)),
        SuiteInfo("python-basics", "example", 10, ("code",)),
    ]


@pytest.mark.parametrize("loader", [load_suite, reference_solutions])
def test_unknown_suite_names_the_known_ones_and_the_file_format(loader) -> None:
    known = "humaneval, arithmetic, basics-choice, python-basics"
    with pytest.raises(UserError, match=rf"unknown suite 'mbpp'; known suites: {known}; .*\.jsonl"):
        loader("mbpp")

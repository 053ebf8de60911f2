"""Scoring completions in the sandbox, in parallel, and the pass@k estimator."""

from __future__ import annotations

import math
import time

import pytest

from openjarvis.evals.sandbox import Sandbox
from openjarvis.evals.scoring import build_program, score_completions
from openjarvis.evals.suites import load_suite, reference_solutions
from openjarvis.evals.types import Task
from openjarvis.metrics import pass_at_k


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return load_suite("humaneval")


def test_all_canonical_solutions_pass(tasks: list[Task]) -> None:
    """Validation: the suite's own solutions must all pass in the sandbox this host uses."""
    references = reference_solutions("humaneval")
    sandbox = Sandbox.detect()
    started = time.monotonic()
    results = score_completions([(task, references[task.task_id]) for task in tasks], sandbox)
    elapsed_s = time.monotonic() - started
    failed = {t.task_id: r for t, r in zip(tasks, results, strict=True) if not r.passed}
    assert failed == {}
    print(f"164 canonical solutions passed in {elapsed_s:.1f} s; {sandbox.isolation_note}")


def test_build_program_runs_the_checks_after_the_completion(tasks: list[Task]) -> None:
    task = tasks[0]
    program = build_program(task, "    return False")
    assert program.startswith(task.prompt + "    return False\n")
    assert task.test in program
    assert program.rstrip().endswith("check(has_close_elements)")
    compile(program, "program.py", "exec")


# Completions for HumanEval/0, has_close_elements; each line of expectations is one item.
WRONG_COMPLETIONS = {
    "returns None": ("    return None\n", "failed"),
    "exits with 0 before the checks": ("    return True\nimport os\nos._exit(0)\n", "failed"),
    "exits with 0 inside the checks": ("    import os\n    os._exit(0)\n", "failed"),
    "loops forever": ("    while True:\n        pass\n", "timeout"),
    "closes stdout and is wrong": ("    import os\n    os.close(1)\n    return None\n", "failed"),
    "fork bomb": (
        "    import os\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
        "timeout",
    ),
    "allocates 10 GB": ("    return bytearray(10 * 1024**3)\n", "failed"),
}


def test_wrong_completions_fail_and_results_keep_their_order(tasks: list[Task]) -> None:
    task = tasks[0]
    correct = reference_solutions("humaneval")[task.task_id]
    items = [(task, correct)]
    expected = ["passed"]
    for completion, status in WRONG_COMPLETIONS.values():
        items += [(task, completion), (task, correct)]
        expected += [status, "passed"]
    results = score_completions(items, Sandbox.detect(), timeout_s=3.0, workers=2)
    assert [result.status for result in results] == expected
    timed_out = [r for r in results if r.status == "timeout"]
    assert all("3 s" in r.detail and r.duration_s >= 3.0 for r in timed_out)


def test_score_completions_with_nothing_to_score() -> None:
    assert score_completions([], Sandbox.detect()) == []


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (10, 3, 1, 0.3),  # pass@1 is the fraction that passed
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (6, 2, 3, 0.8),  # 1 - C(4,3)/C(6,3) = 1 - 4/20
        (10, 0, 5, 0.0),
        (10, 8, 3, 1.0),  # only 2 fail, so any 3 include a pass
        (10, 5, 10, 1.0),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_where_binomials_are_huge() -> None:
    # C(2000, 100) has about 190 digits; floats of it would overflow.
    exact = 1 - math.comb(1990, 100) / math.comb(2000, 100)
    assert pass_at_k(2000, 10, 100) == pytest.approx(exact, rel=1e-12)
    assert 0.0 < pass_at_k(2000, 10, 100) < 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="need 0 <= c <= n"):
        pass_at_k(n, c, k)

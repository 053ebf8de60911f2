"""What `ipw measure --concurrency N` costs beyond its generations: a stored run's task phase
(the `tasks` stretch its busy-machine watch timed, from the first task's start to the last one
scored) against the same tasks' requests through the same kind of engine, N at once, with no
energy windows and no scoring (the issue's goal: the task phase at most 1.3x that); and the
generations' own per-sequence decode rate, to tell the engine's pace from the harness's.

Run: python3 benchmarks/measure_phase.py --db RUNS.db [--run RUN_ID] [--prompt-rows 256,64,0]
     (the latest run in the database unless --run; its stored configuration opens the engine;
     --prompt-rows: the generations alone again on a torch engine for each of these
     `decode_prompt_rows`, the prompt tokens a decode step takes as rows)
"""

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from openjarvis.evals.config import RunConfig, prepare
from openjarvis.evals.prompting import answer_task, run_prompting, task_request
from openjarvis.evals.types import Task
from openjarvis.runtime.engines import open_engine, torch_settings
from openjarvis.runtime.types import Completion, Engine, Request
from openjarvis.store import RunRecord, open_store

__all__: list[str] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--run", help="a run id (default: the latest run)")
    parser.add_argument("--prompt-rows", help="torch: decode_prompt_rows to run, comma-separated")
    args = parser.parse_args()
    with open_store(args.db) as store:
        run = store.get_run(args.run) if args.run else store.list_runs(limit=1)[0]
    assert run.summary is not None, "a finished run"
    machine = run.summary.get("machine")
    stretches = machine.get("stretches", []) if isinstance(machine, dict) else []
    phase_s = next((s["seconds"] for s in stretches if s["stretch"] == "tasks"), None)
    if phase_s is None:
        raise SystemExit(f"run {run.id} has no timed task phase (stored before it was kept)")
    assert run.config is not None, "a run that stored its configuration"
    prepared = prepare(RunConfig.from_dict(run.config))  # the run's own engine and tasks
    spec = prepared.config
    tasks = list(prepared.suite.tasks)
    prompting = run_prompting(tasks, run.model_kind)
    requests = [task_request(t, prompting[t.kind], spec.temperature, spec.seed) for t in tasks]
    if not args.prompt_rows:
        engine = open_engine(spec.engine_spec(), prepared.model)
        completions, alone_s = generations(engine, tasks, requests, spec.concurrency)
        report(run, phase_s, completions, alone_s)
        return
    from openjarvis.runtime.torch.engine import TorchEngine

    assert spec.engine == "torch" and prepared.model is not None, "a torch engine's run"
    settings = torch_settings(spec.engine_spec())
    for rows in [int(n) for n in args.prompt_rows.split(",")]:
        print(f"decode_prompt_rows {rows}:")
        engine = TorchEngine(prepared.model.path, replace(settings, decode_prompt_rows=rows))
        completions, alone_s = generations(engine, tasks, requests, spec.concurrency)
        report(run, phase_s, completions, alone_s)


def generations(
    engine: Engine, tasks: list[Task], requests: list[Request], concurrency: int
) -> tuple[list[Completion], float]:
    """The tasks' requests through the engine, `concurrency` at once, and their wall time;
    the engine is closed after."""
    try:
        answer_task(engine, tasks[0], requests[0])  # warm-up: the engine's first step
        step_counts = getattr(engine, "step_counts", None)  # the torch engine's
        steps_before = step_counts() if step_counts is not None else None
        started = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            completions = list(pool.map(answer_task, [engine] * len(tasks), tasks, requests))
        alone_s = time.monotonic() - started
        if step_counts is not None and steps_before is not None:
            steps = step_counts().since(steps_before)
            print(f"the generations alone, the engine's steps: {steps.text(alone_s)}")
    finally:
        engine.close()
    return completions, alone_s


def report(run: RunRecord, phase_s: float, completions: list[Completion], alone_s: float) -> None:
    tokens = sum(c.completion_tokens for c in completions)
    rates = [r for c in completions if (r := c.decode_tokens_per_s) is not None]
    print(
        f"run {run.id}: {len(completions)} tasks at concurrency {run.concurrency}; task phase "
        f"{phase_s:.2f} s; the generations alone {alone_s:.2f} s ({tokens} tokens); "
        f"ratio {phase_s / alone_s:.2f} (goal <= 1.3); per-sequence decode of the generations "
        f"alone: median {statistics.median(rates):.1f} tok/s"
    )


if __name__ == "__main__":
    main()

"""`ipw measure` as data flows: generate inside energy windows, score outside
them in the sandbox, and save each task to the store at once.
"""

import os
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from openjarvis import __version__
from openjarvis.errors import RunInterrupted, UserError
from openjarvis.evals import run_energy
from openjarvis.evals.config import PreparedRun, RunConfig, prepare
from openjarvis.evals.judge import OpenJudge, judging, opened_judge
from openjarvis.evals.prompting import Prompting, answer_task, run_prompting, task_request
from openjarvis.evals.sandbox import Sandbox
from openjarvis.evals.scoring import score_completions
from openjarvis.evals.types import Task
from openjarvis.hostinfo import describe_host
from openjarvis.metrics import (
    RunFigures,
    compute_figures,
    phase_energy,
    sum_or_none,
    task_figures,
    union_energy,
    window_flags,
)
from openjarvis.power import Meter, WindowHandle, quiet
from openjarvis.power.edges import mean_batch
from openjarvis.power.types import IdleBaseline, Scope, SourceEnergy, WindowEnergy
from openjarvis.records import EnergyRecord, PowerSampleRecord, RunRecord, TaskResultRecord
from openjarvis.runtime.engines import open_engine
from openjarvis.runtime.heap import frozen_heap
from openjarvis.runtime.model_kind import read_model_kind
from openjarvis.runtime.parameters import model_parameters
from openjarvis.runtime.types import Completion, Engine
from openjarvis.store import Store, open_store

__all__ = ["MeasureResult", "prepare_resume", "resume_measure", "run_measure"]


@dataclass(slots=True)
class MeasureResult:
    run_id: str
    model_name: str
    figures: RunFigures
    energy_scope: Scope
    energy_method: str | None
    energy_note: str | None  # why energy is missing or estimated, for the summary
    sandbox_isolation: str
    sandbox_note: str
    unavailable_sources: list[str] = field(default_factory=list)
    resumed_tasks: int = 0  # tasks finished by an earlier, interrupted process
    # Median share of the memory bandwidth that decode used (decode rate x bytes per token /
    # bandwidth), over this process's completions; None when the engine cannot know it (cloud,
    # GPU offload).
    memory_bandwidth_utilisation: float | None = None
    # Tasks whose windows were short for the counters, overlapped others, or carry a large tail.
    window_flags: dict[str, int] = field(default_factory=dict)
    # This process's windows against the counters over the same time (a ratio near 1: no
    # joule lost between windows).
    conservation: dict[str, float | None] = field(default_factory=dict)
    # J per prompt token (prefill) and per output token (decode), split at the first token.
    phase_energy: dict[str, float | None] = field(default_factory=dict)
    # {"in_scope": [...], "out_of_scope": [...], "missing": {name: reason}}, as the run stores it.
    energy_coverage: dict[str, object] = field(default_factory=dict)
    model_kind: str | None = None  # "base" or "chat" from the GGUF header; None: unknown
    prompting: dict[str, Prompting] = field(default_factory=dict)  # per task kind
    # Tasks in flight, how many shared their energy, their mean batch, and the union of this
    # process's windows per task (the exact J/task; `concurrency_figures` in run_energy).
    concurrency: dict[str, object] = field(default_factory=dict)


# Called once with the number of tasks left, then after each task with (task_id, passed, n).
StartCallback = Callable[[int], None]
ProgressCallback = Callable[[str, int, int], None]
# Called with the run's id once its row is written (or resumed): the supervising parent's news.
RunCallback = Callable[[str], None]


def run_measure(
    prepared: PreparedRun,
    db_url: str | None = None,
    on_start: StartCallback = lambda total: None,
    on_task: ProgressCallback = lambda task_id, passed, samples: None,
    on_run: RunCallback = lambda run_id: None,
) -> MeasureResult:
    """Run a prepared configuration (evals/config.py: every option already checked, before any
    row) with the meter on, and store it in `db_url`."""
    spec, model, tasks = prepared.config, prepared.model, list(prepared.suite.tasks)
    engine = open_engine(spec.engine_spec(), model)
    try:
        sandbox = Sandbox.detect()
        # The judge's engine opens with the judged model's, and the database once the meter has
        # taken the scope and claimed its sources: a run refused on the way (a judge that cannot
        # start, an empty scope, a source another measurement holds) leaves no file and no row.
        with (
            opened_judge(spec.judge, prepared.judge_model) as judge,
            _metering(spec, engine) as (meter, shared_with),
            open_store(db_url) as store,
        ):
            # What else the machine does while idle is measured, and during the tasks.
            with run_energy.watching_machine("idle", meter) as idle_watch:
                idle = meter.measure_idle(spec.idle_seconds) if spec.idle_seconds > 0 else None
            gpus = tuple(run_energy.gpu_description(s) for s in meter.sources if s.domain == "gpu")
            kind = read_model_kind(model.path) if model else None  # cloud: not known
            prompting = run_prompting(tasks, kind.kind if kind else None)
            run = RunRecord(
                model_name=model.name if model else engine.model_name,
                model_path=str(model.path) if model else None,
                model_sha256=model.sha256 if model else None,
                engine=engine.kind,
                engine_settings=engine.settings_dict(),
                suite=prepared.suite.name,
                options=_options(sandbox, prompting),
                energy_scope=spec.scope,
                energy_method=run_energy.energy_method(meter, engine),
                sandbox_isolation=sandbox.isolation,
                tool_version=__version__,
                model_quantisation=model.quantisation if model else None,
                model_parameters=model_parameters(model.path) if model else None,
                model_kind=kind.kind if kind else None,
                model_kind_evidence=kind.evidence if kind else None,
                idle_power_w=dict(idle.power_w) if idle else {},
                host=describe_host(gpus=gpus),
                energy_coverage=meter.coverage.to_dict(),
                concurrency=spec.concurrency,
                config=spec.to_dict(),
                suite_sha256=prepared.suite.sha256,
            )
            if shared_with:  # measured beside another measurement (--allow-shared)
                run.options["shared_machine"] = sorted(shared_with)
            run_id = store.create_run(run)
            run.id = run_id
            on_run(run_id)
            result = _measure_tasks(
                spec, run, judge, tasks, engine, sandbox, meter, store, on_start, on_task,
                idle_watch,
            )  # fmt: skip
            return replace(result, energy_coverage=run.energy_coverage)
    finally:
        engine.close()


def prepare_resume(run: RunRecord, allow_shared: bool = False) -> PreparedRun:
    """The configuration an interrupted run started with, checked again as a new run's is, and
    refused when its suite or model changed since: nothing is written here."""
    if run.state == "complete":
        raise UserError(f"run {run.id} is already complete; nothing to resume")
    if run.config is None:
        raise UserError(
            f"run {run.id} was stored before ipw kept a run's configuration, so it cannot be "
            "continued; start a new run with the same options"
        )
    config = RunConfig.from_dict(run.config)
    prepared = prepare(replace(config, allow_shared=config.allow_shared or allow_shared))
    if prepared.suite.sha256 != run.suite_sha256:
        raise UserError(
            f"suite {run.suite} changed since run {run.id} started (its tasks hash differently);"
            " start a new run instead of resuming"
        )
    model = prepared.model
    if model is not None and model.sha256 != run.model_sha256:
        raise UserError(
            f"the model file {model.path} changed since run {run.id} started (sha256 differs);"
            " start a new run instead of resuming"
        )
    return prepared


def resume_measure(
    run_id: str,
    db_url: str | None = None,
    on_start: StartCallback = lambda total: None,
    on_task: ProgressCallback = lambda task_id, passed, samples: None,
    allow_shared: bool = False,
    on_run: RunCallback = lambda run_id: None,
) -> MeasureResult:
    """Finish an interrupted run with its stored configuration; no finished task is run again."""
    with open_store(db_url) as store:
        run = store.get_run(run_id)
        prepared = prepare_resume(run, allow_shared)
        spec, tasks = prepared.config, list(prepared.suite.tasks)
        engine = open_engine(spec.engine_spec(), prepared.model)
        try:
            sandbox = Sandbox.detect()
            with (
                opened_judge(spec.judge, prepared.judge_model) as judge,
                _metering(spec, engine) as (meter, shared_with),
            ):
                run_energy.check_same_gpus(run, meter.coverage.to_dict())
                if shared_with:  # this part shared the machine: said in its summary
                    run.options["shared_machine"] = sorted(shared_with)
                # The idle baseline of the original run keeps net energy comparable across parts.
                meter.idle = IdleBaseline(spec.idle_seconds, dict(run.idle_power_w))
                store.resume_run(run.id or run_id)
                on_run(run.id or run_id)
                result = _measure_tasks(
                    spec, run, judge, tasks, engine, sandbox, meter, store, on_start, on_task,
                    None,  # the idle was measured by the part that started the run
                )  # fmt: skip
                coverage = run.energy_coverage or meter.coverage.to_dict()  # older runs: now
                return replace(result, energy_coverage=coverage)
        finally:
            engine.close()


def _measure_tasks(
    spec: RunConfig,
    run: RunRecord,
    judge: OpenJudge | None,
    tasks: list[Task],
    engine: Engine,
    sandbox: Sandbox,
    meter: Meter,
    store: Store,
    on_start: StartCallback,
    on_task: ProgressCallback,
    idle_watch: quiet.Watch | None,
) -> MeasureResult:
    """The tasks measured (judged where the run has a judge) while what else the machine does is
    watched; the run finished with its summary and that check. A new run and a resumed one
    alike."""
    executed: tuple[MeasureResult, dict[str, object]] | None = None
    try:
        with (
            frozen_heap(),  # what start-up built lives as long as the run: no collection walks it
            judging(judge, tasks, meter, store, run) as judged_tasks,
            run_energy.watching_machine("tasks", meter) as tasks_watch,
        ):
            executed = _execute(
                spec, run, judged_tasks, engine, sandbox, meter, store, on_start, on_task,
                tasks_watch,
            )  # fmt: skip
        check = run_energy.machine_check((idle_watch, tasks_watch), meter)
    except BaseException:
        if executed is not None:  # the tasks were measured; what followed them failed
            store.finish_run(executed[0].run_id, "failed", None)
        raise
    result, summary = executed
    # The summary is written once, complete: the figures, and what else the machine did.
    store.finish_run(result.run_id, "complete", {**summary, "machine": check.to_dict()})
    result.energy_note = run_energy.busy_note(check, result.energy_note)
    return result


def _metering(
    spec: RunConfig, engine: Engine
) -> AbstractContextManager[tuple[Meter, dict[str, str]]]:
    holder = f"ipw measure {spec.suite.name} on {engine.model_name}"
    return run_energy.metering(engine, spec.scope, spec.gpus, spec.allow_shared, holder)


def _execute(
    spec: RunConfig,
    run: RunRecord,
    tasks: list[Task],
    engine: Engine,
    sandbox: Sandbox,
    meter: Meter,
    store: Store,
    on_start: StartCallback,
    on_task: ProgressCallback,
    tasks_watch: quiet.Watch,
) -> tuple[MeasureResult, dict[str, object]]:
    run_id = run.id or ""
    done = {result.task_id for result in store.task_results(run_id)}
    pending = [task for task in tasks if task.task_id not in done]
    prompting = _prompting_of(run, tasks)
    on_start(len(pending))
    # Trace times are seconds since the run started, also across resumed processes.
    started_at = run.started_at or datetime.now(UTC)
    trace_origin_s = time.monotonic() - (datetime.now(UTC) - started_at).total_seconds()
    seen: list[Completion] = []  # this process's completions, for MBU and cost
    # Shared steps split by the engine's own ledger (none for an engine without one).
    meter.follow(engine.ledger)
    # A task is saved once the meter has published its windows settled: its tail (the device
    # winding down until the next task's window opens, at most about a second) is known about a
    # refresh after the tail ends, whatever else is in flight; each arriving task saves the
    # tasks settled by then (reading the windows' published records, no computation). A crash
    # loses the tasks in flight and those that finished in the second or so before it.
    unsaved: list[_Measured] = []
    saved: list[TaskResultRecord] = []

    def save(measured: _Measured, windows: list[WindowEnergy]) -> None:
        record = measured.record(windows)
        store.save_task_result(run_id, record)
        saved.append(record)
        samples = [
            PowerSampleRecord(s.source, s.time_s - trace_origin_s, s.power_w)
            for s in meter.drain_trace()
        ]
        store.add_power_samples(run_id, samples)
        on_task(measured.task.task_id, record.passed, record.samples)

    def save_settled() -> None:
        for measured in list(unsaved):  # in flight beside others, tasks settle in any order
            if (windows := measured.settled()) is not None:
                unsaved.remove(measured)
                save(measured, windows)

    def save_the_rest() -> None:
        meter.settle()  # the last tail ends now: every window settles about a refresh later
        while unsaved:
            measured = unsaved.pop(0)
            save(measured, [handle.wait_settled() for handle in measured.handles])

    # Ctrl-C (or SIGTERM, which the CLI turns into one) leaves the run interrupted and raises
    # RunInterrupted with its id and saved tasks, so the CLI can say how to resume.
    try:
        measured_tasks = _measured_tasks(spec, pending, prompting, engine, sandbox, meter)
        with closing(measured_tasks):  # on any error, the tasks in flight end first
            for measured in measured_tasks:
                seen.extend(measured.completions)
                unsaved.append(measured)
                save_settled()
        save_the_rest()
        # The task phase ends with the last task saved: the idle measured after it is not
        # the tasks' time (benchmarks/measure_phase.py compares this stretch with the
        # generations alone).
        tasks_watch.stop()
        idle_after = run_energy.idle_after(spec.idle_seconds, meter, engine)
    except BaseException as error:
        if unsaved and isinstance(error, KeyboardInterrupt | Exception):
            try:
                save_the_rest()  # finished tasks are kept, with the tail known so far
            except Exception as saving:  # the store itself failing: the first error is the news
                error.add_note(f"saving the finished tasks failed too: {saving}")
        interrupted = isinstance(error, KeyboardInterrupt)
        store.finish_run(run_id, "interrupted" if interrupted else "failed", None)
        if interrupted:
            raise RunInterrupted(run_id, len(store.task_results(run_id))) from None
        raise
    if idle_after is not None:
        store.set_idle_power(run_id, dict(idle_after.power_w), after=True)
    # Figures come from the stored results, so a resumed run counts every task exactly once.
    results = store.task_results(run_id)
    idle_error_w = run_energy.idle_error_w(meter, idle_after)
    mbu = [c.memory_bandwidth_utilisation for c in seen if c.memory_bandwidth_utilisation]
    mbu_median = float(np.median(mbu)) if mbu else None
    costs = [c.cost_usd for c in seen]
    cost_usd = sum(c for c in costs if c is not None) if costs and None not in costs else None
    flags = window_flags(results)
    total = meter.total()
    conservation = run_energy.conservation(total, saved, engine)
    concurrency = run_energy.concurrency_figures(total, saved, results, engine, spec.concurrency)
    # As `ipw show` computes them from the stored run (metrics.run_figures): power over the union
    # of the windows the concurrency figures hold.
    figures = compute_figures(
        [task_figures(r) for r in results],
        idle_error_w=idle_error_w,
        union=union_energy(concurrency),
    )
    phases = phase_energy(results)
    summary = {
        **figures.to_dict(),
        "memory_bandwidth_utilisation": mbu_median,
        "cost_usd": cost_usd,  # paid APIs only; None when any price is unknown
        "idle_error_w": idle_error_w,
        "windows": flags,
        "conservation": conservation,
        "phase_energy": phases,
        "concurrency": concurrency,
    }
    result = MeasureResult(
        run_id=run_id,
        model_name=run.model_name,
        figures=figures,
        energy_scope=spec.scope,
        energy_method=run_energy.energy_method(meter, engine),
        energy_note=run_energy.shared_note(run, run_energy.energy_note(meter, engine, results)),
        sandbox_isolation=sandbox.isolation,
        sandbox_note=sandbox.isolation_note,
        # Sources present but unreadable; hardware this machine does not have (no-device) is
        # left to `ipw power`, or every summary would list every vendor's library.
        unavailable_sources=[
            f"{s.name}: {s.detail or s.reason}"
            for s in meter.statuses
            if not s.available and s.reason != "no-device"
        ],
        resumed_tasks=len(done),
        model_kind=run.model_kind,
        prompting=prompting,
        memory_bandwidth_utilisation=mbu_median,
        window_flags=flags,
        conservation=conservation,
        phase_energy=phases,
        concurrency=concurrency,
    )
    return result, summary


@dataclass(slots=True)
class _Measured:
    """A task generated and scored whose windows may still be settling."""

    task: Task
    completions: list[Completion]
    handles: list[WindowHandle]
    statuses: list[str]

    def settled(self) -> list[WindowEnergy] | None:
        windows = [handle.settled() for handle in self.handles]
        known = [window for window in windows if window is not None]
        return known if len(known) == len(windows) else None

    def record(self, windows: list[WindowEnergy]) -> TaskResultRecord:
        estimated = [
            run_energy.estimated_window(window, completion)
            for window, completion in zip(windows, self.completions, strict=True)
        ]
        return _task_record(self.task, self.completions, estimated, self.statuses)


_Generated = tuple[Task, list[Completion], list[WindowHandle]]


def _measured_tasks(
    spec: RunConfig,
    tasks: list[Task],
    prompting: dict[str, Prompting],
    engine: Engine,
    sandbox: Sandbox,
    meter: Meter,
) -> Generator[_Measured]:
    """The tasks generated and scored, in the order they finish.

    One at a time, each task generates in this thread (Ctrl-C stops the generation itself).
    With `spec.concurrency` above 1, that many tasks generate at once in worker threads, and a
    task that has generated is scored in a pool of scorers (outside its windows, though while
    other tasks generate) while the next task starts generating at once: scored in this thread,
    one slow test (a timeout) held back the next tasks, and the engine's batch drained
    (docs/benchmarks.md). The scorers are as many as the CPUs, at most `spec.concurrency`: each
    runs a sandboxed program. Closing the iterator (an error, Ctrl-C) starts no more tasks and
    waits for those in flight: they are dropped, and the engine is idle when the caller closes
    it.
    """

    def generate(task: Task) -> _Generated:
        return _generate(spec, task, prompting, engine, meter)

    def scored(generated: _Generated) -> _Measured:
        task, completions, handles = generated
        # Scoring runs after the windows closed: tests are not charged to the model.
        outcomes = score_completions(
            [(task, c.text) for c in completions], sandbox, timeout_s=spec.timeout_s
        )
        return _Measured(task, completions, handles, [o.status for o in outcomes])

    if spec.concurrency == 1:
        for task in tasks:
            yield scored(generate(task))
        return
    stopping = threading.Event()

    def generate_unless_stopping(task: Task) -> _Generated | None:
        return None if stopping.is_set() else generate(task)

    waiting = iter(tasks)
    generating: set[Future[_Generated | None]] = set()
    scoring: set[Future[_Measured]] = set()
    scorers = min(spec.concurrency, os.cpu_count() or 1)
    with (
        ThreadPoolExecutor(spec.concurrency, thread_name_prefix="ipw-task") as pool,
        ThreadPoolExecutor(scorers, thread_name_prefix="ipw-score") as scorer_pool,
    ):

        def fill() -> None:  # start tasks until `concurrency` are generating
            while len(generating) < spec.concurrency and (task := next(waiting, None)):
                generating.add(pool.submit(generate_unless_stopping, task))

        try:
            fill()
            while generating or scoring:
                either: list[Future[Any]] = [*generating, *scoring]
                done = wait(either, return_when=FIRST_COMPLETED).done
                for future in done & generating:
                    generating.discard(future)
                    one = future.result()  # a worker's error: raised
                    if one is not None:
                        scoring.add(scorer_pool.submit(scored, one))
                fill()  # before anything else, so that the engine keeps its batch
                for future in done & scoring:
                    scoring.discard(future)
                    yield future.result()
        finally:
            stopping.set()
            pool.shutdown(wait=True, cancel_futures=True)
            scorer_pool.shutdown(wait=True, cancel_futures=True)


def _generate(
    spec: RunConfig,
    task: Task,
    prompting: dict[str, Prompting],
    engine: Engine,
    meter: Meter,
) -> _Generated:
    """A task's samples, each in its own energy window."""
    completions: list[Completion] = []
    handles: list[WindowHandle] = []
    for sample in range(spec.samples):
        request = task_request(task, prompting[task.kind], spec.temperature, spec.seed + sample)
        with meter.window(f"{task.task_id}#{sample}") as window:
            # A batching engine files the request's steps under the window's key: how the
            # energy of the steps it shares with other tasks splits.
            completion = answer_task(engine, task, replace(request, ledger_key=window.key))
            if completion.ttft_s is not None:  # prefill energy: the window's part until then
                window.mark_first_token(window.start_s + completion.ttft_s)
        completions.append(completion)
        handles.append(window)
    return task, completions, handles


def _task_record(
    task: Task, completions: list[Completion], windows: list[WindowEnergy], statuses: list[str]
) -> TaskResultRecord:
    """Fold a task's samples into one record: energy summed per source over its windows."""
    by_source: dict[str, list[SourceEnergy]] = {}
    for window in windows:
        for source in window.sources:
            by_source.setdefault(source.source, []).append(source)
    energy = tuple(
        EnergyRecord(
            source=name,
            domain=parts[0].domain,
            method=parts[0].method,
            energy_j=sum_or_none([p.energy_j for p in parts]),
            net_energy_j=sum_or_none([p.net_energy_j for p in parts]),
            idle_power_w=parts[0].idle_power_w,
            null_reason=next((p.null_reason for p in parts if p.null_reason), None),
            low_resolution=any(p.low_resolution for p in parts),
        )
        for name, parts in by_source.items()
    )
    ttfts = [c.ttft_s for c in completions if c.ttft_s is not None]
    rates = [r for c in completions if (r := c.decode_tokens_per_s) is not None]
    prefills = [w.prefill_energy_j for w in windows]
    return TaskResultRecord(
        task_id=task.task_id,
        samples=len(completions),
        passed=sum(status == "passed" for status in statuses),
        latency_s=sum(w.duration_s for w in windows),
        ttft_s=sum(ttfts) / len(ttfts) if ttfts else None,
        decode_tokens_per_s=sum(rates) / len(rates) if rates else None,
        prompt_tokens=sum(c.prompt_tokens for c in completions),
        completion_tokens=sum(c.completion_tokens for c in completions),
        energy_j=sum_or_none([w.energy_j for w in windows]),
        net_energy_j=sum_or_none([w.net_energy_j for w in windows]),
        energy_null_reason=next((w.null_reason for w in windows if w.null_reason), None),
        completions=tuple(c.text for c in completions),
        statuses=tuple(statuses),
        energy=energy,
        tail_energy_j=sum_or_none([w.tail_energy_j for w in windows]),
        prefill_energy_j=sum_or_none(prefills),
        decode_energy_j=sum_or_none([w.decode_energy_j for w in windows]),
        overlapped=any(w.overlapped for w in windows),
        shared=any(w.shared for w in windows),
        mean_batch=mean_batch([piece for c in completions for piece in c.work]),
    )


def _options(sandbox: Sandbox, prompting: dict[str, Prompting]) -> dict[str, object]:
    """What the run found at its start, beside its configuration: the sandbox and the
    prompting per task kind (a resumed run prompts as it did)."""
    return {"sandbox_note": sandbox.isolation_note, "prompting": prompting}


def _prompting_of(run: RunRecord, tasks: list[Task]) -> dict[str, Prompting]:
    """The prompting the run started with, so a resumed run prompts as it did; runs stored
    before it was recorded prompted every task by completion."""
    stored = run.options.get("prompting")
    if not isinstance(stored, dict):
        return run_prompting(tasks, None)
    # A kind the stored map lacks (a suite file edited since) gets this model's default.
    return {**run_prompting(tasks, run.model_kind), **stored}

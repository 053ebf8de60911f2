"""`ipw runs` and `ipw show`: list stored runs and show one, for people or as JSON.

Figures come from metrics; row shapes and number formatting from report.runs.
"""

import dataclasses
import json
from typing import Annotated, Any

import typer
from rich.table import Table

from openjarvis.cli.figure_text import (
    concurrency_rows,
    interval_text,
    output_token_text,
    prompt_token_text,
    windows_text,
)
from openjarvis.cli.options import SINCE_HELP, DatabaseOption, JsonOption, parse_since
from openjarvis.cli.output import readable, stdout_console
from openjarvis.errors import UserError
from openjarvis.evals.judge import judge_run_id
from openjarvis.evals.prompting import describe_prompting
from openjarvis.metrics import RunFigures, phase_energy, run_figures, window_flags
from openjarvis.report.runs import (
    FIGURE_COLUMNS,
    busy_evidence,
    coverage_missing,
    coverage_names,
    energy_label,
    figure,
    format_value,
    host_label,
    mark_estimate,
    model_label,
    run_row,
    run_to_dict,
    scope_label,
)
from openjarvis.store import RunRecord, TaskResultRecord, open_reader, shown_state

__all__ = ["runs_command", "show_command"]


def runs_command(
    model: Annotated[str | None, typer.Option(help="Only this model (by name)")] = None,
    host: Annotated[str | None, typer.Option(help="Only this hostname or fingerprint")] = None,
    suite: Annotated[str | None, typer.Option(help="Only this suite")] = None,
    since: Annotated[
        str | None, typer.Option(help=f"Only runs started on or after DATE, {SINCE_HELP}")
    ] = None,
    limit: Annotated[int, typer.Option(help="Show at most N runs, newest first")] = 50,
    db: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """List stored runs, newest first."""
    if limit < 1:
        raise UserError(f"--limit must be at least 1 (got {limit})")
    since_time = parse_since(since)
    with open_reader(db) as store:
        runs = store.list_runs(limit=limit, model=model, host=host, suite=suite, since=since_time)
        saved = store.saved_task_counts([run.id or "" for run in runs])
        url = store.url
    console = stdout_console()
    if json_output:
        rows = [
            {**run_row(run), "shown_state": shown_state(run), "saved_tasks": saved[run.id or ""]}
            for run in runs
        ]
        console.file.write(json.dumps(rows, indent=2) + "\n")
        return
    if not runs:
        console.print(f"no runs match in {url}; `ipw measure` records one")
        return
    table = Table(title=f"runs in {url}")
    table.add_column("run", no_wrap=True)
    for heading in ("started", "state", "model", "host", "suite", "tasks", "accuracy"):
        table.add_column(heading)
    table.add_column("J per task", justify="right")
    table.add_column("accuracy per J", justify="right")
    table.add_column("energy")
    for run in runs:
        started = run.started_at.astimezone() if run.started_at else None
        table.add_row(
            (run.id or "")[:8],
            started.strftime("%Y-%m-%d %H:%M") if started else "—",
            shown_state(run),
            model_label(run),
            host_label(run),
            run.suite,
            str(saved[run.id or ""]),
            format_value(figure(run, "accuracy")[0]),
            mark_estimate(format_value(figure(run, "mean_energy_j")[0]), run),
            mark_estimate(format_value(figure(run, "accuracy_per_joule")[0]), run),
            energy_label(run),
        )
    console.print(readable(table))


def show_command(
    run: Annotated[str, typer.Argument(help="Run id (a unique prefix is enough)")],
    db: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Show one run: what ran where, its figures with 95 % intervals, and every task."""
    with open_reader(db) as store:
        record = store.get_run(run)
        tasks = store.task_results(record.id or run)
        judge_id = judge_run_id(store, record.id or run)
    figures = run_figures(record, tasks) if tasks else None
    state = shown_state(record)
    note = None if state == "complete" else f"run is {state}: figures are partial"
    console = stdout_console()
    if json_output:
        data: dict[str, Any] = {
            "run": {**run_to_dict(record), "shown_state": state},
            "figures": figures.to_dict() if figures else None,
            "figures_note": note,
            "judge_run": judge_id,
            "tasks": [dataclasses.asdict(task) for task in tasks],
        }
        console.file.write(json.dumps(data, indent=2) + "\n")
        return
    console.print(readable(_metadata_table(record)))
    if figures is None:
        console.print("no tasks saved: no figures")
        return
    console.print(readable(_figures_table(record, figures, tasks)))
    if note:
        console.print(f"[yellow]note:[/] {note}")
    summary = record.summary or {}
    # Counted from the saved tasks (as `ipw measure` counted them), so older runs say it too.
    flags = window_flags(tasks)
    windows = windows_text(flags, summary.get("conservation"), always_ratio=True)
    if windows:
        console.print(f"[dim]windows: {windows}[/]")
    if judge_id is not None:
        console.print(
            f"judged by run {judge_id[:8]} (`ipw show {judge_id[:8]}`): the judge's own energy "
            "is there, not in this run's figures"
        )
    if evidence := busy_evidence(record):
        console.print(f"[yellow]busy-machine:[/] {'; '.join(evidence)}")
    console.print(readable(_tasks_table(record, tasks)))


def _metadata_table(run: RunRecord) -> Table:
    table = Table(title=f"run {run.id}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    started = run.started_at.astimezone().isoformat(timespec="seconds") if run.started_at else "—"
    finished = (
        run.finished_at.astimezone().isoformat(timespec="seconds") if run.finished_at else "—"
    )
    rows = [
        ("state", shown_state(run)),
        ("process", _process_text(run)),
        ("started / finished", f"{started} / {finished}"),
        ("model", model_label(run)),
        ("model file", f"{run.model_path or '—'} (sha256 {run.model_sha256 or '—'})"),
        ("parameters", f"{run.model_parameters:,}" if run.model_parameters else "—"),
        ("model kind", _model_kind_text(run)),
        ("prompting", describe_prompting(run.options.get("prompting"))),
        ("engine", f"{run.engine} {json.dumps(run.engine_settings, sort_keys=True)}"),
        ("suite", f"{run.suite} (sha256 {run.suite_sha256 or '— (stored before it was kept)'})"),
        ("configuration", json.dumps(run.config, sort_keys=True) if run.config else "—"),
        ("options", json.dumps(run.options, sort_keys=True)),
        ("concurrency", f"{run.concurrency} task(s) in flight at once"),
        (
            "energy",
            f"method {run.energy_method or 'none'} · "
            f"scope {scope_label(run.energy_scope, run.energy_coverage)}",
        ),
        *_coverage_rows(run),
        ("idle power (W)", json.dumps(run.idle_power_w, sort_keys=True)),
        ("sandbox", run.sandbox_isolation),
        ("openjarvis", run.tool_version),
    ]
    host = run.host
    if host is not None:
        rows += [
            ("host", f"{host.hostname} (fingerprint {host.fingerprint})"),
            (
                "cpu",
                f"{host.cpu_model}, {_count(host.cpu_physical_cores)}/"
                f"{_count(host.cpu_logical_cores)} cores",
            ),
            ("memory", f"{host.memory_bytes / 2**30:.1f} GiB"),
            ("gpus", ", ".join(host.gpus) or "none"),
            ("gpu driver", host.gpu_driver or "—"),
            ("os", host.os),
        ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _model_kind_text(run: RunRecord) -> str:
    if run.model_kind is None and run.model_kind_evidence is None:
        return "unknown (a cloud model, or the run predates reading it)"
    return f"{run.model_kind or 'unknown'} ({run.model_kind_evidence})"


def _coverage_rows(run: RunRecord) -> list[tuple[str, str]]:
    """What the energy scope covered: sources in it, GPUs left out, sources it could not read."""
    coverage = run.energy_coverage
    if not coverage:
        return [("in scope", "not recorded (the run predates energy coverage)")]
    missing = coverage_missing(coverage)
    return [
        ("in scope", ", ".join(coverage_names(coverage, "in_scope")) or "none"),
        ("out of scope", ", ".join(coverage_names(coverage, "out_of_scope")) or "none"),
        ("missing", ", ".join(f"{name} ({why})" for name, why in missing.items()) or "none"),
    ]


def _process_text(run: RunRecord) -> str:
    if run.process_pid is None:
        return "—"
    beat = run.heartbeat_at.astimezone().isoformat(timespec="seconds") if run.heartbeat_at else "—"
    return f"pid {run.process_pid} on {run.process_host} · last heartbeat {beat}"


def _figures_table(run: RunRecord, figures: RunFigures, tasks: list[TaskResultRecord]) -> Table:
    table = Table(title=f"figures over {figures.tasks} tasks · {figures.samples} sample(s) each")
    table.add_column("figure")
    table.add_column("value [95 % interval]", justify="right")
    phase = phase_energy(tasks)
    for name, heading in FIGURE_COLUMNS.items():
        estimate = getattr(figures, name)
        if name == "joules_per_output_token":
            text = output_token_text(estimate, phase)
        else:
            text = interval_text(estimate)
        table.add_row(heading, text if name == "accuracy" else mark_estimate(text, run))
        if name == "accuracy":
            for k, estimate in figures.pass_at_k.items():
                if k > 1:  # pass@1 is the accuracy
                    table.add_row(f"pass@{k}", interval_text(estimate))
    table.add_row(
        "J per solved task", mark_estimate(interval_text(figures.joules_per_solved_task), run)
    )
    table.add_row("J per prompt token (prefill)", mark_estimate(prompt_token_text(phase), run))
    for name, value in concurrency_rows((run.summary or {}).get("concurrency")):
        table.add_row(name, mark_estimate(value, run))
    table.add_row("decode tokens/s (median)", format_value(figures.decode_tokens_per_s))
    table.add_row(
        "latency p50 / p95 (s)",
        f"{format_value(figures.latency_p50_s)} / {format_value(figures.latency_p95_s)}",
    )
    return table


def _tasks_table(run: RunRecord, tasks: list[TaskResultRecord]) -> Table:
    table = Table(title="tasks")
    for heading in ("task", "passed", "latency s", "TTFT s", "decode tok/s", "tokens in/out"):
        table.add_column(heading, justify="left" if heading == "task" else "right", no_wrap=True)
    table.add_column("J", justify="right")
    table.add_column("net J", justify="right")
    table.add_column("tail J", justify="right")
    table.add_column("note")
    for task in tasks:
        failures = sorted({status for status in task.statuses if status != "passed"})
        table.add_row(
            task.task_id,
            f"{task.passed}/{task.samples}",
            format_value(task.latency_s),
            format_value(task.ttft_s),
            format_value(task.decode_tokens_per_s),
            f"{task.prompt_tokens}/{task.completion_tokens}",
            mark_estimate(format_value(task.energy_j), run),
            mark_estimate(format_value(task.net_energy_j), run),
            format_value(task.tail_energy_j),
            "; ".join(filter(None, [task.energy_null_reason, _shared_text(task), *failures]))[:60],
        )
    return table


def _count(value: int | None) -> str:
    return "—" if value is None else str(value)


def _shared_text(task: TaskResultRecord) -> str | None:
    """A task whose energy is its share of steps it ran in with others, and at what batch."""
    if not task.shared:
        return None
    return f"shared, batch {format_value(task.mean_batch, 2)}"

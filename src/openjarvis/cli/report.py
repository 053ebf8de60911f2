"""`ipw report`: write the HTML report (with plots) plus Markdown, CSV and JSON of stored runs.

Matplotlib is imported only by the report's plot workers, so other commands start fast.
"""

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from openjarvis.cli.options import SINCE_HELP, DatabaseOption, parse_since
from openjarvis.errors import UserError
from openjarvis.store import PowerSeries, RunRecord, Store, open_reader

__all__ = ["report_command"]

DEFAULT_TRACES = 3
TRACE_CANDIDATES = 10  # newest runs searched for a power trace when none is named


def report_command(
    out: Annotated[Path, typer.Option(help="Folder for report.html, .md, .csv, .json")] = Path(
        "ipw-report"
    ),
    model: Annotated[str | None, typer.Option(help="Only this model (by name)")] = None,
    host: Annotated[str | None, typer.Option(help="Only this hostname or fingerprint")] = None,
    suite: Annotated[str | None, typer.Option(help="Only this suite")] = None,
    since: Annotated[
        str | None, typer.Option(help=f"Only runs started on or after DATE, {SINCE_HELP}")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most N runs, newest first")] = None,
    trace: Annotated[
        list[str] | None,
        typer.Option(help="Draw this run's power trace (repeatable; default: newest 3 with one)"),
    ] = None,
    db: DatabaseOption = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the files written and the run counts as JSON")
    ] = False,
) -> None:
    """Write a self-contained HTML report of stored runs, plus Markdown, CSV and JSON."""
    from openjarvis.report.runs import newest_per_group
    from openjarvis.report.write import PlotWorkers, ReportData, write_report

    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1 (got {limit})")
    since_time = parse_since(since)  # a bad date is named before the database is looked for
    # Started first: the workers import matplotlib while this process reads the database.
    with PlotWorkers() as workers:
        with open_reader(db) as store:
            runs = store.list_runs(
                limit=limit, model=model, host=host, suite=suite, since=since_time
            )
            if not any(run.summary is not None for run in runs):
                raise UserError(
                    f"no finished runs match in {store.url}; record one with `ipw measure` or "
                    "loosen --model/--host/--suite/--since"
                )
            traces = _traces(store, runs, trace or [])
            # Tasks are loaded for the newest run of each configuration only: those the report
            # compares on shared tasks; older runs keep the summary `ipw measure` stored.
            tasks = {run.id: store.task_results(run.id) for run in newest_per_group(runs) if run.id}
            data = ReportData(runs, traces, store.url, datetime.now(UTC), tasks)
        try:
            files = write_report(data, out, workers)
        except OSError as error:
            raise UserError(
                f"cannot write the report to {out}: {error.strerror}; pick --out"
            ) from None
    if json_output:
        # What a script needs to pick the report up; its figures are in files.json.
        written = {
            "html": str(files.html),
            "markdown": str(files.markdown),
            "csv": str(files.csv),
            "json": str(files.json),
            "runs": len(runs),
            "runs_with_figures": sum(run.summary is not None for run in runs),
            "traced_runs": [run.id for run, _ in traces],
            "database": data.database,
        }
        typer.echo(json.dumps(written, indent=2))
        return
    console = Console()
    console.print(f"report: {files.html}")
    console.print(f"[dim]also {files.markdown}, {files.csv}, {files.json}[/]")


def _traces(
    store: Store, runs: list[RunRecord], named: list[str]
) -> list[tuple[RunRecord, dict[str, PowerSeries]]]:
    if named:
        chosen = []
        for run_id in named:
            run = store.get_run(run_id)
            samples = store.power_series(run.id or run_id)
            if not samples:
                raise UserError(f"run {run_id} has no power trace; leave it out of --trace")
            chosen.append((run, samples))
        return chosen
    found = []
    for run in runs[:TRACE_CANDIDATES]:
        samples = store.power_series(run.id or "")
        if samples:
            found.append((run, samples))
        if len(found) == DEFAULT_TRACES:
            break
    return found

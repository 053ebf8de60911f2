"""The `ipw` command: measure accuracy per joule, inspect energy sources.

Every UserError becomes one line on stderr and exit code 2, with no traceback.
"""

import faulthandler
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from openjarvis.cli import results
from openjarvis.cli.compare import compare_command
from openjarvis.cli.db import db_app
from openjarvis.cli.evals import score_command, suites_command
from openjarvis.cli.power import power_command
from openjarvis.cli.report import report_command
from openjarvis.cli.requests import requests_command
from openjarvis.errors import UserError

__all__ = ["app", "main"]

app = typer.Typer(
    help="OpenJarvis benchmarks: how much useful work a model does per joule on this machine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("power")(power_command)
app.command("requests")(requests_command)
app.command("runs")(results.runs_command)
app.command("show")(results.show_command)
app.command("compare")(compare_command)
app.command("report")(report_command)
app.command("suites")(suites_command)
app.command("score")(score_command)
app.add_typer(db_app, name="db")


@app.command()
def measure(
    model: Annotated[
        str | None, typer.Option(help="GGUF file (default: embedded Gemma 3 270M)")
    ] = None,
    suite: Annotated[str, typer.Option(help="Suite to run")] = "humaneval",
    limit: Annotated[int, typer.Option(help="Run the first N tasks")] = 20,
    all_tasks: Annotated[bool, typer.Option("--all", help="Run every task of the suite")] = False,
    samples: Annotated[int, typer.Option(help="Samples per task (pass@k for k <= n)")] = 1,
    temperature: Annotated[
        float | None,
        typer.Option(help="0 is greedy; default 0, or 0.8 when --samples is above 1"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of sample i is seed + i")] = 0,
    idle_seconds: Annotated[float, typer.Option(help="Idle power measured before the run")] = 10.0,
    scope: Annotated[str, typer.Option(help="Energy scope: system or accelerator")] = "system",
    db: Annotated[str | None, typer.Option(help="Database URL or path (or OPENJARVIS_DB)")] = None,
    n_ctx: Annotated[int, typer.Option(help="Context size in tokens")] = 4096,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads (default: physical cores)")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds allowed to each program's tests")] = 10.0,
    json_output: Annotated[bool, typer.Option("--json", help="Print the figures as JSON")] = False,
    resume: Annotated[
        str | None, typer.Option(help="Finish an interrupted run (its own options apply)")
    ] = None,
    engine: Annotated[
        str, typer.Option(help="llamacpp or torch (local), or a cloud engine: openai, anthropic")
    ] = "llamacpp",
    tp: Annotated[int, typer.Option(help="torch engine: tensor-parallel GPUs")] = 1,
    base_url: Annotated[str | None, typer.Option(help="Cloud engine's API base URL")] = None,
    api_key_env: Annotated[
        str | None, typer.Option(help="Variable holding the cloud engine's API key")
    ] = None,
) -> None:
    """Run a suite on a model with the energy meter on, score it, store it, print the summary."""
    from openjarvis.cli.summary import print_summary
    from openjarvis.evals.runner import MeasureSpec, resume_measure, run_measure

    if scope not in ("system", "accelerator"):
        raise UserError(
            f"unknown energy scope {scope!r}; use --scope system or --scope accelerator"
        )
    spec = MeasureSpec(
        model_path=model,
        suite=suite,
        limit=None if all_tasks else limit,
        samples=samples,
        temperature=(0.0 if samples == 1 else 0.8) if temperature is None else temperature,
        seed=seed,
        idle_seconds=idle_seconds,
        scope=scope,  # type: ignore[arg-type]  # checked above
        db_url=db,
        n_ctx=n_ctx,
        threads=threads,
        timeout_s=timeout,
        engine=engine,
        tp=tp,
        base_url=base_url,
        api_key_env=api_key_env,
    )
    progress_console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("passed {task.fields[passed]}"),
        TimeElapsedColumn(),
        console=progress_console,
        transient=True,
    ) as progress:
        bar = progress.add_task("measuring idle power", total=None, passed=0)

        def on_start(total: int) -> None:
            progress.update(bar, description=f"{spec.suite}", total=total)

        def on_task(task_id: str, passed: int, samples_run: int) -> None:
            done = progress.tasks[bar].fields["passed"] + (passed > 0)
            progress.update(bar, advance=1, passed=done, description=task_id)

        if resume is not None:
            result = resume_measure(resume, db, on_start=on_start, on_task=on_task)
        else:
            result = run_measure(spec, on_start=on_start, on_task=on_task)
    print_summary(result, Console(), as_json=json_output)


def main() -> None:
    # A native library that faults mid-run (llama.cpp, CUDA) still says where, instead of a
    # silent exit 132/139; finished tasks are already saved and `--resume` continues the run.
    faulthandler.enable()
    try:
        app()
    except UserError as error:
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: finished tasks are saved; the run is marked interrupted\n")
        sys.exit(130)

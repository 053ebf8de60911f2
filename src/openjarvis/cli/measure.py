"""`ipw measure`: its options become one RunConfig (evals/config.py), checked in full before
anything is written; then the run, its progress on stderr and its summary.
"""

import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Annotated

import typer

from openjarvis.cli.output import stdout_console
from openjarvis.cli.progress import measure_progress
from openjarvis.cli.supervise import announce_run
from openjarvis.errors import RunInterrupted, UserError
from openjarvis.evals.harness import FEWSHOT_SEED
from openjarvis.store import open_reader, refuse_if_live

__all__ = ["RESUME_OPTIONS", "measure_command"]

# With --resume a run continues with the configuration it was started with; only these may be
# given.
RESUME_OPTIONS = ("resume", "db", "json_output", "allow_shared")


def measure_command(
    ctx: typer.Context,
    model: Annotated[
        str | None, typer.Option(help="GGUF file (default: embedded Gemma 3 270M)")
    ] = None,
    suite: Annotated[str, typer.Option(help="Suite to run")] = "humaneval",
    limit: Annotated[int, typer.Option(help="Run the first N tasks (at least 1)")] = 20,
    all_tasks: Annotated[bool, typer.Option("--all", help="Run every task of the suite")] = False,
    samples: Annotated[
        int, typer.Option(help="Samples per task, at least 1 (pass@k for k <= n)")
    ] = 1,
    temperature: Annotated[
        float | None,
        typer.Option(help="0 or more; 0 is greedy; default 0, or 0.8 when --samples is above 1"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of sample i is seed + i (0 to 2^32 - n)")] = 0,
    idle_seconds: Annotated[
        float, typer.Option(help="Idle power measured before the run (0 or more; 0 skips it)")
    ] = 10.0,
    scope: Annotated[str, typer.Option(help="Energy scope: system or accelerator")] = "system",
    gpus: Annotated[
        str, typer.Option(help="GPUs metered: engine (those it runs on) or all (every visible)")
    ] = "engine",
    allow_shared: Annotated[
        bool,
        typer.Option(
            "--allow-shared",
            help="Measure even while another measurement holds a source in scope (marked)",
        ),
    ] = False,
    db: Annotated[str | None, typer.Option(help="Database URL or path (or OPENJARVIS_DB)")] = None,
    n_ctx: Annotated[int, typer.Option(help="Context size in tokens (at least 1)")] = 4096,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads, at least 1 (default: physical cores)")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds allowed to each program's tests (above 0)")
    ] = 10.0,
    json_output: Annotated[bool, typer.Option("--json", help="Print the figures as JSON")] = False,
    resume: Annotated[
        str | None,
        typer.Option(help="Finish an interrupted run with its own options (only --db, --json)"),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="llamacpp or torch (local), or a cloud engine: openai, anthropic")
    ] = "llamacpp",
    tp: Annotated[int, typer.Option(help="torch engine: tensor-parallel GPUs (at least 1)")] = 1,
    n_gpu_layers: Annotated[
        int,
        typer.Option(help="llamacpp engine: layers offloaded to the GPU (-1: all; default 0)"),
    ] = 0,
    concurrency: Annotated[
        int,
        typer.Option(
            help="Tasks in flight at once (1 or more, up to the engine's own limit); their "
            "energy is shared by the work each did"
        ),
    ] = 1,
    base_url: Annotated[str | None, typer.Option(help="Cloud engine's API base URL")] = None,
    meter: Annotated[
        str,
        typer.Option(
            help="openai engine: local (meter this machine: the server runs here), estimate "
            "(per-token table), or auto (local when --base-url is this machine)"
        ),
    ] = "auto",
    api_key_env: Annotated[
        str | None, typer.Option(help="Variable holding the cloud engine's API key")
    ] = None,
    num_fewshot: Annotated[
        int | None, typer.Option(help="lm-eval suites: few-shot examples (default: the task's)")
    ] = None,
    lm_eval_include: Annotated[
        str | None, typer.Option(help="lm-eval suites: a folder of your own task YAML files")
    ] = None,
    apply_chat_template: Annotated[
        bool,
        typer.Option(
            "--apply-chat-template",
            help="lm-eval suites: the prompt as chat messages in the model's own template",
        ),
    ] = False,
    fewshot_as_multiturn: Annotated[
        bool,
        typer.Option(
            "--fewshot-as-multiturn",
            help="lm-eval suites, with --apply-chat-template: each few-shot example as turns",
        ),
    ] = False,
    system_instruction: Annotated[
        str | None,
        typer.Option(help="lm-eval suites: a system message (or text before the prompt)"),
    ] = None,
    fewshot_seed: Annotated[
        int, typer.Option(help="lm-eval suites: the seed that samples the few-shot examples")
    ] = FEWSHOT_SEED,
    judge: Annotated[
        str | None,
        typer.Option(help="open_ended tasks: the judge, ENGINE[:MODEL] (e.g. openai:gpt-4o-mini)"),
    ] = None,
    judge_base_url: Annotated[str | None, typer.Option(help="Cloud judge's API base URL")] = None,
    judge_api_key_env: Annotated[
        str | None, typer.Option(help="Variable holding the cloud judge's API key")
    ] = None,
) -> None:
    """Run a suite on a model with the energy meter on, score it, store it, print the summary.

    --suite lm-eval:TASK[,TASK...] runs tasks of EleutherAI's lm-evaluation-harness (--limit
    counts documents per task there), with pip install 'openjarvis[lm-eval]'. A suite's
    open_ended tasks are scored by --judge, whose energy and cost are stored as a run of its own.
    """
    from openjarvis.cli.summary import print_summary
    from openjarvis.evals.config import RunConfig, prepare
    from openjarvis.evals.harness import HarnessOptions, is_harness_suite
    from openjarvis.evals.judge import JudgeSpec
    from openjarvis.evals.runner import resume_measure, run_measure
    from openjarvis.evals.suites import SuiteConfig

    _refuse_conflicting_options(ctx)
    if resume is not None:
        # Before the model loads: a missing database or run, or one another process still
        # measures, is named without creating or changing anything; resume_measure checks the
        # stored configuration, suite and model again before it writes.
        with open_reader(db) as store:
            refuse_if_live(store.get_run(resume))
        with (
            _interruptions_reported(resume, db, json_output) as on_run,
            measure_progress(resume) as progress,
        ):
            result = resume_measure(
                resume,
                db,
                on_start=progress.on_start,
                on_task=progress.on_task,
                allow_shared=allow_shared,
                on_run=on_run,
            )
        print_summary(result, stdout_console(), json_output, _judge_run(result.run_id, db))
        return
    lm_eval = HarnessOptions(
        num_fewshot=num_fewshot,
        include=lm_eval_include,
        apply_chat_template=apply_chat_template,
        fewshot_as_multiturn=fewshot_as_multiturn,
        system_instruction=system_instruction,
        fewshot_seed=fewshot_seed,
    )
    if judge is None and (judge_base_url or judge_api_key_env):
        raise UserError("--judge-base-url and --judge-api-key-env go with --judge ENGINE:MODEL")
    config = RunConfig(
        engine=engine,
        model=model,
        suite=SuiteConfig(
            name=suite,
            limit=None if all_tasks else limit,
            # lm-eval's options are the suite's own; any of them given for another suite is
            # refused by the check.
            lm_eval=lm_eval if is_harness_suite(suite) or lm_eval != HarnessOptions() else None,
        ),
        judge=None if judge is None else JudgeSpec.parse(judge, judge_base_url, judge_api_key_env),
        samples=samples,
        temperature=(0.0 if samples == 1 else 0.8) if temperature is None else temperature,
        seed=seed,
        concurrency=concurrency,
        timeout_s=timeout,
        n_ctx=n_ctx,
        threads=threads,
        tp=tp,
        n_gpu_layers=n_gpu_layers,
        base_url=base_url,
        api_key_env=api_key_env,
        meter=meter,
        scope=scope,  # type: ignore[arg-type]  # typer passes str; RunConfig.validate checks it
        gpus=gpus,  # type: ignore[arg-type]  # typer passes str; RunConfig.validate checks it
        idle_seconds=idle_seconds,
        allow_shared=allow_shared,
    )
    prepared = prepare(config)  # before the progress bar: a refusal is the only line printed
    with (
        _interruptions_reported(None, db, json_output) as on_run,
        measure_progress(prepared.suite.name) as progress,
    ):
        result = run_measure(
            prepared,
            db,
            on_start=progress.on_start,
            on_task=progress.on_task,
            on_run=on_run,
        )
    print_summary(result, stdout_console(), json_output, _judge_run(result.run_id, db))


def _judge_run(run_id: str, db: str | None) -> str | None:
    """The run holding the judge's verdicts of `run_id`, for the summary to name."""
    from openjarvis.evals.judge import judge_run_id

    with open_reader(db) as store:
        return judge_run_id(store, run_id)


def _refuse_conflicting_options(ctx: typer.Context) -> None:
    given = [
        parameter
        for parameter in ctx.command.params
        # By name: typer carries its own copy of click, so the enum is not click's.
        if parameter.name
        and getattr(ctx.get_parameter_source(parameter.name), "name", None) == "COMMANDLINE"
    ]
    names = {parameter.name for parameter in given}
    if ctx.params["resume"] is not None:
        defining = [
            parameter.opts[0] for parameter in given if parameter.name not in RESUME_OPTIONS
        ]
        if defining:
            raise UserError(
                f"--resume continues a run with the options it was started with; leave out "
                f"{', '.join(defining)}"
            )
    if "all_tasks" in names and "limit" in names:
        raise UserError("--all runs every task and --limit N the first N; give one of them")


@contextmanager
def _interruptions_reported(
    resume: str | None, db: str | None, json_output: bool
) -> Iterator[Callable[[str], None]]:
    """SIGTERM stops a measurement as Ctrl-C does. Either way one line says what was saved and
    how to continue, and the exit status is 128 + the signal (130 or 143), as a shell expects.
    With --json, stdout carries the same as JSON, so a program reading it gets an answer.

    The first Ctrl-C says at once that the tasks in flight are finishing (with --concurrency
    that takes as long as their generation); a second one stops at once, losing those tasks
    (the run keeps what was saved; --resume runs them again). Yields the run callback that
    announces the run's id, so that the second Ctrl-C can name it."""
    received: list[int] = []
    announced: list[str] = []
    db_option = f" --db {db}" if db else ""

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup
        raise KeyboardInterrupt

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if not received:
            received.append(signum)
            sys.stderr.write(
                "stopping: the tasks in flight finish generating, then every finished task is "
                "saved; press Ctrl-C again to stop at once\n"
            )
            raise KeyboardInterrupt
        run = announced[-1] if announced else resume
        how = (
            "before the run was recorded; nothing was saved"
            if run is None
            else f"run {run} keeps the tasks saved so far (those in flight are lost); continue "
            f"it with `ipw measure --resume {run}{db_option}`"
        )
        sys.stderr.write(f"interrupted: stopped at once, {how}\n")
        sys.stderr.flush()
        os._exit(128 + signal.SIGINT)  # no cleanup: that is what waiting for it would be

    def on_run(run_id: str) -> None:
        announced.append(run_id)
        announce_run(run_id, db)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    previous_sigint = signal.signal(signal.SIGINT, on_sigint)
    run_id: str | None
    saved: int | None
    try:
        yield on_run
    except RunInterrupted as stopped:
        run_id, saved = stopped.run_id, stopped.tasks_saved
        message = (
            f"run {run_id} is marked interrupted with {saved} task(s) "
            f"saved; continue it with `ipw measure --resume {run_id}{db_option}`"
        )
    except KeyboardInterrupt:
        run_id, saved = resume, None
        message = (
            "stopped before the run was recorded; nothing was saved"
            if resume is None
            else f"stopped before run {resume} continued, which is as it was; continue it with "
            f"`ipw measure --resume {resume}{db_option}`"
        )
    else:
        return
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_sigint)
    if json_output:
        stopped_json = {
            "interrupted": True,
            "run_id": run_id,
            "tasks_saved": saved,
            "resume": None if run_id is None else f"ipw measure --resume {run_id}{db_option}",
            "message": message,
        }
        sys.stdout.write(json.dumps(stopped_json, indent=2) + "\n")
        sys.stdout.flush()
    sys.stderr.write(f"interrupted: {message}\n")
    raise typer.Exit(128 + (received[0] if received else signal.SIGINT))

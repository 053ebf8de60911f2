"""How a finished measurement is shown: one Rich table for people, or JSON for programs."""

import json

from rich.console import Console
from rich.table import Table

from openjarvis.cli.figure_text import (
    concurrency_rows,
    interval_text,
    output_token_text,
    prompt_token_text,
    windows_text,
)
from openjarvis.cli.output import readable
from openjarvis.evals.prompting import describe_prompting
from openjarvis.evals.runner import MeasureResult
from openjarvis.report.runs import coverage_missing, coverage_names, scope_label

__all__ = ["newcomer_hint", "print_summary", "summary_dict"]


def _plain(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def summary_dict(result: MeasureResult, judge_run: str | None = None) -> dict[str, object]:
    """The figures of the summary table, as JSON-ready data (nulls stay null)."""
    return {
        "run_id": result.run_id,
        "judge_run": judge_run,
        "model": result.model_name,
        "model_kind": result.model_kind,
        "prompting": result.prompting,
        "energy_scope": result.energy_scope,
        "energy_method": result.energy_method,
        "energy_coverage": result.energy_coverage,
        "energy_note": result.energy_note,
        "unavailable_sources": result.unavailable_sources,
        "sandbox_isolation": result.sandbox_isolation,
        "sandbox_note": result.sandbox_note,
        "resumed_tasks": result.resumed_tasks,
        "memory_bandwidth_utilisation": result.memory_bandwidth_utilisation,
        "window_flags": result.window_flags,
        "conservation": result.conservation,
        "phase_energy": result.phase_energy,
        "concurrency": result.concurrency,
        "figures": result.figures.to_dict(),
    }


def print_summary(
    result: MeasureResult, console: Console, as_json: bool, judge_run: str | None = None
) -> None:
    """The summary table and its notes; `judge_run`: the run holding a judge's verdicts."""
    if as_json:
        console.file.write(json.dumps(summary_dict(result, judge_run), indent=2) + "\n")
        return
    figures = result.figures
    method = result.energy_method or "none"
    label = f" ({method})" if method != "counter" else ""
    table = Table(title=f"ipw measure · {result.model_name} · run {result.run_id[:8]}")
    table.add_column("figure")
    table.add_column("value [95 % interval]", justify="right")
    table.add_row("tasks", f"{figures.tasks} tasks, {figures.samples} sample(s) each")
    table.add_row("prompting · model kind", _prompting_text(result))
    table.add_row("accuracy (pass@1)", interval_text(figures.accuracy))
    for k, estimate in figures.pass_at_k.items():
        if k > 1:
            table.add_row(f"pass@{k}", interval_text(estimate))
    table.add_row(f"mean J per task{label}", interval_text(figures.mean_energy_j))
    table.add_row(f"mean J per task, net of idle{label}", interval_text(figures.mean_net_energy_j))
    table.add_row(f"accuracy per joule{label}", interval_text(figures.accuracy_per_joule))
    table.add_row(f"mean W{label}", interval_text(figures.mean_power_w))
    for name, value in concurrency_rows(result.concurrency):
        table.add_row(f"{name}{label}" if name.startswith("J") else name, value)
    table.add_row(
        f"J per output token{label}",
        output_token_text(figures.joules_per_output_token, result.phase_energy),
    )
    table.add_row(f"J per prompt token (prefill){label}", prompt_token_text(result.phase_energy))
    table.add_row("decode tokens/s (median)", _plain(figures.decode_tokens_per_s, ".1f"))
    table.add_row("decode memory-bandwidth use", _plain(result.memory_bandwidth_utilisation, ".0%"))
    table.add_row(
        "latency p50 / p95 (s)",
        f"{_plain(figures.latency_p50_s, '.2f')} / {_plain(figures.latency_p95_s, '.2f')}",
    )
    coverage = result.energy_coverage
    scope = scope_label(result.energy_scope, coverage, detail=False)
    table.add_row("energy method · scope", f"{method} · {scope}")
    console.print(readable(table))
    if coverage_missing(coverage):
        console.print(
            f"[yellow]note:[/] scope {scope_label(result.energy_scope, coverage)}: "
            "the energy figures leave these sources out"
        )
    if out_of_scope := coverage_names(coverage, "out_of_scope"):
        console.print(
            f"[dim]out of scope (the engine does not use them): {', '.join(out_of_scope)}[/]"
        )
    if line := windows_text(result.window_flags, result.conservation, always_ratio=False):
        console.print(f"[yellow]note:[/] {line}")
    if judge_run is not None:
        console.print(
            f"judged by run {judge_run[:8]} (`ipw show {judge_run[:8]}`): the judge's energy and "
            "cost are there, not in this run's figures"
        )
    if result.resumed_tasks:
        console.print(f"resumed: {result.resumed_tasks} task(s) were finished before the resume")
    if result.energy_note:
        console.print(f"[yellow]note:[/] {result.energy_note}")
    for line in result.unavailable_sources:
        console.print(f"[dim]not measured: {line}[/]")
    console.print(f"[dim]sandbox: {result.sandbox_note}[/]")
    if hint := newcomer_hint(result):
        console.print(hint)


def newcomer_hint(result: MeasureResult) -> str | None:
    """What 0 passes of a base model means and what to try, for someone who just ran the first
    command of the README; None where something passed or the model is not a base model."""
    figures = result.figures
    if figures.passed or result.model_kind != "base":
        return None
    return (
        f"0 of {figures.trials} passed: {result.model_name} is a base model (pretrained, not "
        "tuned to follow instructions), so it rarely solves these tasks, and accuracy per "
        "joule is 0 because accuracy is; the energy figures still hold. To see passes, try an "
        "easier suite (`ipw suites` lists them, e.g. --suite arithmetic) or a chat model "
        "(--model PATH.gguf; `jarvis models` lists those on this machine)."
    )


def _prompting_text(result: MeasureResult) -> str:
    kind = f"{result.model_kind} model" if result.model_kind else "model kind unknown"
    return f"{describe_prompting(result.prompting)} · {kind}"

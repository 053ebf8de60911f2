"""`ipw compare`: runs side by side, with each run's ratio to the first and its 95 % interval,
then coverage and routing over the tasks they share (report/routing.py).

Ratios come from metrics.compare_figures; energy scopes must match, and be whole or partial
alike, unless the user says so.
"""

import dataclasses
import json
from typing import Annotated

import typer
from rich.table import Table

from openjarvis.cli.figure_text import interval_text
from openjarvis.cli.options import DatabaseOption, JsonOption
from openjarvis.cli.output import readable, stdout_console
from openjarvis.errors import UserError
from openjarvis.metrics import (
    COMPARED_FIGURES,
    Comparison,
    RunFigures,
    compare_figures,
    run_figures,
    task_figures,
    union_energy,
)
from openjarvis.report.gate import comparison_class, entry, verdict
from openjarvis.report.routing import Route, Routing, routing, routing_json
from openjarvis.report.runs import (
    FIGURE_COLUMNS,
    concurrency_of,
    distinct_labels,
    energy_label,
    host_label,
    is_estimate,
    is_partial,
    model_label,
    run_row,
    scope_label,
    suite_name,
    suite_titles,
)
from openjarvis.store import RunRecord, open_reader

__all__ = ["compare_command", "routing_tables"]


def compare_command(
    runs: Annotated[list[str], typer.Argument(help="Run ids; the first is the baseline")],
    allow_mixed_scope: Annotated[
        bool,
        typer.Option(
            "--allow-mixed-scope",
            help="Show runs of different or partial energy scopes side by side, labelled",
        ),
    ] = False,
    db: DatabaseOption = None,
    json_output: JsonOption = False,
) -> None:
    """Compare runs side by side: figures, and ratios to the first run with 95 % intervals."""
    if len(runs) < 2:
        raise UserError("compare needs at least two run ids, e.g. `ipw compare 3f2a 9c1e`")
    with open_reader(db) as store:
        records = [store.get_run(run) for run in runs]
        ids = [record.id for record in records]
        if len(set(ids)) < len(ids):
            twice = next(record for i, record in enumerate(records) if record.id in ids[:i])
            raise UserError(
                f"run {_short(twice)} is given twice; compare different runs, e.g. "
                "`ipw compare 3f2a 9c1e`"
            )
        tasks = [store.task_results(record.id or "") for record in records]
    for record, saved in zip(records, tasks, strict=True):
        if not saved:
            raise UserError(f"run {_short(record)} has no saved tasks; pick one from `ipw runs`")
    scopes = {record.energy_scope for record in records}
    if len(scopes) > 1 and not allow_mixed_scope:
        listing = ", ".join(f"{_short(record)}: {record.energy_scope}" for record in records)
        raise UserError(
            f"these runs measure different energy scopes ({listing}); compare runs of one "
            "scope, or pass --allow-mixed-scope to show them side by side, labelled"
        )
    partial = [record for record in records if is_partial(record)]
    if partial and len(partial) < len(records) and not allow_mixed_scope:
        listing = ", ".join(
            f"{_short(record)}: {scope_label(record.energy_scope, record.energy_coverage)}"
            for record in partial
        )
        raise UserError(
            f"some runs' energy scope is partial ({listing}): a source in scope could not be "
            "read, so their energy leaves it out; compare runs whose scopes are alike, or pass "
            "--allow-mixed-scope to show them side by side, labelled"
        )
    per_task = [{task.task_id: task_figures(task) for task in saved} for saved in tasks]
    figures = [run_figures(record, saved) for record, saved in zip(records, tasks, strict=True)]
    unions = [union_energy((record.summary or {}).get("concurrency")) for record in records]
    comparisons = [
        compare_figures(per_task[0], other, (unions[0], union))
        for other, union in zip(per_task[1:], unions[1:], strict=True)
    ]
    labels = distinct_labels(records)
    entries = [
        entry(record, saved, labels[record.id or ""])
        for record, saved in zip(records, tasks, strict=True)
    ]
    # A verdict weighs the same work: runs of another suite (another name, or the same name
    # over other tasks) get none, and are said to differ.
    titles = suite_titles(records)
    other_suites = [
        e.run for e in entries[1:] if titles[e.run.id or ""] != titles[records[0].id or ""]
    ]
    verdicts = [
        found_verdict
        for other in entries[1:]
        if other.run not in other_suites
        and (
            found_verdict := verdict(
                entries[0],
                other,
                like_for_like=comparison_class(entries[0].run) == comparison_class(other.run),
            )
        )
        is not None
    ]
    suites_line = _suites_line(records, other_suites, titles)
    found = routing(
        records, {record.id or "": saved for record, saved in zip(records, tasks, strict=True)}
    )
    console = stdout_console()
    if json_output:
        data = _as_json(records, figures, comparisons)
        data["verdicts"] = [found_verdict.to_json() for found_verdict in verdicts]
        data["routing"] = routing_json(found) if found is not None else None
        data["suites"] = {record.id: titles[record.id or ""] for record in records}
        data["suites_note"] = suites_line
        console.file.write(json.dumps(data, indent=2) + "\n")
        return
    console.print(readable(_table(records, figures, comparisons)))
    if suites_line:
        console.print(f"[yellow]note:[/] {suites_line}")
    for found_verdict in verdicts:
        marker = "" if found_verdict.like_for_like else "not like for like: "
        console.print(f"{marker}{found_verdict.sentence()}")
        console.print(f"[yellow]{found_verdict.limits_sentence()}[/]")
    if found is not None:
        for table in routing_tables(found):
            console.print(readable(table))
    for record, comparison in zip(records[1:], comparisons, strict=True):
        how = (
            f"paired over {comparison.baseline_tasks} shared tasks"
            if comparison.paired
            else f"independent: task sets differ ({comparison.baseline_tasks} vs "
            f"{comparison.other_tasks} tasks)"
        )
        console.print(f"[dim]{_short(record)} / {_short(records[0])}: bootstrap {how}[/]")
    for record in records:
        if is_estimate(record):
            console.print(
                f"[yellow]note:[/] run {_short(record)}'s energy is an estimate, not a "
                "measurement; its energy figures and ratios are marked 'est.'"
            )
    if len(scopes) > 1:
        console.print(
            "[yellow]note:[/] energy scopes differ (system includes CPU and DRAM, accelerator "
            "only GPUs): energy ratios compare different things"
        )
    if partial and len(partial) < len(records):
        console.print(
            "[yellow]note:[/] runs marked (partial) could not read a source in their scope: "
            "their energy leaves it out, so energy ratios compare different things"
        )


def routing_tables(found: Routing) -> list[Table]:
    """Coverage, the oracle, the best single run and the cloud run; then the router curve."""
    local = (
        f", {found.local_coverage:.0%} by a local run" if found.local_coverage is not None else ""
    )
    title = (
        f"coverage and routing over {found.tasks} shared tasks: {found.coverage:.0%} solved by "
        f"at least one run{local}"
    )
    tables = [_routes_table(title, "route", [(r.name, r) for r in found.routes()])]
    if found.router:
        curve = [(f"p = {p:.1f}", route) for p, route in found.router]
        tables.append(_routes_table("router right with probability p", "router", curve))
    return tables


def _routes_table(title: str, first: str, rows: list[tuple[str, Route]]) -> Table:
    table = Table(title=title)
    for heading in (first, "accuracy", "J per task", "API $ per task"):
        table.add_column(heading, justify="left" if heading == first else "right")
    for name, route in rows:
        energy = "—" if route.energy_j is None else f"{route.energy_j:.3g}"
        if route.estimated and route.energy_j is not None:
            energy += " (incl. est.)"
        cost = "—" if route.cost_usd is None else f"{route.cost_usd:.4g}"
        table.add_row(name, f"{route.accuracy:.1%}", energy, cost)
    return table


def _suites_line(
    records: list[RunRecord], other_suites: list[RunRecord], titles: dict[str, str]
) -> str | None:
    """Which runs ran another suite than the baseline, and that no verdict spans suites."""
    if not other_suites:
        return None
    listing = ", ".join(f"{_short(record)}: {titles[record.id or '']}" for record in records)
    return (
        f"the runs ran different suites ({listing}): their ratios to {_short(records[0])} weigh "
        "different work, and no verdict is given across suites"
    )


def _short(record: RunRecord) -> str:
    return (record.id or "")[:8]


def _marked(text: str, figure: str, estimated: bool) -> str:
    needs_energy = COMPARED_FIGURES[figure][0] is not None
    return f"{text} est." if estimated and needs_energy and text != "—" else text


def _table(
    records: list[RunRecord], figures: list[RunFigures], comparisons: list[Comparison]
) -> Table:
    table = Table(title="ipw compare")
    table.add_column("figure")
    for record in records:
        label = "\n(estimate)" if is_estimate(record) else ""
        table.add_column(
            f"{_short(record)}\n{model_label(record)}\n{host_label(record)}\n"
            f"{suite_name(record)} · {concurrency_of(record) or 1} at once\n"
            f"{energy_label(record)}{label}",
            justify="right",
        )
    baseline = records[0]
    for record in records[1:]:
        label = "\n(vs estimate)" if is_estimate(record) or is_estimate(baseline) else ""
        table.add_column(f"ratio\n{_short(record)} / {_short(baseline)}{label}", justify="right")
    table.add_row("tasks", *[str(f.tasks) for f in figures], *[""] * len(comparisons))
    for name in COMPARED_FIGURES:
        values = [
            _marked(interval_text(getattr(f, name)), name, is_estimate(record))
            for record, f in zip(records, figures, strict=True)
        ]
        ratios = [
            _marked(
                interval_text(c.ratios[name]), name, is_estimate(record) or is_estimate(baseline)
            )
            for record, c in zip(records[1:], comparisons, strict=True)
        ]
        table.add_row(FIGURE_COLUMNS[name], *values, *ratios)
    return table


def _as_json(
    records: list[RunRecord], figures: list[RunFigures], comparisons: list[Comparison]
) -> dict[str, object]:
    baseline = records[0]
    return {
        "runs": [
            {**run_row(record), "figures": f.to_dict()}
            for record, f in zip(records, figures, strict=True)
        ],
        "comparisons": [
            {
                "baseline": baseline.id,
                "other": record.id,
                "paired": comparison.paired,
                "baseline_tasks": comparison.baseline_tasks,
                "other_tasks": comparison.other_tasks,
                "energy_estimated": is_estimate(record) or is_estimate(baseline),
                "mixed_scope": record.energy_scope != baseline.energy_scope
                or is_partial(record) != is_partial(baseline),
                "ratios": {
                    name: dataclasses.asdict(estimate)
                    for name, estimate in comparison.ratios.items()
                },
            }
            for record, comparison in zip(records[1:], comparisons, strict=True)
        ],
    }

"""`ipw power`: every energy source of this machine, whether it can be read, and how to fix it.

`--watch` shows live watts per source until Ctrl-C; `--json` prints JSON (one line per update).
"""

import dataclasses
import json
from time import sleep
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from openjarvis.cli.output import readable, stdout_console
from openjarvis.power import Meter, SourceStatus, WindowEnergy

__all__ = ["power_command"]


def power_command(
    watch: Annotated[
        bool, typer.Option("--watch", help="Show live watts per source until Ctrl-C.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")] = False,
    interval_s: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between --watch updates.")
    ] = 1.0,
) -> None:
    """List the energy sources: available or why not (and the fix), method, domain, period."""
    console = stdout_console()
    meter = Meter.discover("system")
    try:
        if watch:
            _watch(meter, console, json_output, interval_s)
        elif json_output:
            statuses = [dataclasses.asdict(status) for status in meter.statuses]
            typer.echo(json.dumps({"sources": statuses}, indent=2))
        else:
            console.print(readable(_status_table(meter.statuses)))
    finally:
        meter.close()


def _period(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def _status_table(statuses: tuple[SourceStatus, ...]) -> Table:
    table = Table(title="Energy sources", title_justify="left")
    for column in ("source", "status", "method", "domain", "updates every", "detail"):
        table.add_column(column)
    for status in statuses:
        state = (
            Text("available", style="green")
            if status.available
            else Text(f"not available: {status.reason}", style="red")
        )
        table.add_row(
            Text(status.name),
            state,
            status.method,
            status.domain,
            _period(status.update_period_s),
            Text(status.detail or ""),
        )
    return table


def _measure_interval(meter: Meter, interval_s: float) -> WindowEnergy:
    with meter.window("watch") as window:
        sleep(interval_s)
    return window.result


def _watch(meter: Meter, console: Console, json_output: bool, interval_s: float) -> None:
    if not meter.sources:
        console.print("No energy source can be read here; `ipw power` says why.")
        console.print(_status_table(meter.statuses))
        raise typer.Exit(code=1)
    meter.start()
    try:
        if json_output:
            while True:
                typer.echo(json.dumps(_watch_record(_measure_interval(meter, interval_s))))
        elif not console.is_terminal:
            # Piped (a log, `tee`): a live display redraws in place and shows nothing here, so
            # each update is printed in turn, flushed, as it comes.
            while True:
                console.print(_watch_table(_measure_interval(meter, interval_s)))
                console.file.flush()
        else:
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    live.update(_watch_table(_measure_interval(meter, interval_s)), refresh=True)
    except KeyboardInterrupt:
        return  # Ctrl-C is how --watch ends


def _watch_record(result: WindowEnergy) -> dict[str, object]:
    duration_s = result.duration_s
    return {
        "time_s": result.end_s,
        "duration_s": duration_s,
        "scope": result.scope,
        "power_w": result.mean_power_w,
        "null_reason": result.null_reason,
        "sources": {
            source.source: {
                "power_w": None if source.energy_j is None else source.energy_j / duration_s,
                "method": source.method,
                "null_reason": source.null_reason,
            }
            for source in result.sources
        },
    }


def _watch_table(result: WindowEnergy) -> Table:
    table = Table(
        title=f"Power over the last {result.duration_s:.2f} s (Ctrl-C to stop)",
        title_justify="left",
        caption="system = GPUs + CPU packages + DRAM; psys is platform-wide, never added",
    )
    for column in ("source", "domain", "method", "watts", "note"):
        table.add_column(column, justify="right" if column == "watts" else "left")
    for source in result.sources:
        if source.energy_j is None:
            watts, note = "—", source.null_reason or ""
        else:
            watts, note = f"{source.energy_j / result.duration_s:.1f}", ""
        table.add_row(Text(source.source), source.domain, source.method, watts, note)
    total = result.mean_power_w
    table.add_row(
        Text("system", style="bold"),
        "",
        result.method or "—",
        "—" if total is None else f"{total:.1f}",
        result.null_reason or "",
    )
    return table

"""`ipw requests`: what `jarvis serve` answered, with the energy of each request and the total.

The joules of a coding session that used the server (aider, OpenCode, any OpenAI client).
"""

import dataclasses
import json
from typing import Annotated

import typer
from rich.table import Table

from openjarvis.cli.options import SINCE_HELP, parse_since
from openjarvis.cli.output import readable, stdout_console

__all__ = ["requests_command"]


def requests_command(
    since: Annotated[
        str | None, typer.Option(help=f"Only requests from DATE on, {SINCE_HELP}")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Only this model")] = None,
    last: Annotated[int, typer.Option(help="Rows to show (the totals count all)")] = 20,
    db: Annotated[str | None, typer.Option(help="Database URL or path (or OPENJARVIS_DB)")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON, not a table")] = False,
) -> None:
    """List the requests `jarvis serve` logged, with joules per request and in total."""
    from openjarvis.store import open_reader, request_logs

    since_time = parse_since(since)  # a bad date is named before the database is looked for
    with open_reader(db) as store:
        logs = request_logs(store, since=since_time, model=model)
    known = [r.energy_j for r in logs if r.energy_j is not None]
    methods = sorted({r.energy_method for r in logs if r.energy_method})
    totals = {
        "requests": len(logs),
        "completion_tokens": sum(r.completion_tokens for r in logs),
        "energy_j": sum(known) if len(known) == len(logs) and logs else None,
        "requests_without_energy": len(logs) - len(known),
        "methods": methods,
    }
    if json_output:
        rows = [{**dataclasses.asdict(r), "started_at": str(r.started_at)} for r in logs]
        typer.echo(json.dumps({"totals": totals, "requests": rows}, indent=2))
        return
    table = Table(title=f"jarvis serve requests ({len(logs)})")
    # cached: prompt tokens the engine took from its cache; J saved: the prefill joules that
    # saved (an estimate, ≈); shared: the energy split with requests served at once, by the
    # work each did, at the engine's mean batch size.
    columns = ("started", "endpoint", "model", "tokens out", "J", "method", "J/token", "cached")
    for column in (*columns, "J saved", "shared · batch"):
        table.add_column(column, justify="right" if column[0] in "tJcs" else "left")
    for r in logs[-last:]:
        per_token = r.energy_j / r.completion_tokens if r.energy_j and r.completion_tokens else None
        table.add_row(
            # Local time, as --since reads it and `ipw runs` shows runs.
            f"{r.started_at.astimezone():%Y-%m-%d %H:%M:%S}" if r.started_at else "—",
            r.endpoint.removeprefix("/v1/"),
            r.model_name,
            str(r.completion_tokens),
            "—" if r.energy_j is None else f"{r.energy_j:.3g}",
            r.energy_method or r.energy_null_reason or "—",
            "—" if per_token is None else f"{per_token:.3g}",
            "—" if r.cached_tokens is None else f"{r.cached_tokens}/{r.prompt_tokens}",
            "—" if r.prefill_saved_j is None else f"≈{r.prefill_saved_j:.3g}",
            _shared_text(r.shared, r.mean_batch),
        )
    console = stdout_console()
    console.print(readable(table))
    energy = totals["energy_j"]
    shown = "—" if energy is None else f"{energy:.4g} J"
    console.print(
        f"total: {totals['requests']} requests, {totals['completion_tokens']} tokens out, "
        f"{shown} ({', '.join(methods) or 'no energy'})"
    )
    if totals["requests_without_energy"]:
        console.print(f"[yellow]{totals['requests_without_energy']} request(s) have no energy[/]")


def _shared_text(shared: bool, mean_batch: float | None) -> str:
    """`yes · 3.2` for a request whose energy is its share of a batch; `no · 1` alone."""
    batch = "—" if mean_batch is None else f"{mean_batch:.2g}"
    return f"{'yes' if shared else 'no'} · {batch}"

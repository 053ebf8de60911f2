"""`jarvis models`: the models OpenJarvis can run here, with kind, size, quantisation and
parameters.

Lists the embedded default, GGUFs in the given files or folders, and the Hugging Face cache.
"""

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["models_command"]


def _size(size_bytes: int) -> str:
    return f"{size_bytes / 1e9:.2f} GB" if size_bytes >= 1e9 else f"{size_bytes / 1e6:.0f} MB"


def _parameters(count: int | None) -> str:
    if count is None:
        return "—"
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"


def models_command(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="GGUF files or folders to list as well")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON, not a table")] = False,
) -> None:
    """List the models: name (what --model takes), origin, kind (base or chat), size,
    quantisation, parameters."""
    from openjarvis.runtime.catalog import list_models

    entries = list_models(list(paths or []))
    if json_output:
        rows = [{**dataclasses.asdict(e), "path": str(e.path)} for e in entries]
        typer.echo(json.dumps({"models": rows}, indent=2))
        return
    table = Table(title="models (pass the name to --model)")
    for column in ("name", "origin", "kind", "size", "quantisation", "parameters"):
        table.add_column(column, justify="right" if column in ("size", "parameters") else "left")
    for entry in entries:
        table.add_row(
            entry.name,
            entry.origin,
            entry.kind or "—",
            _size(entry.size_bytes),
            entry.quantisation or "—",
            _parameters(entry.parameters),
        )
    console = Console()
    console.print(table)
    for entry in entries:
        if entry.problem:
            console.print(f"[yellow]{entry.name}:[/] {entry.problem}")

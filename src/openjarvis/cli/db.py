"""`ipw db export` and `ipw db merge`: move runs between databases, from machine to machine.

Merging is idempotent (runs match by id), so the same file can be merged again safely.
"""

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from openjarvis.cli.results import DatabaseOption
from openjarvis.errors import UserError
from openjarvis.store import MergeCounts, Store, merge_into, open_store

__all__ = ["db_app"]

db_app = typer.Typer(
    help="Combine results databases: export this one to a file, merge files into it.",
    no_args_is_help=True,
)


def _describe(counts: MergeCounts) -> str:
    return (
        f"{counts.added} run(s) added, {counts.replaced} updated, "
        f"{counts.unchanged} already present"
    )


def _merge(target: Store, source: Store) -> MergeCounts:
    if target.url == source.url:
        raise UserError(f"{source.url} is the database being merged into; name another file")
    return merge_into(target, source)


@db_app.command("export")
def export_command(
    file: Annotated[Path, typer.Argument(help="New SQLite file to write")],
    db: DatabaseOption = None,
) -> None:
    """Copy every run of the database into a new SQLite file, to merge on another machine."""
    if file.exists():
        raise UserError(f"{file} already exists; name a new file, or `ipw db merge` into it")
    with open_store(db) as source, open_store(str(file)) as target:
        counts = _merge(target, source)
    Console().print(f"exported to {file}: {counts.added} run(s)")


@db_app.command("merge")
def merge_command(
    files: Annotated[list[str], typer.Argument(help="Database files (or URLs) to merge in")],
    db: DatabaseOption = None,
) -> None:
    """Merge runs from other databases into this one; merging a run again changes nothing."""
    console = Console()
    with open_store(db) as target:
        for name in files:
            if "://" not in name and not Path(name).is_file():
                raise UserError(f"no database file at {name}; check the path")
            with open_store(name) as source:
                counts = _merge(target, source)
            console.print(f"merged {name}: {_describe(counts)}")

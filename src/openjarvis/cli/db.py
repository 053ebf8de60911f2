"""`ipw db export` and `ipw db merge`: move runs between databases, from machine to machine.

Merging is idempotent (runs match by id), so the same file can be merged again safely. Sources
are only read, every source is checked before anything is written, and a merge is all or nothing.
"""

from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from openjarvis.cli.options import DatabaseOption
from openjarvis.errors import UserError
from openjarvis.store import (
    MergeCounts,
    Store,
    merge_all,
    open_merge_source,
    open_reader,
    open_store,
)

__all__ = ["db_app"]

db_app = typer.Typer(
    help="Combine results databases: export this one to a file, merge files into it.",
    no_args_is_help=True,
    rich_markup_mode=None,  # as `ipw`'s: flags shown as flags, not `--flag <bool>`
)


def _describe(counts: MergeCounts) -> str:
    return (
        f"{counts.added} run(s) added, {counts.replaced} updated, "
        f"{counts.unchanged} already present; {counts.requests_added} logged request(s) added"
    )


def _merge(target: Store, sources: list[Store]) -> list[MergeCounts]:
    for source in sources:
        if target.url == source.url:
            raise UserError(f"{source.url} is the database being merged into; name another file")
    return merge_all(target, sources)


@db_app.command("export")
def export_command(
    file: Annotated[Path, typer.Argument(help="New SQLite file to write")],
    db: DatabaseOption = None,
) -> None:
    """Copy every run, and jarvis serve's request log, into a new SQLite file, to merge on
    another machine."""
    if file.exists():
        raise UserError(f"{file} already exists; name a new file, or `ipw db merge` into it")
    with open_reader(db) as source:
        try:
            with open_store(str(file)) as target:
                (counts,) = _merge(target, [source])
        except BaseException:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{file}{suffix}").unlink(missing_ok=True)  # ours: it did not exist
            raise
    Console().print(
        f"exported to {file}: {counts.added} run(s), {counts.requests_added} logged request(s)"
    )


@db_app.command("merge")
def merge_command(
    files: Annotated[list[str], typer.Argument(help="Database files (or URLs) to merge in")],
    db: DatabaseOption = None,
) -> None:
    """Merge runs from other databases into this one; merging a run again changes nothing."""
    with ExitStack() as stack:
        # Every source is opened and checked before the target is opened, let alone written.
        sources = [stack.enter_context(open_merge_source(name)) for name in files]
        target = stack.enter_context(open_store(db))
        counts = _merge(target, sources)
    console = Console()
    for name, merged in zip(files, counts, strict=True):
        console.print(f"merged {name}: {_describe(merged)}")

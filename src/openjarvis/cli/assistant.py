"""Bare `jarvis` (no subcommand): open the coding assistant in the current folder.

Registered as the `jarvis` app's callback, so `jarvis serve` and the other subcommands pass by.
"""

from typing import Annotated

import typer

from openjarvis.cli.version import VersionOption

__all__ = ["assistant_callback"]


def assistant_callback(
    context: typer.Context,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the last session in this folder")
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            help="GGUF path, cached model name, openai:MODEL[@URL] or anthropic:MODEL "
            "(default: the embedded Gemma 3 270M, a base model)"
        ),
    ] = None,
    db: Annotated[str | None, typer.Option(help="Database URL or path (or OPENJARVIS_DB)")] = None,
    version: VersionOption = False,
) -> None:
    """The energy-aware coding assistant: run `jarvis` in a project folder; /help inside."""
    if context.invoked_subcommand is not None:
        return
    from openjarvis.tui import run_assistant  # Textual loads only when the app opens

    run_assistant(model=model, resume=resume, db=db)

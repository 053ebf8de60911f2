"""`--version` of `ipw` and `jarvis`: prints `openjarvis X.Y.Z` and exits."""

from typing import Annotated

import typer

from openjarvis import __version__

__all__ = ["VersionOption"]


def _print_version(given: bool) -> None:
    if given:
        typer.echo(f"openjarvis {__version__}")
        raise typer.Exit()


# Eager: printed before any other option is checked or a subcommand is required.
VersionOption = Annotated[
    bool,
    typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit"
    ),
]

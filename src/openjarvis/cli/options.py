"""Options several `ipw` commands share, said once: --db, --json, and --since with its parser."""

from datetime import datetime
from typing import Annotated

import typer

from openjarvis.errors import UserError

__all__ = ["SINCE_HELP", "DatabaseOption", "JsonOption", "parse_since"]

DatabaseOption = Annotated[
    str | None, typer.Option("--db", help="Database URL or path (or OPENJARVIS_DB)")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables")]


# Every --since (runs, report, requests) says the same; parse_since applies it.
SINCE_HELP = "local time unless it has an offset: 2026-01-31, 2026-01-31T14:00, ...T14:00+00:00"


def parse_since(text: str | None) -> datetime | None:
    """A date or date-time as users type it; without an offset it is local time."""
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text).astimezone()
    except ValueError:
        raise UserError(
            f"--since takes a date or local time such as 2026-01-31 or 2026-01-31T14:00, "
            f"not {text!r}"
        ) from None

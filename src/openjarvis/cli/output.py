"""Where `ipw` tables go: the terminal's width, or the width the content needs when piped.

Rich narrows output that is not a terminal to 80 columns and ends cut cells in '…'; a table
piped to a file or a pager must keep every column and every character.
"""

import os
import sys

from rich.console import Console
from rich.table import Table

__all__ = ["readable", "stdout_console"]

# Wide enough for any table we print; a table takes its natural width, never more.
PIPED_WIDTH = 10_000


def stdout_console() -> Console:
    """A console on stdout: a terminal's width (or COLUMNS when set), else unlimited."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPED_WIDTH)


def readable(table: Table) -> Table:
    """On a narrow terminal (80 columns) cells fold onto more lines instead of ending in '…'
    or, for columns that may not wrap, being squeezed out of the table altogether. The first
    column names the row (a run id, a task) and stays whole."""
    for index, column in enumerate(table.columns):
        column.overflow = "fold"
        column.no_wrap = index == 0
    return table

"""What a drawn plot is, for the report's pages. Free of matplotlib: the process that writes
the report never imports it (its plot workers do, while it reads the database)."""

from dataclasses import dataclass

__all__ = ["Plot"]


@dataclass(frozen=True, slots=True)
class Plot:
    name: str  # a stable id, e.g. "accuracy-vs-energy"
    title: str
    caption: str
    svg: str

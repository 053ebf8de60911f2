"""What a drawn plot is, and the plain points a plot is drawn from, for the report's pages.
Free of matplotlib: the process that writes the report never imports it (its plot workers do,
while it reads the database)."""

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["PALETTE", "Panel", "Plot", "Point", "hardware_colours"]

# One colour per hardware in every chart and in the page's one legend (matplotlib's tab10).
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def hardware_colours(labels: Iterable[str]) -> dict[str, str]:
    """A colour per hardware label, in sorted order, so the same runs give the same colours."""
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(sorted(set(labels)))}


@dataclass(frozen=True, slots=True)
class Plot:
    name: str  # a stable id, e.g. "accuracy-vs-energy"
    title: str
    caption: str
    svg: str


@dataclass(frozen=True, slots=True)
class Point:
    """One run in a section's scatter: J per task against accuracy, with intervals."""

    label: str  # model · hardware · engine
    hardware: str
    energy_j: float
    energy_low_j: float | None
    energy_high_j: float | None
    accuracy: float
    accuracy_low: float | None
    accuracy_high: float | None
    estimated: bool
    cloud: bool


@dataclass(frozen=True, slots=True)
class Panel:
    """One section of the comparability gate: its title (with n) and its runs' points."""

    title: str
    points: tuple[Point, ...]

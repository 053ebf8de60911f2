"""Run totals over the union of a meter's windows, so overlapping windows count a joule once.

Each source is read at the edges of the union's intervals (when the first window opens and the
last one closes), and the energy between those edges is added up.
"""

from collections.abc import Callable
from dataclasses import dataclass

from openjarvis.power.accounting import LOW_RESOLUTION_PERIODS, net_energy_j, sum_scope
from openjarvis.power.track import Track, TrackReading, energy_between
from openjarvis.power.types import Scope, SourceEnergy, TotalEnergy

__all__ = ["UnionTotals"]


@dataclass(slots=True)
class _Part:
    """One source's energy over the union so far; None (with a reason) once a piece failed."""

    energy_j: float | None = 0.0
    null_reason: str | None = None
    covered_s: float = 0.0
    low_resolution: bool = False


class UnionTotals:
    """Not thread-safe on its own: the Meter calls it under its lock."""

    def __init__(self, tracks: list[Track]) -> None:
        self._tracks = tracks
        self._parts = {track.source.name: _Part() for track in tracks}
        self._start: tuple[float, list[TrackReading]] | None = None
        self.covered_s = 0.0
        self.windows = 0

    def begin(self, start_s: float, readings: list[TrackReading]) -> None:
        """The first of possibly several overlapping windows opened."""
        self._start = (start_s, readings)

    def end(self, end_s: float, readings: list[TrackReading]) -> None:
        """The last open window closed: add the interval since `begin`."""
        assert self._start is not None, "end() without begin()"
        start_s, start = self._start
        self._start = None
        self.covered_s += end_s - start_s
        for track, first, last in zip(self._tracks, start, readings, strict=True):
            part = self._parts[track.source.name]
            energy_j, reason = energy_between(first, last)
            duration_s = last.time_s - first.time_s
            part.covered_s += duration_s
            shortest_s = LOW_RESOLUTION_PERIODS * track.source.update_period_s
            part.low_resolution |= duration_s < shortest_s
            if part.energy_j is not None:  # once unknown, the total stays unknown
                part.energy_j = None if energy_j is None else part.energy_j + energy_j
                part.null_reason = reason

    def total(self, scope: Scope, idle_power_w: Callable[[str], float | None]) -> TotalEnergy:
        sources = []
        for track in self._tracks:
            source, part = track.source, self._parts[track.source.name]
            idle_w = idle_power_w(source.name)
            sources.append(
                SourceEnergy(
                    source=source.name,
                    domain=source.domain,
                    method=source.method,
                    energy_j=part.energy_j,
                    net_energy_j=net_energy_j(part.energy_j, idle_w, part.covered_s),
                    idle_power_w=idle_w,
                    null_reason=part.null_reason,
                    low_resolution=part.low_resolution,
                )
            )
        summed = sum_scope(tuple(sources), scope)
        return TotalEnergy(
            scope=scope,
            method=summed.method,
            covered_s=self.covered_s,
            windows=self.windows,
            energy_j=summed.energy_j,
            net_energy_j=summed.net_energy_j,
            null_reason=summed.null_reason,
            sources=tuple(sources),
        )

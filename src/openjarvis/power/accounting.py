"""How per-source readings become SourceEnergy, and how sources add up within a scope.

Pure functions: the Meter supplies the readings, these decide what is summed and what is None.
"""

from dataclasses import dataclass

from openjarvis.power.track import Track, TrackReading, energy_between
from openjarvis.power.types import Domain, Method, Scope, SourceEnergy, weakest_method

__all__ = [
    "LOW_RESOLUTION_PERIODS",
    "MIN_SAMPLING_SHARE",
    "ScopeSum",
    "in_scope",
    "net_energy_j",
    "source_energy",
    "sum_scope",
]

# psys ("platform") is never in a sum: it already contains the packages and DRAM.
_SCOPE_DOMAINS: dict[str, frozenset[str]] = {
    "accelerator": frozenset({"gpu"}),
    "system": frozenset({"gpu", "cpu", "dram"}),
}

# A window under this many update periods of a source is flagged low_resolution (METRICS.md).
LOW_RESOLUTION_PERIODS = 10
# A power source read at under a quarter of its sampling rate is integrated too coarsely.
MIN_SAMPLING_SHARE = 0.25


def in_scope(domain: Domain, scope: Scope) -> bool:
    return domain in _SCOPE_DOMAINS[scope]


def net_energy_j(
    energy_j: float | None, idle_power_w: float | None, duration_s: float
) -> float | None:
    if energy_j is None or idle_power_w is None:
        return None
    return energy_j - idle_power_w * duration_s


def source_energy(
    track: Track, start: TrackReading, end: TrackReading, idle_power_w: float | None
) -> SourceEnergy:
    """One source over one window, judged against the source's update period."""
    source = track.source
    duration_s = end.time_s - start.time_s
    energy_j, reason = energy_between(start, end)
    if energy_j is not None and duration_s < source.update_period_s:
        # The value may not have refreshed once: any number here would be 0 or noise.
        energy_j, reason = None, "window-too-short"
    low_resolution = duration_s < LOW_RESOLUTION_PERIODS * source.update_period_s
    if source.reads == "power_w":
        expected_reads = duration_s / track.sample_period_s
        low_resolution |= end.read_count - start.read_count < MIN_SAMPLING_SHARE * expected_reads
    return SourceEnergy(
        source=source.name,
        domain=source.domain,
        method=source.method,
        energy_j=energy_j,
        net_energy_j=net_energy_j(energy_j, idle_power_w, duration_s),
        idle_power_w=idle_power_w,
        null_reason=reason,
        low_resolution=low_resolution,
    )


@dataclass(frozen=True, slots=True)
class ScopeSum:
    method: Method | None
    energy_j: float | None
    net_energy_j: float | None
    null_reason: str | None
    low_resolution: bool


def sum_scope(sources: tuple[SourceEnergy, ...], scope: Scope) -> ScopeSum:
    """Add the sources inside `scope`; one unknown source makes the sum unknown."""
    chosen = [source for source in sources if in_scope(source.domain, scope)]
    if not chosen:
        return ScopeSum(None, None, None, "no-device", False)
    method = weakest_method([source.method for source in chosen])
    low_resolution = any(source.low_resolution for source in chosen)
    failed = next((source for source in chosen if source.energy_j is None), None)
    if failed is not None:
        return ScopeSum(method, None, None, failed.null_reason, low_resolution)
    energy_j = sum(source.energy_j for source in chosen if source.energy_j is not None)
    nets = [source.net_energy_j for source in chosen]
    net_j = None if None in nets else sum(net for net in nets if net is not None)
    return ScopeSum(method, energy_j, net_j, None, low_resolution)

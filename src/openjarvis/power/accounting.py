"""How per-source readings become SourceEnergy, and how sources add up within a scope.

Pure functions: the Meter supplies the readings, these decide what is summed and what is None.
"""

from dataclasses import dataclass

from openjarvis.power.types import Domain, Method, Scope, SourceEnergy, weakest_method

__all__ = [
    "LOW_RESOLUTION_PERIODS",
    "ScopeSum",
    "in_scope",
    "sum_scope",
]

# psys ("platform") is never in a sum: it already contains the packages and DRAM.
_SCOPE_DOMAINS: dict[str, frozenset[str]] = {
    "accelerator": frozenset({"gpu"}),
    "system": frozenset({"gpu", "cpu", "dram"}),
}

# A window under this many update periods of a source is flagged low_resolution (docs/energy.md).
LOW_RESOLUTION_PERIODS = 10


def in_scope(domain: Domain, scope: Scope) -> bool:
    return domain in _SCOPE_DOMAINS[scope]


@dataclass(frozen=True, slots=True)
class ScopeSum:
    method: Method | None
    energy_j: float | None
    net_energy_j: float | None
    null_reason: str | None
    low_resolution: bool
    tail_j: float | None = None
    prefill_j: float | None = None


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
    tails = [source.tail_j for source in chosen]
    tail_j = None if None in tails else sum(tail for tail in tails if tail is not None)
    prefills = [source.prefill_j for source in chosen]
    prefill_j = None if None in prefills else sum(p for p in prefills if p is not None)
    return ScopeSum(method, energy_j, net_j, None, low_resolution, tail_j, prefill_j)

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


@dataclass(slots=True)  # not frozen: the accountant makes two for every window, and a frozen
class ScopeSum:  # dataclass's __init__ takes three times as long
    method: Method | None
    energy_j: float | None
    net_energy_j: float | None
    null_reason: str | None
    low_resolution: bool
    tail_j: float | None = None
    prefill_j: float | None = None


def sum_scope(sources: tuple[SourceEnergy, ...], scope: Scope) -> ScopeSum:
    """Add the sources inside `scope`; one unknown source makes the sum unknown. (One pass:
    the accountant sums every window twice, to its end and with its tail.)"""
    domains = _SCOPE_DOMAINS[scope]
    chosen = [source for source in sources if source.domain in domains]
    if not chosen:
        return ScopeSum(None, None, None, "no-device", False)
    method = weakest_method([source.method for source in chosen])
    low_resolution = any(source.low_resolution for source in chosen)
    energy_j = 0.0
    net_j: float | None = 0.0
    tail_j: float | None = 0.0
    prefill_j: float | None = 0.0
    for source in chosen:
        if source.energy_j is None:
            return ScopeSum(method, None, None, source.null_reason, low_resolution)
        energy_j += source.energy_j
        net_j = _plus(net_j, source.net_energy_j)
        tail_j = _plus(tail_j, source.tail_j)
        prefill_j = _plus(prefill_j, source.prefill_j)
    return ScopeSum(method, energy_j, net_j, None, low_resolution, tail_j, prefill_j)


def _plus(total: float | None, part: float | None) -> float | None:
    """A sum that one unknown part makes unknown."""
    return None if total is None or part is None else total + part

"""The energy of each reply and of the session, by model, for the status bar and `/cost`.

A local reply's energy is the meter's window around it; a cloud reply's is the engine's
labelled estimate (docs/assistant.md). Live watts come from the meter's trace.
"""

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from openjarvis.power import Method, PowerSample, WindowEnergy
from openjarvis.runtime.types import EnergyEstimate

__all__ = [
    "AssistantMeter",
    "LiveWatts",
    "MeteredWindow",
    "ModelTotals",
    "ReplyEnergy",
    "SessionEnergy",
    "format_joules",
]


class MeteredWindow(Protocol):
    @property
    def result(self) -> WindowEnergy: ...

    def mark_first_token(self, time_s: float) -> None: ...


class NamedSource(Protocol):
    @property
    def name(self) -> str: ...


class AssistantMeter(Protocol):
    """What the assistant reads from `power.Meter`: a window around each reply, the trace for
    live watts, and the method of the sources in scope (tests give a fixed-figure fake)."""

    @property
    def scoped_sources(self) -> Sequence[NamedSource]: ...

    @property
    def method(self) -> Method | None: ...

    def window(self, label: str) -> AbstractContextManager[MeteredWindow]: ...

    def drain_trace(self) -> list[PowerSample]: ...


def format_joules(energy_j: float | None, method: str | None, named: bool = True) -> str:
    """Joules with their provenance: an estimate is marked with ≈ and, unless `named` is off
    (the status bar names it once for all its figures), called an estimate."""
    if energy_j is None:
        return "— J"
    figure = f"{energy_j:,.1f} J" if energy_j >= 10 else f"{energy_j:.2f} J"
    if method != "estimate":
        return figure
    return f"≈{figure} (estimate)" if named else f"≈{figure}"


@dataclass(frozen=True, slots=True)
class ReplyEnergy:
    energy_j: float | None
    method: str | None  # counter | integrated | estimate
    null_reason: str | None
    basis: str | None = None  # what a cloud estimate was computed from
    prefill_j: float | None = None  # up to the first token (measured replies only)

    @classmethod
    def measured(cls, window: WindowEnergy) -> "ReplyEnergy":
        return cls(
            window.energy_j, window.method, window.null_reason, prefill_j=window.prefill_energy_j
        )

    @classmethod
    def estimated(cls, estimate: EnergyEstimate) -> "ReplyEnergy":
        return cls(estimate.energy_j, "estimate", None, estimate.basis)

    def per_token(self, tokens: int) -> float | None:
        return None if self.energy_j is None or tokens <= 0 else self.energy_j / tokens


@dataclass(slots=True)
class ModelTotals:
    replies: int = 0
    completion_tokens: int = 0
    energy_j: float = 0.0  # over the replies whose energy is known
    unknown_replies: int = 0  # replies whose energy could not be obtained
    estimated: bool = False  # some of the energy is an estimate
    cost_usd: float | None = None  # what the API charged; None: local, or no price known
    # A model behind a paid API (True), on this machine (False), or not known (None: replies
    # read back from a stored session without a price).
    cloud: bool | None = None


class SessionEnergy:
    """Sums per model; a reply of unknown energy is counted as unknown, never as 0 J."""

    def __init__(self) -> None:
        self.by_model: dict[str, ModelTotals] = {}

    def add(
        self,
        model: str,
        energy: ReplyEnergy,
        completion_tokens: int,
        cost_usd: float | None,
        cloud: bool | None,
    ) -> None:
        totals = self.by_model.setdefault(model, ModelTotals())
        totals.cloud = cloud if cloud is not None else totals.cloud
        totals.replies += 1
        totals.completion_tokens += completion_tokens
        if energy.energy_j is None:
            totals.unknown_replies += 1
        else:
            totals.energy_j += energy.energy_j
            totals.estimated |= energy.method == "estimate"
        if cost_usd is not None:
            totals.cost_usd = (totals.cost_usd or 0.0) + cost_usd

    @property
    def energy_j(self) -> float:
        return sum(totals.energy_j for totals in self.by_model.values())

    @property
    def estimated(self) -> bool:
        return any(totals.estimated for totals in self.by_model.values())

    def clear(self) -> None:
        self.by_model.clear()

    def report(self) -> str:
        """The `/cost` table, as Markdown."""
        if not self.by_model:
            return "No replies yet in this session."
        rows = [
            "| model | replies | tokens out | energy | J/token | cost |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for model, totals in self.by_model.items():
            method = "estimate" if totals.estimated else None
            per_token = (
                f"{totals.energy_j / totals.completion_tokens:.3f}"
                if totals.completion_tokens
                else "—"
            )
            energy = format_joules(totals.energy_j, method)
            if totals.unknown_replies:
                energy += f" (+{totals.unknown_replies} unknown)"
            cost = _cost_text(totals)
            rows.append(
                f"| {model} | {totals.replies} | {totals.completion_tokens:,} | {energy} "
                f"| {per_token} | {cost} |"
            )
        total = format_joules(self.energy_j, "estimate" if self.estimated else None)
        rows.append(f"\nSession total: **{total}** (gross, idle power not subtracted).")
        return "\n".join(rows)


def _cost_text(totals: ModelTotals) -> str:
    """What the replies cost: dollars where the API priced them, `local` on this machine, and
    `no price` for a remote model whose price is not in data/cloud_prices.csv (not free)."""
    if totals.cost_usd is not None:
        return f"${totals.cost_usd:.4f}"
    if totals.cloud is None:
        return "—"
    return "no price" if totals.cloud else "local"


class LiveWatts:
    """Watts now: the newest trace sample of each source in the meter's scope, summed."""

    def __init__(self, meter: AssistantMeter) -> None:
        self._meter = meter
        self._in_scope = {source.name for source in meter.scoped_sources}
        self._latest_w: dict[str, float] = {}

    def poll(self) -> float | None:
        """Take the samples the sampler recorded since the last poll; None before any arrives."""
        for sample in self._meter.drain_trace():
            if sample.source in self._in_scope:
                self._latest_w[sample.source] = sample.power_w
        if not self._latest_w:
            return None
        return sum(self._latest_w.values())

    @property
    def method(self) -> str | None:
        return self._meter.method

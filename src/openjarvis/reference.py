"""Cloud models' prices and energy per token, read from data/cloud_prices.csv and
data/cloud_energy.csv (each row with its source and date); a leaf the runtime and report both read.
"""

import csv
import io
import re
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

__all__ = ["EnergyClass", "Price", "cost_usd", "energy_class", "price"]


@dataclass(frozen=True, slots=True)
class Price:
    model_prefix: str
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    as_of: str


@dataclass(frozen=True, slots=True)
class EnergyClass:
    pattern: re.Pattern[str]
    name: str
    accelerator: str
    output_j_per_token: float
    input_j_per_token: float
    pue: float
    source_date: str


def _rows(filename: str) -> list[dict[str, str]]:
    text = (files("openjarvis") / "data" / filename).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


@cache
def _prices() -> tuple[Price, ...]:
    return tuple(
        Price(
            row["model_prefix"],
            float(row["input_usd_per_mtok"]),
            float(row["output_usd_per_mtok"]),
            row["as_of"],
        )
        for row in _rows("cloud_prices.csv")
    )


@cache
def _energy_classes() -> tuple[EnergyClass, ...]:
    return tuple(
        EnergyClass(
            re.compile(row["model_pattern"]),
            row["model_class"],
            row["accelerator"],
            float(row["output_j_per_token"]),
            float(row["input_j_per_token"]),
            float(row["pue"]),
            row["source_date"],
        )
        for row in _rows("cloud_energy.csv")
    )


def price(model: str) -> Price | None:
    """The row with the longest prefix of `model` (gpt-4o-mini is not priced as gpt-4o)."""
    matches = [p for p in _prices() if model.startswith(p.model_prefix)]
    return max(matches, key=lambda p: len(p.model_prefix), default=None)


def cost_usd(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """Dollars for one request; None when the table has no price for the model."""
    row = price(model)
    if row is None:
        return None
    return (
        prompt_tokens * row.input_usd_per_mtok + completion_tokens * row.output_usd_per_mtok
    ) / 1e6


def energy_class(model: str) -> EnergyClass:
    """The first row whose pattern matches; the table's last row matches every name."""
    return next(row for row in _energy_classes() if row.pattern.search(model))

"""A cloud request's energy, estimated from the per-token table of data/cloud_energy.csv and
labelled as an estimate; the tables themselves are read in `openjarvis.reference`.
"""

from openjarvis.reference import energy_class
from openjarvis.runtime.types import EnergyEstimate

__all__ = ["estimate_energy"]


def estimate_energy(model: str, prompt_tokens: int, completion_tokens: int) -> EnergyEstimate:
    row = energy_class(model)
    prefill_j = prompt_tokens * row.input_j_per_token * row.pue
    joules = completion_tokens * row.output_j_per_token * row.pue + prefill_j
    basis = (
        f"data/cloud_energy.csv class {row.name} ({row.accelerator}, {row.source_date}): "
        f"{row.output_j_per_token} J/output token, {row.input_j_per_token} J/input token, "
        f"PUE {row.pue}"
    )
    return EnergyEstimate(f"estimate:cloud:{row.name}", joules, basis, prefill_energy_j=prefill_j)

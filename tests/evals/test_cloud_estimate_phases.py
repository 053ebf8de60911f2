"""A cloud reply's estimate splits into prefill and decode by its table's own constants (J per
input token and per output token), not by this machine's draw over time."""

import pytest

from openjarvis.evals.run_energy import estimated_window
from openjarvis.power.types import WindowEnergy
from openjarvis.reference import energy_class
from openjarvis.runtime.cloud_tables import estimate_energy
from openjarvis.runtime.types import Completion

MODEL = "gpt-4o"


def test_the_estimate_splits_by_input_and_output_tokens() -> None:
    row = energy_class(MODEL)
    estimate = estimate_energy(MODEL, prompt_tokens=1000, completion_tokens=200)
    assert estimate.prefill_energy_j == pytest.approx(1000 * row.input_j_per_token * row.pue)
    assert estimate.prefill_energy_j is not None
    assert estimate.energy_j - estimate.prefill_energy_j == pytest.approx(
        200 * row.output_j_per_token * row.pue
    )
    local = WindowEnergy(
        "task",
        0.0,
        2.0,
        "system",
        "counter",
        40.0,
        10.0,
        None,
        (),
        prefill_energy_j=30.0,
        decode_energy_j=10.0,
        tail_energy_j=1.0,
    )
    completion = Completion("text", 1000, 200, "stop", 2.0, 0.5, 1.5, energy_estimate=estimate)
    window = estimated_window(local, completion)
    # The estimate's parts, never this machine's split of its own draw (30 J before the token).
    assert window.prefill_energy_j == estimate.prefill_energy_j
    assert window.decode_energy_j == pytest.approx(estimate.energy_j - estimate.prefill_energy_j)
    assert window.tail_energy_j is None and window.net_energy_j is None

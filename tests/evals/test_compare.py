"""Ratios between runs with bootstrap intervals: paired over shared tasks, else independent."""

import dataclasses
from collections.abc import Sequence

import pytest

from openjarvis.metrics import TaskFigures, compare_figures

__all__: list[str] = []


def run(
    energies: Sequence[float | None], passed: list[int], prefix: str = "T"
) -> dict[str, TaskFigures]:
    return {
        f"{prefix}/{i}": TaskFigures(
            samples=1,
            passed=p,
            latency_s=2.0,
            energy_j=e,
            net_energy_j=None if e is None else e / 2,
            completion_tokens=10,
        )
        for i, (e, p) in enumerate(zip(energies, passed, strict=True))
    }


def test_paired_ratio_of_a_run_at_twice_the_energy_is_exactly_two() -> None:
    energies = [10.0 + i for i in range(20)]
    passed = [i % 2 for i in range(20)]
    baseline = run(energies, passed)
    doubled = run([2 * e for e in energies], passed)
    comparison = compare_figures(baseline, doubled)
    assert comparison.paired and comparison.baseline_tasks == comparison.other_tasks == 20
    # Paired resampling draws the same tasks from both runs, so the ratio never varies.
    for name, expected in (("mean_energy_j", 2.0), ("accuracy_per_joule", 0.5)):
        ratio = comparison.ratios[name]
        assert ratio.value == pytest.approx(expected)
        assert ratio.low == pytest.approx(expected) and ratio.high == pytest.approx(expected)
    assert comparison.ratios["accuracy"].value == pytest.approx(1.0)


def test_different_task_sets_are_resampled_independently() -> None:
    energies = [10.0 + i for i in range(20)]
    baseline = run(energies, [1] * 20)
    other = run([2 * e for e in energies[:15]], [1] * 15, prefix="U")
    comparison = compare_figures(baseline, other)
    assert not comparison.paired and comparison.other_tasks == 15
    ratio = comparison.ratios["mean_energy_j"]
    assert ratio.low is not None and ratio.value is not None and ratio.high is not None
    assert ratio.low < ratio.value < ratio.high
    assert compare_figures(baseline, other) == comparison  # fixed seed: reproducible


def test_unknown_energy_and_undefined_ratios_are_null_with_reasons() -> None:
    baseline = run([10.0, 20.0], [0, 0])
    unknown = run([10.0, None], [1, 1])
    comparison = compare_figures(baseline, unknown)
    assert comparison.ratios["mean_energy_j"].null_reason == "energy-unknown"
    assert comparison.ratios["accuracy_per_joule"].value is None
    # Baseline accuracy 0: the accuracy ratio has no value, never inf or 0.
    undefined = comparison.ratios["accuracy"]
    assert dataclasses.astuple(undefined) == (None, None, None, "undefined")

import math
from dataclasses import replace

import pytest

from openjarvis.intervals import small_n_caution, wilson
from openjarvis.metrics import (
    TaskFigures,
    UnionEnergy,
    compare_figures,
    compute_figures,
    window_flags,
)
from openjarvis.records import TaskResultRecord


def _task(
    passed: int,
    energy_j: float | None,
    latency_s: float = 2.0,
    tokens: int = 10,
    samples: int = 1,
    net: float | None = None,
) -> TaskFigures:
    return TaskFigures(
        samples=samples,
        passed=passed,
        latency_s=latency_s,
        energy_j=energy_j,
        net_energy_j=net if net is not None else (None if energy_j is None else energy_j / 2),
        completion_tokens=tokens,
    )


def test_accuracy_per_joule_is_accuracy_over_mean_energy_per_task() -> None:
    figures = compute_figures([_task(1, 10.0), _task(0, 30.0), _task(1, 20.0), _task(0, 40.0)])
    assert figures.accuracy.value == pytest.approx(0.5)
    assert figures.mean_energy_j.value == pytest.approx(25.0)
    assert figures.accuracy_per_joule.value == pytest.approx(0.5 / 25.0)
    # Net: each task's net energy is half its gross here.
    assert figures.accuracy_per_joule_net.value == pytest.approx(0.5 / 12.5)
    assert figures.joules_per_solved_task.value == pytest.approx(50.0)
    assert figures.joules_per_output_token.value == pytest.approx(100.0 / 40)
    # Mean power is the machine's: the tasks' energy over their time, one after another.
    assert figures.mean_power_w.value == pytest.approx(12.5)
    assert figures.accuracy_per_watt.value == pytest.approx(0.5 / 12.5)


def test_accuracy_per_joule_does_not_fall_as_tasks_are_added() -> None:
    few = compute_figures([_task(1, 10.0), _task(0, 10.0)])
    many = compute_figures([_task(1, 10.0), _task(0, 10.0)] * 10)
    assert few.accuracy_per_joule.value == pytest.approx(many.accuracy_per_joule.value)


def test_intervals_bracket_the_value_and_are_reproducible() -> None:
    tasks = [_task(i % 3 == 0, 5.0 + i) for i in range(30)]
    first = compute_figures(tasks)
    second = compute_figures(tasks)
    apj = first.accuracy_per_joule
    assert apj.low is not None and apj.high is not None and apj.value is not None
    assert apj.low < apj.value < apj.high
    assert (apj.low, apj.high) == (second.accuracy_per_joule.low, second.accuracy_per_joule.high)


def test_unknown_energy_is_null_with_a_reason_never_zero() -> None:
    figures = compute_figures([_task(1, 10.0), _task(1, None)])
    assert figures.accuracy.value == 1.0
    assert figures.accuracy_per_joule.value is None
    assert figures.accuracy_per_joule.null_reason == "energy-unknown"
    assert figures.mean_energy_j.value is None


def test_joules_per_solved_task_is_null_when_nothing_passed() -> None:
    figures = compute_figures([_task(0, 10.0), _task(0, 12.0)])
    assert figures.accuracy_per_joule.value == 0.0
    assert figures.joules_per_solved_task.value is None
    assert figures.joules_per_solved_task.null_reason == "undefined"


def test_pass_at_k_for_every_k_up_to_n() -> None:
    figures = compute_figures([_task(1, 10.0, samples=3), _task(0, 10.0, samples=3)])
    assert set(figures.pass_at_k) == {1, 2, 3}
    # Task 1: c=1 of n=3. pass@1 = 1/3, pass@2 = 1 - C(2,2)/C(3,2) = 2/3, pass@3 = 1.
    assert figures.pass_at_k[1].value == pytest.approx((1 / 3) / 2)
    assert figures.pass_at_k[2].value == pytest.approx((2 / 3) / 2)
    assert figures.pass_at_k[3].value == pytest.approx(0.5)
    assert math.isclose(figures.accuracy.value or 0, 1 / 6)


def test_no_tasks_is_an_error() -> None:
    with pytest.raises(ValueError):
        compute_figures([])


def _net_tasks(nets: list[float]) -> list[TaskFigures]:
    return [
        TaskFigures(
            samples=1,
            passed=1,
            latency_s=2.0,
            energy_j=100.0 + net,
            net_energy_j=net,
            completion_tokens=10,
        )
        for net in nets
    ]


def test_net_ratios_are_null_when_mean_net_energy_is_not_above_zero() -> None:
    figures = compute_figures(_net_tasks([-3.0, 1.0, 1.5]))
    assert figures.mean_net_energy_j.value == pytest.approx(-0.5 / 3)
    for ratio in (
        figures.accuracy_per_joule_net,
        figures.accuracy_per_watt_net,
        figures.joules_per_solved_task_net,
        figures.joules_per_output_token_net,
    ):
        assert (ratio.value, ratio.null_reason) == (None, "net-unresolved")
    assert figures.accuracy_per_joule.value is not None  # gross is unaffected


def test_the_idle_baselines_error_widens_mean_net_and_can_unresolve_the_ratios() -> None:
    tasks = _net_tasks([4.0, 5.0, 6.0])
    alone = compute_figures(tasks)
    assert alone.accuracy_per_joule_net.value == pytest.approx(1 / 5.0)
    # 1 W of baseline error over 2-s tasks: +-3.92 J on the mean; the interval stays above 0.
    small = compute_figures(tasks, idle_error_w=1.0)
    assert alone.mean_net_energy_j.low is not None and small.mean_net_energy_j.low is not None
    assert small.mean_net_energy_j.low == pytest.approx(alone.mean_net_energy_j.low - 3.92)
    assert small.accuracy_per_joule_net.value == pytest.approx(1 / 5.0)
    # 2 W: the widened interval reaches 0, so no net ratio is published.
    large = compute_figures(tasks, idle_error_w=2.0)
    assert large.accuracy_per_joule_net.null_reason == "net-unresolved"


def test_0_of_3_has_a_wilson_interval_with_a_positive_upper_end_not_0_0() -> None:
    figures = compute_figures([_task(0, 10.0), _task(0, 12.0), _task(0, 11.0)])
    assert figures.accuracy.value == 0.0 and figures.accuracy.low == 0.0
    assert figures.accuracy.high == pytest.approx(0.5615, abs=1e-4)
    every = compute_figures([_task(1, 10.0), _task(1, 12.0), _task(1, 11.0)])
    assert every.accuracy.high == 1.0 and every.accuracy.low == pytest.approx(0.4385, abs=1e-4)
    # A ratio with accuracy on top has no interval to give when nothing passed: it says why.
    assert (figures.accuracy_per_joule.value, figures.accuracy_per_joule.low) == (0.0, None)
    assert figures.accuracy_per_joule.null_reason == "none-passed"
    assert (figures.passed, figures.trials) == (0, 3)


def test_pass_at_k_carries_a_wilson_interval_over_tasks() -> None:
    figures = compute_figures([_task(1, 10.0, samples=3), _task(0, 10.0, samples=3)])
    low, high = wilson(2 / 3 / 2 * 2, 2) or (None, None)
    assert (figures.pass_at_k[2].low, figures.pass_at_k[2].high) == (low, high)
    # pass@1 is the accuracy, over the six samples.
    assert figures.pass_at_k[1] == figures.accuracy
    assert (figures.accuracy.low, figures.accuracy.high) == wilson(1, 6)


def _overlapping(energy_j: float, latency_s: float) -> TaskFigures:
    return TaskFigures(1, 1, latency_s, energy_j, energy_j / 2, 10, overlapped=True)


def test_mean_power_is_the_machines_over_the_union_not_a_tasks_share() -> None:
    """Four tasks that ran at once, each charged a quarter of 40 J over the same 2 s: the
    machine drew 20 W, though each share over its own time is 5 W."""
    tasks = [_overlapping(10.0, 2.0) for _ in range(4)]
    union = UnionEnergy(energy_j=40.0, net_energy_j=20.0, seconds=2.0)
    figures = compute_figures(tasks, union=union)
    assert figures.mean_power_w.value == pytest.approx(20.0)
    assert figures.accuracy_per_watt.value == pytest.approx(1 / 20.0)
    assert figures.accuracy_per_watt_net.value == pytest.approx(1 / 10.0)
    # Its interval is the accuracy's, over the one measured power.
    assert figures.accuracy.high == 1.0
    assert figures.accuracy_per_watt.high == pytest.approx(1 / 20.0)
    # Without the union, overlapping tasks give no power at all, never a share's.
    alone = compute_figures(tasks)
    assert (alone.mean_power_w.value, alone.mean_power_w.null_reason) == (None, "union-unknown")
    assert alone.accuracy_per_watt.null_reason == "union-unknown"


def test_the_small_n_caution_is_built_from_the_actual_counts() -> None:
    assert small_n_caution(3, [(0, 3)]) == (
        "small n, 3 tasks (0 of 3 passed: 0% to 56% at 95 %); read differences as tentative"
    )
    assert small_n_caution(30, [(0, 30)]) is None


def test_samples_that_could_not_be_scored_are_counted_apart_from_fails() -> None:
    """A judge that gave no verdict scores `error`: not a pass, and counted as such so that
    the summary can say how many of the fails are errors."""
    judged = TaskResultRecord(
        task_id="t1",
        samples=3,
        passed=1,
        latency_s=1.0,
        ttft_s=None,
        decode_tokens_per_s=None,
        prompt_tokens=5,
        completion_tokens=5,
        energy_j=None,
        net_energy_j=None,
        energy_null_reason="no-device",
        completions=("a", "b", "c"),
        statuses=("passed", "error", "failed"),
    )
    flags = window_flags([judged, replace(judged, task_id="t2", statuses=("error",) * 3)])
    assert (flags["samples"], flags["scoring_errors"]) == (6, 4)


def test_the_ratio_of_two_measured_machine_powers_claims_no_interval() -> None:
    """Each run's power is one measurement over its union: their ratio has no resampled
    interval (it once read 0.999 [0.999, 0.999])."""
    tasks = {"t1": _overlapping(10.0, 2.0), "t2": _overlapping(12.0, 2.0)}
    unions = (UnionEnergy(40.0, 20.0, 2.0), UnionEnergy(30.0, 10.0, 2.0))
    ratio = compare_figures(tasks, tasks, unions).ratios["mean_power_w"]
    assert (ratio.value, ratio.low, ratio.high) == (pytest.approx(0.75), None, None)

"""Where the joules go, the configuration table and passes per kJ against concurrency, on a
hand-made GPU run at batch 1 that is mostly idle and a cloud estimate."""

from array import array
from dataclasses import fields, replace

import pytest

from openjarvis.report.accounting import accounting
from openjarvis.report.analysis import concurrency_series
from openjarvis.report.configuration import (
    CONFIGURATION_HEADINGS,
    concurrency_text,
    configuration_cells,
)
from openjarvis.report.content import joules_block
from openjarvis.report.joules import DomainPart, breakdown, breakdown_sentence
from openjarvis.report.plots import concurrency_plot, power_traces_plot
from openjarvis.report.runs import short_label
from openjarvis.store import EnergyRecord, RunRecord, TaskResultRecord
from tests.report.test_gate import H200, run
from tests.report.test_routing import make_task

__all__: list[str] = []

IN_SCOPE = ["nvml:GPU-aaaa", "rapl:package-0"]


def reading(source: str, domain: str, energy_j: float, net_j: float | None, method: str):
    return EnergyRecord(source, domain, method, energy_j, net_j, None, None, False)


def gpu_task(index: int, gpu: tuple[float, float], cpu: tuple[float, float]) -> TaskResultRecord:
    """One task of 1 s: the GPU counter and an estimated CPU package in scope, and the CPU
    estimate traced beside them out of scope (18 J, in no total)."""
    readings = (
        reading("nvml:GPU-aaaa", "gpu", *gpu, "counter"),
        reading("rapl:package-0", "cpu", *cpu, "estimate"),
        reading("estimate:cpu", "cpu", 18.0, None, "estimate"),
    )
    base = make_task(index, False, gpu[0] + cpu[0])
    return replace(base, net_energy_j=gpu[1] + cpu[1], energy=readings)


# gross (net) per task: GPU 120 (20), 110 (10), 95 (-5); CPU 15 (5), 12 (2), 10 (0)
TASKS = [
    gpu_task(0, (120.0, 20.0), (15.0, 5.0)),
    gpu_task(1, (110.0, 10.0), (12.0, 2.0)),
    gpu_task(2, (95.0, -5.0), (10.0, 0.0)),
]
GPU_RUN = run(
    "g",
    "gemma",
    energy_coverage={"in_scope": IN_SCOPE, "out_of_scope": [], "missing": {}},
    idle_power_w={"nvml:GPU-aaaa": 100.0, "rapl:package-0": 10.0, "estimate:cpu": 18.0},
    summary={"memory_bandwidth_utilisation": 0.029, "mean_power_w": {"value": 120.7}},
)


def test_a_mostly_idle_gpu_run_by_hand() -> None:
    split = breakdown(GPU_RUN, TASKS, accounting(GPU_RUN, TASKS), "gemma · H200 · torch", "H200")
    # gross (135 + 122 + 105) / 3; net (25 + 12 - 5) / 3; the idle floor is their difference.
    assert split.gross_j == pytest.approx(362 / 3)
    assert split.idle_floor_j == pytest.approx(362 / 3 - 32 / 3)
    assert split.idle_share == pytest.approx(330 / 362)
    assert split.idle_power_w == pytest.approx(110.0)  # in scope only: not the 18 W estimate
    assert all(isinstance(part, DomainPart) for part in split.parts)
    assert tuple((part.domain, part.net_j, part.estimated) for part in split.parts) == (
        ("gpu", pytest.approx(25 / 3), False),
        ("cpu", pytest.approx(7 / 3), True),
    )
    assert split.negative_net_tasks == 1
    assert split.out_of_scope == ("estimate:cpu",)
    assert split.memory_bandwidth_use == pytest.approx(0.029)
    assert breakdown_sentence(split) == (
        "gemma · H200 · torch: 91% of 121 J per task is the idle floor (110 W idle against "
        "121 W mean): the hardware is mostly idle at this load; decode used 2.9% of memory "
        "bandwidth."
    )
    block = joules_block([split])
    (table,) = block.tables
    row = dict(zip(table.headings, table.rows[0], strict=True))
    assert row["net J by domain"] == "gpu 8.33, cpu 2.33 est."
    assert row["net < 0 tasks"] == "1" and row["prefill J"] == "—"
    limits = [line.text for line in block.lines if line.limit]
    assert limits[0].startswith("gemma · H200 · torch: 1 task(s) drew less than the idle")
    assert limits[1].startswith("gemma · H200 · torch: estimate:cpu read but outside")


def test_a_cloud_estimate_has_no_idle_floor_and_unknowns_stay_unknown() -> None:
    cloud = run("c", "gpt-4o", engine="openai", method="estimate", host=None)
    tasks = [replace(make_task(0, True, 900.0), net_energy_j=None)]
    split = breakdown(cloud, tasks, accounting(cloud, tasks), "gpt-4o · cloud · openai", "cloud")
    assert split.idle_floor_j is None and split.idle_share is None
    assert split.idle_power_w is None and split.memory_bandwidth_use is None
    assert breakdown_sentence(split).startswith("gpt-4o · cloud · openai: an estimate of 900 J")
    (table,) = joules_block([split]).tables
    row = dict(zip(table.headings, table.rows[0], strict=True))
    assert row["idle floor J"] == row["idle share"] == row["idle W"] == "—"


def test_the_configuration_table_shows_what_each_run_recorded() -> None:
    measured = replace(GPU_RUN, summary={"tasks": 164, "samples": 1})
    llama = run("q", "qwen", engine="llamacpp", model_quantisation="Q4_K_M", host=None)
    rows = [
        dict(zip(CONFIGURATION_HEADINGS, r, strict=True))
        for r in configuration_cells([measured, llama])
    ]
    assert rows[0]["precision"] == "bfloat16" and rows[0]["quantisation"] == "—"
    assert rows[0]["hardware"] == "H200" and rows[0]["host"] == "box · 1 x NVIDIA H200"
    assert rows[0]["driver"] == H200.gpu_driver and rows[0]["tasks"] == "164"
    assert rows[0]["energy scope"] == (
        "accelerator: the GPUs the engine ran on (nvml:GPU-aaaa, rapl:package-0), counter energy"
    )
    assert rows[1]["precision"] == rows[1]["quantisation"] == "Q4_K_M"
    assert rows[1]["tasks"] == rows[1]["driver"] == "—"
    # Concurrency only as the run recorded it: runs gain the field with --concurrency.
    recorded = getattr(llama, "concurrency", None)
    assert concurrency_text(llama) == ("—" if recorded is None else str(recorded))


@pytest.mark.skipif(
    "concurrency" not in {f.name for f in fields(RunRecord)},
    reason="runs record their concurrency once `ipw measure --concurrency` lands in the store",
)
def test_passes_per_kj_against_concurrency_only_where_a_configuration_has_two() -> None:
    def at(run_id: str, model: str, concurrency: int, apj: float) -> RunRecord:
        summary = {"accuracy_per_joule": {"value": apj, "low": apj * 0.9, "high": apj * 1.1}}
        return replace(run(run_id, model, summary=summary), concurrency=concurrency)

    groups = [at("a1", "gemma", 1, 0.002), at("a8", "gemma", 8, 0.009), at("q1", "qwen", 1, 0.01)]
    series = concurrency_series(groups)
    # qwen was measured at one concurrency only: no line for it.
    assert {key: [r.id for r in runs] for key, runs in series.items()} == {
        "gemma · H200 · torch · humaneval": ["a1", "a8"]
    }
    assert short_label(groups[1]) == "gemma · H200 · torch · 8 at once"
    assert short_label(groups[0]) == "gemma · H200 · torch"
    svg = concurrency_plot(series, {"H200": "#1f77b4"}).svg
    assert "requests in flight" in svg and "gemma" in svg


def test_a_traced_source_outside_the_scope_is_dashed_and_says_it_is_not_in_the_total() -> None:
    def series(watts: float) -> tuple[array, array]:
        return array("d", [0.0, 1.0, 2.0]), array("d", [watts] * 3)

    traces = {"nvml:GPU-aaaa": series(130.0), "estimate:cpu": series(18.0)}
    svg = power_traces_plot([(GPU_RUN, traces)]).svg
    assert "estimate:cpu (not in total)" in svg
    assert "nvml:GPU-aaaa (not in total)" not in svg and "nvml:GPU-aaaa" in svg


def test_mean_power_is_the_machines_over_the_union_when_tasks_shared_the_engine() -> None:
    """Four tasks at once on a board drawing 300 W: each task's share over its own time reads
    75 W (what the run stored as its mean of shares), below the 110 W idle, which would call a
    working machine idle. The union of the windows gives the machine's 300 W."""
    concurrency = {"concurrency": 4, "union_energy_j": 600.0, "union_seconds": 2.0}
    busy_run = replace(
        GPU_RUN, summary={"mean_power_w": {"value": 75.0}, "concurrency": concurrency}
    )
    split = breakdown(busy_run, TASKS, accounting(busy_run, TASKS), "gemma", "H200")
    assert split.mean_power_w == pytest.approx(300.0)
    assert "(110 W idle against 300 W mean)" in breakdown_sentence(split)

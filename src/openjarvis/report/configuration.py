"""What each run was, beside its result (as ML.ENERGY and MLPerf Power print it): engine,
precision, quantisation, concurrency, tasks, samples, driver, energy scope and the machine.
"""

from collections.abc import Sequence

from openjarvis.report.runs import (
    concurrency_of,
    coverage_missing,
    coverage_names,
    hardware_label,
    host_label,
    is_cloud,
    scope_label,
)
from openjarvis.store import RunRecord

__all__ = [
    "CONFIGURATION_HEADINGS",
    "concurrency_text",
    "configuration_cells",
    "precision_label",
    "scope_definition",
]

CONFIGURATION_HEADINGS = (
    "run",
    "model",
    "hardware",
    "host",
    "engine",
    "precision",
    "quantisation",
    "concurrency",
    "tasks",
    "samples",
    "driver",
    "energy scope",
)

SCOPE_MEANING = {
    "accelerator": "the GPUs the engine ran on",
    "system": "GPUs, CPU packages and DRAM",
}


def precision_label(run: RunRecord) -> str:
    """The weights' number format as the run recorded it: the quantisation (llama.cpp), the
    torch engine's dtype setting (`auto` is bf16 on a GPU, fp32 on a CPU), `—` when unknown."""
    if run.model_quantisation:
        return run.model_quantisation
    dtype = run.engine_settings.get("dtype")
    return str(dtype) if isinstance(dtype, str) else "—"


def concurrency_text(run: RunRecord) -> str:
    """Requests in flight at once, only as the run recorded it (`—` for runs that did not)."""
    value = concurrency_of(run)
    return "—" if value is None else str(value)


def scope_definition(run: RunRecord) -> str:
    """The scope in words with the sources it summed: `accelerator: the GPUs the engine ran on
    (nvml:GPU-…)`; a partial scope names what it left out."""
    meaning = "a labelled estimate" if is_cloud(run) else SCOPE_MEANING.get(run.energy_scope, "")
    sources = coverage_names(run.energy_coverage, "in_scope")
    missing = coverage_missing(run.energy_coverage)
    text = scope_label(run.energy_scope, run.energy_coverage, detail=False)
    if meaning:
        text += f": {meaning}"
    if sources:
        text += f" ({', '.join(sources)})"
    if missing:
        text += f"; unread: {', '.join(missing)}"
    return f"{text}, {run.energy_method or 'no'} energy"


def _count(value: object) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "—"


def _counts(run: RunRecord) -> tuple[str, str]:
    """Tasks and samples behind the run's figures."""
    summary = run.summary or {}
    return _count(summary.get("tasks")), _count(summary.get("samples", run.options.get("samples")))


def configuration_cells(runs: Sequence[RunRecord]) -> list[list[str]]:
    """One row of cells per run under CONFIGURATION_HEADINGS; `—` for what the run did not
    record."""
    rows = []
    for run in runs:
        tasks, samples = _counts(run)
        host = run.host
        rows.append(
            [
                (run.id or "")[:8],
                run.model_name,
                hardware_label(run),
                host_label(run),
                run.engine,
                precision_label(run),
                run.model_quantisation or "—",
                concurrency_text(run),
                tasks,
                samples,
                host.gpu_driver if host is not None and host.gpu_driver else "—",
                scope_definition(run),
            ]
        )
    return rows

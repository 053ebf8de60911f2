"""Stored runs as plain rows and labels: the one place reports read a run's figures and provenance.

A run's figures are the RunFigures dict `ipw measure` stored in `run.summary` (metrics.py).
"""

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import PurePath
from typing import Any

from openjarvis.engine_kinds import LOCAL_ENGINE_KINDS
from openjarvis.store import RunRecord

__all__ = [
    "FIGURE_COLUMNS",
    "Interval",
    "busy_evidence",
    "concurrency_of",
    "coverage_missing",
    "coverage_names",
    "distinct_labels",
    "energy_label",
    "figure",
    "format_interval",
    "format_value",
    "frontiers",
    "hardware_label",
    "host_label",
    "is_cloud",
    "is_estimate",
    "is_partial",
    "mark_estimate",
    "mean_if_known",
    "model_label",
    "newest_per_group",
    "pareto_frontier",
    "run_row",
    "run_tasks_text",
    "run_to_dict",
    "scaled",
    "scope_label",
    "short_label",
    "suite_name",
    "suite_titles",
]

# Figures with intervals that tables, CSV and JSON carry, in display order, with their headings.
FIGURE_COLUMNS = {
    "accuracy": "accuracy",
    "mean_energy_j": "J per task",
    "mean_net_energy_j": "net J per task",
    "accuracy_per_joule": "accuracy per J",
    "accuracy_per_joule_net": "accuracy per net J",
    "accuracy_per_watt": "accuracy per W",
    "joules_per_output_token": "J per output token",
    "mean_power_w": "mean W",
}

Interval = tuple[float | None, float | None, float | None]  # value, low, high


def is_cloud(run: RunRecord) -> bool:
    """A run on a remote API, whose energy nobody here can read (a server on the measuring
    machine, metered with its sources, is local: its engine settings say `meter: local`)."""
    return run.engine not in LOCAL_ENGINE_KINDS and run.engine_settings.get("meter") != "local"


def is_estimate(run: RunRecord) -> bool:
    """Energy from a model rather than a counter; such figures are always labelled."""
    return run.energy_method == "estimate"


def coverage_missing(coverage: Mapping[str, object]) -> dict[str, str]:
    """The sources in scope that could not be read, with why, from a stored coverage."""
    missing = coverage.get("missing")
    return {str(k): str(v) for k, v in missing.items()} if isinstance(missing, dict) else {}


def coverage_names(coverage: Mapping[str, object], key: str) -> list[str]:
    """The source names a stored coverage lists under `in_scope` or `out_of_scope`."""
    names = coverage.get(key)
    return [str(name) for name in names] if isinstance(names, list) else []


def is_partial(run: RunRecord) -> bool:
    """A source in the run's scope could not be read: its energy is a smaller sum than the
    scope names (docs/energy.md, "Scope"). Runs stored without coverage are not."""
    return bool(coverage_missing(run.energy_coverage))


def scope_label(scope: str, coverage: Mapping[str, object], detail: bool = True) -> str:
    """`accelerator`, or `accelerator (partial: nvml:GPU-... permission)` with a missing source;
    without `detail`, `accelerator (partial)` for table cells."""
    missing = coverage_missing(coverage)
    if not missing:
        return scope
    if not detail:
        return f"{scope} (partial)"
    return f"{scope} (partial: {', '.join(f'{name} {why}' for name, why in missing.items())})"


def energy_label(run: RunRecord) -> str:
    """Method and scope as tables show them: `counter · accelerator (partial)`."""
    scope = scope_label(run.energy_scope, run.energy_coverage, detail=False)
    return f"{run.energy_method or 'none'} · {scope}"


def host_label(run: RunRecord) -> str:
    """The machine as a person tells it apart: hostname and what it computes with (virtual
    machines are often all called `vm`, `localhost` or a container id)."""
    if is_cloud(run):
        return f"cloud ({run.engine})"
    host = run.host
    if host is None:
        return "unknown host"
    # GPUs are stored as "NAME (GPU-uuid)"; runs stored before names were kept have the uuid.
    names = Counter(gpu.split(" (GPU-")[0] for gpu in host.gpus if not gpu.startswith("nvml:"))
    if names:
        hardware = ", ".join(f"{count} x {name}" for name, count in sorted(names.items()))
    elif host.gpus:
        hardware = f"{len(host.gpus)} GPU{'s' if len(host.gpus) > 1 else ''}"
    else:
        cpu = re.sub(r"\((R|TM)\)|\bCPU\b|\bProcessor\b|@.*$", "", host.cpu_model or "")
        hardware = " ".join(cpu.split()) or "CPU"
        if host.cpu_physical_cores:  # None (or 0, stored before 0008) when unknown
            hardware += f", {host.cpu_physical_cores} cores"
    return f"{host.hostname} · {hardware}"


def model_label(run: RunRecord) -> str:
    """The model's name, with its quantisation unless the name already says it
    (`gemma-3-270m-it-Q4_K_M`, not `gemma-3-270m-it-Q4_K_M Q4_K_M`)."""
    quantisation = run.model_quantisation
    if not quantisation or quantisation.lower() in run.model_name.lower():
        return run.model_name
    return f"{run.model_name} {quantisation}"


def hardware_label(run: RunRecord) -> str:
    """What the run computed on, without the hostname: `H200`, `2xH200`, `EPYC 7B13 (2 cores)`,
    `cloud` (the engine names the provider). Charts give each hardware one colour; host_label
    tells machines apart."""
    if is_cloud(run):
        return "cloud"
    host = run.host
    if host is None:
        return "unknown hardware"
    names = Counter(
        gpu.split(" (GPU-")[0].removeprefix("NVIDIA ").strip()
        for gpu in host.gpus
        if not gpu.startswith("nvml:")
    )
    if names:
        return ", ".join(
            name if count == 1 else f"{count}x{name}" for name, count in sorted(names.items())
        )
    if host.gpus:
        return f"{len(host.gpus)} GPU{'s' if len(host.gpus) > 1 else ''}"
    cpu = re.sub(r"\((R|TM)\)|\bCPU\b|\bProcessor\b|@.*$|^(AMD|Intel)\b", "", host.cpu_model or "")
    cores = f" ({host.cpu_physical_cores} cores)" if host.cpu_physical_cores else ""
    return f"{' '.join(cpu.split()) or 'CPU'}{cores}"


def concurrency_of(run: RunRecord) -> int | None:
    """Requests in flight at once, as the run recorded it; None for runs that did not."""
    value = getattr(run, "concurrency", None)  # runs gain the field with `--concurrency`
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def short_label(run: RunRecord) -> str:
    """`model · hardware · engine` (and `· 8 at once` where requests ran concurrently): how
    every chart and headline names a run."""
    concurrency = concurrency_of(run)
    at_once = f" · {concurrency} at once" if concurrency is not None and concurrency > 1 else ""
    return f"{model_label(run)} · {hardware_label(run)} · {run.engine}{at_once}"


def suite_name(run: RunRecord) -> str:
    """The suite as titles and labels show it: its name, without options or folders (runs
    stored before a suite kept its own name carry `lm-eval:x?limit=3&include=/tmp/...`, or the
    path a suite file was given by)."""
    name = run.suite.split("?", 1)[0]
    return PurePath(name).name if "/" in name or "\\" in name else name


def suite_titles(runs: Sequence[RunRecord]) -> dict[str, str]:
    """Run id -> its suite as sections and verdicts tell suites apart: its name, with the start
    of its content hash where runs of one name ran different tasks (two files named alike, a
    file edited between runs). Runs stored before suites were hashed keep the plain name."""
    hashes: dict[str, set[str | None]] = {}
    for run in runs:
        hashes.setdefault(suite_name(run), set()).add(run.suite_sha256)
    titles = {}
    for run in runs:
        name, digest = suite_name(run), run.suite_sha256
        differ = len(hashes[name]) > 1 and digest is not None
        titles[run.id or ""] = f"{name} ({digest[:8]})" if differ and digest else name
    return titles


def distinct_labels(runs: Sequence[RunRecord]) -> dict[str, str]:
    """Run id -> its label, told apart from the others': `short_label` (which names tasks in
    flight above 1), then the suite where runs of one label ran different suites, then the
    energy method and scope, then the run id's first eight characters where two runs are still
    alike."""
    labels = {run.id or "": short_label(run) for run in runs}

    def refine(describe: Callable[[RunRecord], str]) -> None:
        alike: dict[str, list[RunRecord]] = {}
        for run in runs:
            alike.setdefault(labels[run.id or ""], []).append(run)
        for members in alike.values():
            if len({describe(run) for run in members}) > 1:
                for run in members:
                    labels[run.id or ""] += f" · {describe(run)}"

    refine(suite_name)
    refine(energy_label)
    refine(lambda run: f"run {(run.id or '')[:8]}")
    return labels


def mean_if_known(values: Sequence[float | None]) -> float | None:
    """The mean, or None when there are no values or any is unknown."""
    if not values or any(value is None for value in values):
        return None
    return sum(value for value in values if value is not None) / len(values)


def scaled(interval: Interval, scale: float) -> Interval:
    """An interval in other units (accuracy per J to passes per kJ: times 1000); unknowns stay
    None."""
    value, low, high = interval
    return (
        None if value is None else value * scale,
        None if low is None else low * scale,
        None if high is None else high * scale,
    )


def run_tasks_text(run: RunRecord) -> str:
    """The number of tasks behind the run's stored figures, `—` when it has none."""
    tasks = (run.summary or {}).get("tasks")
    return str(tasks) if isinstance(tasks, int) else "—"


def figure(run: RunRecord, name: str) -> Interval:
    """A figure of the run's stored summary; all None when the run has none or it is undefined."""
    summary = run.summary or {}
    value = summary.get(name)
    if isinstance(value, dict):
        return value.get("value"), value.get("low"), value.get("high")
    if isinstance(value, int | float):
        return float(value), None, None
    return None, None, None


def busy_evidence(run: RunRecord) -> list[str]:
    """What made the run's machine busy (the `machine` check `ipw measure` stored: other
    processes' CPU time or GPU contexts, an idle baseline above the model's); empty when it
    was quiet or not checked."""
    machine = (run.summary or {}).get("machine")
    if not isinstance(machine, dict) or not machine.get("busy"):
        return []
    evidence = machine.get("evidence")
    return [str(line) for line in evidence] if isinstance(evidence, list) else []


def mark_estimate(text: str, run: RunRecord) -> str:
    """An energy figure as shown: an estimated run's carry ' est.', so none appears unmarked."""
    return f"{text} est." if is_estimate(run) and text != "—" else text


def format_value(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def format_interval(value: float | None, low: float | None, high: float | None) -> str:
    """`value [low, high]`, or `—` for an unknown value; the one formatting of an estimate."""
    if value is None:
        return "—"
    if low is None or high is None:
        return format_value(value)
    return f"{format_value(value)} [{format_value(low)}, {format_value(high)}]"


def run_row(run: RunRecord) -> dict[str, Any]:
    """One flat row per run for CSV and tables: provenance, then each figure with its interval."""
    row: dict[str, Any] = {
        "run_id": run.id,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "state": run.state,
        "model": run.model_name,
        "quantisation": run.model_quantisation,
        "engine": run.engine,
        "host": host_label(run),
        "host_fingerprint": run.host.fingerprint if run.host is not None else None,
        "suite": run.suite,
        "energy_scope": run.energy_scope,
        "energy_method": run.energy_method,
        "energy_partial": is_partial(run),
        "tasks": (run.summary or {}).get("tasks"),
    }
    for name in FIGURE_COLUMNS:
        value, low, high = figure(run, name)
        row[name] = value
        row[f"{name}_low"] = low
        row[f"{name}_high"] = high
    row["decode_tokens_per_s"] = figure(run, "decode_tokens_per_s")[0]
    row["latency_p50_s"] = figure(run, "latency_p50_s")[0]
    return row


def run_to_dict(run: RunRecord) -> dict[str, Any]:
    """The whole record, JSON-ready (times as ISO 8601 strings, the host as a dict)."""
    data = {field.name: getattr(run, field.name) for field in dataclasses.fields(run)}
    for key in ("started_at", "finished_at", "heartbeat_at"):
        data[key] = data[key].isoformat() if isinstance(data[key], datetime) else None
    if run.host is not None:
        data["host"] = {
            field.name: getattr(run.host, field.name) for field in dataclasses.fields(run.host)
        }
    return data


def newest_per_group(runs: Sequence[RunRecord]) -> list[RunRecord]:
    """The newest run with figures of each configuration (model, host, engine, concurrency,
    suite), for the comparisons and per-configuration plots."""
    chosen: dict[tuple[str, str, str, int | None, str], RunRecord] = {}
    for run in runs:
        if run.summary is None:
            continue
        key = (model_label(run), host_label(run), run.engine, concurrency_of(run), run.suite)
        current = chosen.get(key)
        if current is None or _start_s(run) > _start_s(current):
            chosen[key] = run
    return sorted(chosen.values(), key=lambda run: (host_label(run), model_label(run), run.suite))


def _start_s(run: RunRecord) -> float:
    return run.started_at.timestamp() if run.started_at is not None else 0.0


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both less energy (x) and more accuracy (y).

    Returned in order of increasing x. Equal points are kept once (the first).
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1], i))
    frontier: list[int] = []
    for index in order:
        if not frontier or points[index][1] > points[frontier[-1]][1]:
            frontier.append(index)
    return frontier


def frontiers(runs: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    """Pareto frontiers of accuracy versus mean J per task over each run's own tasks, one per
    energy scope and method class (groups of one included). The report draws gate.section_frontier
    instead: on shared tasks, from two points or more; this stays for callers that rank stored
    figures (tests/cli/test_energy_scope.py).

    Measured and estimated energy, two scopes, or a partial scope and a whole one, are never
    ranked against each other.
    """
    groups: dict[str, list[tuple[RunRecord, tuple[float, float]]]] = {}
    for run in runs:
        energy_j, accuracy = figure(run, "mean_energy_j")[0], figure(run, "accuracy")[0]
        if energy_j is None or accuracy is None:
            continue
        kind = "estimated" if is_estimate(run) else "measured"
        partial = " (partial)" if is_partial(run) else ""
        key = f"{run.energy_scope} scope{partial}, {kind}"
        groups.setdefault(key, []).append((run, (energy_j, accuracy)))
    result = {}
    for key, members in sorted(groups.items()):
        frontier = pareto_frontier([point for _, point in members])
        result[key] = [members[i][0] for i in frontier]
    return result

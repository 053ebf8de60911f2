"""The comparability gate: runs are compared only within one suite, energy scope and method
class, on the tasks all of them ran, and every figure carries its n (docs/report.md).

Modelled on MLPerf Power (results compared only within one division and measured system
boundary) and the ML.ENERGY leaderboard (one task, the configuration beside every figure).
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from openjarvis.intervals import small_n_caution, wilson
from openjarvis.metrics import (
    Estimate,
    compare_figures,
    run_figures,
    task_figures,
    union_energy,
)
from openjarvis.report.configuration import precision_label, scope_definition
from openjarvis.report.runs import (
    busy_evidence,
    coverage_names,
    distinct_labels,
    is_estimate,
    pareto_frontier,
    scope_label,
    short_label,
    suite_name,
    suite_titles,
)
from openjarvis.report.uncertainty import banded_energy_j, estimate_band
from openjarvis.store import RunRecord, TaskResultRecord

__all__ = [
    "Entry",
    "Headline",
    "Section",
    "SharedFigures",
    "Verdict",
    "comparison_class",
    "entry",
    "gate",
    "headline",
    "section_frontier",
    "shared_figures",
    "shared_tasks",
    "verdict",
]

# A run whose tasks would cut the section's shared set below this share is left out of the
# section (and said so) rather than shrinking every other run's comparison to its few tasks.
KEEP_SHARED_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class SharedFigures:
    """The figures a section shows of one run, on the section's shared tasks."""

    tasks: int
    accuracy: Estimate
    mean_energy_j: Estimate
    accuracy_per_joule: Estimate


SHARED_FIGURES = ("accuracy", "mean_energy_j", "accuracy_per_joule")


def _stored(summary: Mapping[str, object], name: str) -> Estimate | None:
    value = summary.get(name)
    if not isinstance(value, dict):
        return None
    return Estimate(
        value.get("value"), value.get("low"), value.get("high"), value.get("null_reason")
    )


def shared_figures(run: RunRecord, tasks: Sequence[TaskResultRecord]) -> SharedFigures:
    """metrics' figures over `tasks`: those `ipw measure` stored when `tasks` are all the
    run's tasks (the same tasks and bootstrap seed give the same numbers, and recomputing them
    for every run was most of a large report's time), else computed on `tasks`."""
    stored = [_stored(run.summary or {}, name) for name in SHARED_FIGURES]
    if (run.summary or {}).get("tasks") == len(tasks) and all(stored):
        accuracy, energy, apj = (estimate for estimate in stored if estimate is not None)
        return SharedFigures(len(tasks), accuracy, energy, apj)
    computed = run_figures(run, tasks)
    return SharedFigures(
        len(tasks), computed.accuracy, computed.mean_energy_j, computed.accuracy_per_joule
    )


@dataclass(frozen=True, slots=True)
class Entry:
    """One run inside a section: its figures on the section's shared tasks only."""

    run: RunRecord
    all_tasks: tuple[TaskResultRecord, ...]
    task_ids: tuple[str, ...]  # the section's shared tasks, sorted
    shared: tuple[TaskResultRecord, ...]  # the run's tasks among them, in all_tasks' order
    figures: SharedFigures
    label: str  # told apart from the other runs' (runs.distinct_labels)

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.shared)

    @property
    def trials(self) -> int:
        return sum(t.samples for t in self.shared)

    def accuracy_interval(self) -> tuple[float, float] | None:
        """95 % Wilson interval over the samples of the shared tasks."""
        return wilson(self.passed, self.trials)

    def estimated_energy_j(self) -> float | None:
        """Mean estimated joules per shared task: the readings of an `estimate` method among the
        sources in scope, or the whole energy of an estimated run stored without readings;
        None when unknown."""
        in_scope = set(coverage_names(self.run.energy_coverage, "in_scope"))
        shared = self.shared
        total = 0.0
        for task in shared:
            if task.energy:
                parts = [
                    e.energy_j
                    for e in task.energy
                    if e.method == "estimate" and (not in_scope or e.source in in_scope)
                ]
                if None in parts:
                    return None
                total += sum(p for p in parts if p is not None)
            elif is_estimate(self.run):
                if task.energy_j is None:
                    return None
                total += task.energy_j
        return total / len(shared) if shared else None

    def energy_band_j(self) -> tuple[float, float] | None:
        """Mean J per task widened by the stated band of its estimated part (None: no part
        estimated, or energy unknown)."""
        return banded_energy_j(
            self.figures.mean_energy_j.value, self.estimated_energy_j(), estimate_band(self.run)
        )


@dataclass(frozen=True, slots=True)
class Section:
    """Runs of one suite, energy scope and method class, compared on their shared tasks."""

    suite: str
    scope: str  # scope_label without detail: `system`, `accelerator (partial)`
    measured: bool
    entries: tuple[Entry, ...]  # best first (see _rank)
    task_ids: tuple[str, ...]
    left_out: tuple[tuple[RunRecord, str], ...]  # runs of this class not compared, and why

    @property
    def title(self) -> str:
        kind = "measured" if self.measured else "estimated"
        return f"{self.suite} · {self.scope} scope · {kind} energy · n = {len(self.task_ids)}"

    @property
    def slug(self) -> str:
        text = f"{self.suite}-{self.scope}-{'measured' if self.measured else 'estimated'}"
        return "".join(c if c.isalnum() else "-" for c in text.lower())


def comparison_class(run: RunRecord) -> tuple[str, str, bool]:
    """(suite, scope, measured): only runs of one class share a section, an axis, a frontier."""
    scope = scope_label(run.energy_scope, run.energy_coverage, detail=False)
    return suite_name(run), scope, not is_estimate(run)


def _rank(entry: Entry) -> tuple[float, float]:
    """Most accuracy per joule first; where none passed anything, least energy per task."""
    apj = entry.figures.accuracy_per_joule.value
    energy_j = entry.figures.mean_energy_j.value
    return (-1.0 if apj is None else apj, -(math.inf if energy_j is None else energy_j))


def _entry(run: RunRecord, tasks: Sequence[TaskResultRecord], ids: set[str], label: str) -> Entry:
    shared = tuple(t for t in tasks if t.task_id in ids)
    figures = shared_figures(run, shared)
    return Entry(run, tuple(tasks), tuple(sorted(ids)), shared, figures, label)


def entry(run: RunRecord, tasks: Sequence[TaskResultRecord], label: str) -> Entry:
    """A run on all its own tasks, for a verdict against another (`ipw compare`)."""
    return _entry(run, tasks, {t.task_id for t in tasks}, label)


def shared_tasks(
    runs: Sequence[RunRecord],
    tasks: Mapping[str, Sequence[TaskResultRecord]],
    prefer: Callable[[RunRecord], bool] = lambda run: False,
) -> tuple[list[RunRecord], set[str], list[tuple[RunRecord, str]]]:
    """The runs compared, the task ids all of them ran, and the runs left out with why.

    Runs `prefer` picks come first, then those with the most tasks; a run joins only if the
    others keep at least KEEP_SHARED_SHARE of the tasks they share (else every comparison would
    shrink to its few).
    """
    left_out: list[tuple[RunRecord, str]] = []
    kept: list[RunRecord] = []
    ids: set[str] = set()
    for run in sorted(runs, key=lambda r: (not prefer(r), -len(tasks.get(r.id or "", ())))):
        own = {t.task_id for t in tasks.get(run.id or "", ())}
        if not own:
            left_out.append((run, "no saved tasks"))
            continue
        shared = own & ids if kept else own
        if not shared:
            left_out.append((run, "shares no task with the others"))
            continue
        if len(kept) >= 2 and len(shared) < KEEP_SHARED_SHARE * len(ids):
            left_out.append((run, f"ran {len(own)} of the {len(ids)} tasks the others share"))
            continue
        ids = shared
        kept.append(run)
    return kept, ids, left_out


def _section(
    key: tuple[str, str, bool],
    runs: Sequence[RunRecord],
    tasks: Mapping[str, Sequence[TaskResultRecord]],
    labels: Mapping[str, str],
) -> Section:
    kept, ids, left_out = shared_tasks(runs, tasks)
    entries = [_entry(run, tasks[run.id or ""], ids, labels[run.id or ""]) for run in kept]
    entries.sort(key=_rank, reverse=True)
    return Section(key[0], key[1], key[2], tuple(entries), tuple(sorted(ids)), tuple(left_out))


def gate(
    runs: Sequence[RunRecord], tasks: Mapping[str, Sequence[TaskResultRecord]]
) -> list[Section]:
    """The runs' sections: measured before estimated, then the most runs and tasks first.
    Runs are named by `distinct_labels` over all of them, so no two read alike."""
    labels = distinct_labels(runs)
    titles = suite_titles(runs)  # one name, other tasks: another section
    classes: dict[tuple[str, str, bool], list[RunRecord]] = {}
    for run in runs:
        _, scope, measured = comparison_class(run)
        classes.setdefault((titles[run.id or ""], scope, measured), []).append(run)
    sections = [_section(key, members, tasks, labels) for key, members in classes.items()]
    return sorted(
        sections,
        key=lambda s: (not s.measured, -len(s.entries), -len(s.task_ids), s.suite, s.scope),
    )


def section_frontier(section: Section) -> list[Entry]:
    """The section's Pareto frontier on its shared tasks (less energy, more accuracy), only
    where it has two points or more: one run alone is no frontier."""
    known: list[Entry] = []
    points: list[tuple[float, float]] = []
    for entry in section.entries:
        energy_j, accuracy = entry.figures.mean_energy_j.value, entry.figures.accuracy.value
        if energy_j is not None and accuracy is not None:
            known.append(entry)
            points.append((energy_j, accuracy))
    frontier = [known[i] for i in pareto_frontier(points)]
    return frontier if len(frontier) >= 2 else []


@dataclass(frozen=True, slots=True)
class Verdict:
    """`best` against `other` on the tasks both ran: one ratio, its interval, what limits it."""

    best: Entry
    other: Entry
    tasks: int
    figure: str  # "accuracy_per_joule" (best / other) or "mean_energy_j" (other / best)
    ratio: Estimate
    like_for_like: bool  # same section: same suite, scope and method class
    limits: tuple[str, ...]
    passed: tuple[int, int]  # samples passed on the shared tasks: best's, other's
    samples: tuple[int, int]
    busy: bool = False  # either run was measured on a busy machine (power/quiet.py)

    @property
    def resolved(self) -> bool:
        """The ratio's interval excludes 1 and both runs had the machine to themselves: the
        difference is more than sampling noise, and not another program's draw."""
        low, high = self.ratio.low, self.ratio.high
        excludes_one = (low is not None and low > 1) or (high is not None and high < 1)
        return excludes_one and not self.busy

    def limits_sentence(self) -> str:
        if not self.limits:
            return (
                "Nothing recorded limits this comparison: same scope, method, engine and "
                "precision, enough tasks."
            )
        return "What limits this: " + "; ".join(self.limits) + "."

    def to_json(self) -> dict[str, object]:
        return {
            "sentence": self.sentence(),
            "limits": list(self.limits),
            "like_for_like": self.like_for_like,
            "tasks": self.tasks,
            "best": self.best.run.id,
            "other": self.other.run.id,
            "figure": self.figure,
            "ratio": asdict(self.ratio),
            "resolved": self.resolved,
            "busy_machine": self.busy,
            "passed": list(self.passed),
            "samples": list(self.samples),
        }

    def sentence(self) -> str:
        value, low, high = self.ratio.value, self.ratio.low, self.ratio.high
        counts = (
            f" ({self.passed[0]}/{self.samples[0]} against {self.passed[1]}/{self.samples[1]} "
            "passed)"
        )
        if self.ratio.null_reason == "one-passed-none":
            return (
                f"On the {self.tasks} tasks both ran, {self.best.label} passes "
                f"{self.passed[0]}/{self.samples[0]} and {self.other.label} none: no ratio of "
                "passes per kJ bounds that."
            )
        if value is None:
            return (
                f"{self.best.label} and {self.other.label} cannot be compared on energy "
                f"({self.ratio.null_reason}) over the {self.tasks} tasks both ran."
            )
        interval = ""
        if low is not None:
            interval = f" [{low:.2g}, {'no upper bound' if high is None else f'{high:.2g}'}]"
        if self.figure == "accuracy_per_joule":
            claim = (
                f"{self.best.label} does {value:.2g}x{interval} the passes per kJ of "
                f"{self.other.label}"
            )
        else:
            claim = (
                f"{self.other.label} uses {value:.2g}x{interval} the energy per task of "
                f"{self.best.label}"
            )
        claim += f" on the {self.tasks} tasks both ran{counts}"
        if self.busy:
            claim += " (not resolved: measured on a busy machine)"
        elif not self.resolved:
            claim += " (not resolved: the interval includes 1)"
        return claim + "."


def _inverse(estimate: Estimate) -> Estimate:
    """1 / a positive ratio, its percentile interval inverted with it. Where resamples reach 0
    (the other run passing nothing in some), the inverse has no upper bound: `high` is None."""
    value, low, high = estimate.value, estimate.low, estimate.high
    if value is None or value <= 0:
        return Estimate(None, null_reason=estimate.null_reason or "undefined")
    return Estimate(
        1 / value,
        1 / high if high is not None and high > 0 else None,
        1 / low if low is not None and low > 0 else None,
        estimate.null_reason,
    )


def _differences(best: RunRecord, other: RunRecord) -> list[str]:
    limits = []
    if best.engine != other.engine:
        limits.append(f"engines differ ({best.engine} vs {other.engine})")
    if precision_label(best) != precision_label(other):
        limits.append(f"precision differs ({precision_label(best)} vs {precision_label(other)})")
    return limits


def _scope_limits(best: RunRecord, other: RunRecord) -> list[str]:
    limits = []
    if comparison_class(best)[1] != comparison_class(other)[1]:
        limits.append(
            f"energy scopes differ ({scope_definition(best)} vs {scope_definition(other)}): "
            "not like for like"
        )
    for run in (best, other):
        band = estimate_band(run)
        if band is not None:
            limits.append(
                f"{short_label(run)}'s energy is an estimate (stated band x{band.low_factor:g} to "
                f"x{band.high_factor:g}: {band.why})"
            )
    return limits


def _band_limit(best: RunRecord, other: RunRecord, ratio: Estimate) -> str | None:
    """Whether the lead survives the estimates' stated bands: at worst the leader's energy is
    its band's top and the other's its bottom (the whole energy taken as estimated), which
    scales either ratio (passes per kJ best/other, or J per task other/best) by
    other's low factor / best's high factor. None when neither run is estimated."""
    best_band, other_band = estimate_band(best), estimate_band(other)
    if ratio.value is None or (best_band is None and other_band is None):
        return None
    worst = (
        ratio.value
        * (other_band.low_factor if other_band else 1.0)
        / (best_band.high_factor if best_band else 1.0)
    )
    if worst > 1:
        return f"the lead holds at the edge of the estimates' stated bands (still {worst:.2g}x)"
    return f"within the estimates' stated bands the lead could vanish (down to {worst:.2g}x)"


def _ordered(first: Entry, second: Entry, ids: set[str]) -> tuple[Entry, Entry, str, Estimate]:
    """(best, other, figure, ratio) of two entries on tasks `ids`, paired: passes per kJ
    where both passed something, else energy per task."""
    first_tasks = {t.task_id: task_figures(t) for t in first.all_tasks if t.task_id in ids}
    second_tasks = {t.task_id: task_figures(t) for t in second.all_tasks if t.task_id in ids}
    unions = (
        union_energy((first.run.summary or {}).get("concurrency")),
        union_energy((second.run.summary or {}).get("concurrency")),
    )
    ratios = compare_figures(first_tasks, second_tasks, unions).ratios  # second / first
    passed = [sum(f.passed for f in tasks.values()) for tasks in (first_tasks, second_tasks)]
    if passed[0] and passed[1]:
        apj = ratios["accuracy_per_joule"]
        if apj.value is None or apj.value > 1:  # unknown (energy-unknown), or second leads
            return second, first, "accuracy_per_joule", apj
        return first, second, "accuracy_per_joule", _inverse(apj)
    if passed[0] or passed[1]:  # one passed nothing: passes per kJ is infinitely better
        best, other = (first, second) if passed[0] else (second, first)
        return best, other, "accuracy_per_joule", Estimate(None, null_reason="one-passed-none")
    energy = ratios["mean_energy_j"]
    if energy.value is not None and energy.value < 1:
        return second, first, "mean_energy_j", _inverse(energy)
    return first, second, "mean_energy_j", energy


def verdict(first: Entry, second: Entry, like_for_like: bool) -> Verdict | None:
    """The better of two entries against the other on the tasks both ran (paired bootstrap);
    None when they share no task."""
    ids = {t.task_id for t in first.all_tasks} & {t.task_id for t in second.all_tasks}
    if not ids:
        return None
    best, other, figure, ratio = _ordered(first, second, ids)
    chosen = [[t for t in entry.all_tasks if t.task_id in ids] for entry in (best, other)]
    passed = (sum(t.passed for t in chosen[0]), sum(t.passed for t in chosen[1]))
    samples = (sum(t.samples for t in chosen[0]), sum(t.samples for t in chosen[1]))
    limits = []
    warning = small_n_caution(len(ids), list(zip(passed, samples, strict=True)))
    if warning:
        limits.append(warning)
    limits += _differences(best.run, other.run)
    limits += _scope_limits(best.run, other.run)
    band = _band_limit(best.run, other.run, ratio)
    if band is not None:
        limits.append(band)
    busy = False
    for entry in (best, other):
        evidence = busy_evidence(entry.run)
        if evidence:
            busy = True
            limits.append(f"{entry.label} was measured on a busy machine ({'; '.join(evidence)})")
    return Verdict(
        best, other, len(ids), figure, ratio, like_for_like, tuple(limits), passed, samples, busy
    )


@dataclass(frozen=True, slots=True)
class Headline:
    """What the report leads with: the best run of each section, the verdict within each
    section that has two runs or more, and the best runs of other sections against the first
    section's (same suite), labelled as not like for like."""

    sections: tuple[Section, ...]
    within: tuple[Verdict, ...]
    across: tuple[Verdict, ...]


def headline(sections: Sequence[Section]) -> Headline:
    within = []
    for section in sections:
        if len(section.entries) >= 2:
            found = verdict(section.entries[0], section.entries[1], like_for_like=True)
            if found is not None:
                within.append(found)
    across = []
    leading = [s for s in sections if s.entries]
    if leading:
        first = leading[0]
        for section in leading[1:]:
            if section.suite != first.suite:
                continue
            found = verdict(first.entries[0], section.entries[0], like_for_like=False)
            if found is not None:
                across.append(found)
    return Headline(tuple(sections), tuple(within), tuple(across))

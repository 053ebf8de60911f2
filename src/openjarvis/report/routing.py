"""Coverage and routing over runs of the same tasks (docs/report.md, "Coverage and routing"):
which share of tasks some run gets right, what an oracle that sends each task to the cheapest
run that gets it right would spend, and a router that is right with probability p.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from openjarvis.reference import cost_usd
from openjarvis.report.gate import shared_tasks
from openjarvis.report.runs import is_cloud, mean_if_known, short_label
from openjarvis.store import RunRecord, TaskResultRecord

__all__ = [
    "ROUTER_ACCURACIES",
    "Route",
    "Routing",
    "routing",
    "routing_json",
]

ROUTER_ACCURACIES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One run on one task: its pass rate, whether it counts as right, energy and API cost."""

    accuracy: float
    right: bool  # at least half of the task's samples passed (with one sample: it passed)
    energy_j: float | None
    cost_usd: float | None  # API dollars: 0 for a local run, None where the price is unknown


@dataclass(frozen=True, slots=True)
class Route:
    """Mean figures per task of one way of answering the shared tasks."""

    name: str
    accuracy: float
    energy_j: float | None  # None: some chosen task's energy is unknown
    cost_usd: float | None  # API dollars per task; None: some chosen task's price is unknown
    estimated: bool  # some of the energy is a cloud or CPU estimate


@dataclass(frozen=True, slots=True)
class Routing:
    tasks: int
    runs: tuple[RunRecord, ...]
    left_out: tuple[tuple[RunRecord, str], ...]
    coverage: float  # share of tasks at least one run gets right
    local_coverage: float | None  # the same over local runs; None without one
    oracle: Route  # the lowest-energy run that solves each task
    oracle_by_cost: Route  # the lowest-API-cost run that solves each task (then energy)
    best_single: Route
    cloud: Route | None  # the most accurate cloud run; None without one
    # The two-choice router (the best local choice or the cloud run) right with probability p.
    router: tuple[tuple[float, Route], ...]

    def routes(self) -> list[Route]:
        """The oracle, the best single run, and the cloud run where there is one."""
        return [
            self.oracle,
            self.oracle_by_cost,
            self.best_single,
            *([self.cloud] if self.cloud else []),
        ]


def routing_json(found: Routing) -> dict[str, object]:
    """JSON-ready figures, runs by id; unknown energy or cost stays null."""
    return {
        "tasks": found.tasks,
        "runs": [run.id for run in found.runs],
        "left_out": [{"run_id": run.id, "why": why} for run, why in found.left_out],
        "coverage": found.coverage,
        "local_coverage": found.local_coverage,
        "routes": [asdict(route) for route in found.routes()],
        "router": [{"p": p, **asdict(route)} for p, route in found.router],
    }


def _outcome(run: RunRecord, task: TaskResultRecord) -> _Outcome:
    cost = (
        cost_usd(run.model_name, task.prompt_tokens, task.completion_tokens)
        if is_cloud(run)
        else 0.0  # a local run makes no API call: its API spend is known to be nothing
    )
    return _Outcome(
        task.passed / task.samples, 2 * task.passed >= task.samples, task.energy_j, cost
    )


def _route(name: str, chosen: Sequence[_Outcome], estimated: bool) -> Route:
    return Route(
        name,
        sum(outcome.accuracy for outcome in chosen) / len(chosen),
        mean_if_known([outcome.energy_j for outcome in chosen]),
        mean_if_known([outcome.cost_usd for outcome in chosen]),
        estimated,
    )


def _energy_key(outcome: _Outcome) -> float:
    # An unknown energy is never preferred as the cheapest: it sorts last.
    return float("inf") if outcome.energy_j is None else outcome.energy_j


def _cost_key(outcome: _Outcome) -> tuple[float, float]:
    # Least API spend, then least energy; an unknown price is never the cheapest.
    cost = float("inf") if outcome.cost_usd is None else outcome.cost_usd
    return cost, _energy_key(outcome)


def _oracle_index(
    outcomes: Sequence[_Outcome],
    fallback: int,
    key: Callable[[_Outcome], object] = _energy_key,
) -> int:
    """The choice that gets the task right at the least `key` (energy unless told); `fallback`
    when none does."""
    right = [i for i, outcome in enumerate(outcomes) if outcome.right]
    if not right:
        return fallback
    return min(right, key=lambda i: (key(outcomes[i]), i))


def _most_accurate(table: Sequence[Sequence[_Outcome]]) -> int:
    """The column (run) with the highest mean accuracy; ties: the lower mean energy."""

    def key(column: int) -> tuple[float, float]:
        accuracy = sum(row[column].accuracy for row in table)
        energy = mean_if_known([row[column].energy_j for row in table])
        return (-accuracy, float("inf") if energy is None else energy)

    return min(range(len(table[0])), key=lambda column: (*key(column), column))


def routing(
    runs: Sequence[RunRecord], tasks: Mapping[str, Sequence[TaskResultRecord]]
) -> Routing | None:
    """Coverage, the oracle, the best single run, the cloud run and the router curve over the
    tasks the runs share; None when fewer than two runs share a task."""
    # A cloud run is taken first: without one there is no router to draw.
    kept, ids, left_out = shared_tasks(runs, tasks, prefer=is_cloud)
    if len(kept) < 2:
        return None
    order = sorted(ids)
    by_id = [{t.task_id: t for t in tasks[run.id or ""]} for run in kept]
    # table[task][run]
    table = [
        [_outcome(run, by_id[column][task_id]) for column, run in enumerate(kept)]
        for task_id in order
    ]
    estimated = [run.energy_method == "estimate" for run in kept]
    columns = range(len(kept))
    local = [c for c in columns if not is_cloud(kept[c])]
    clouds = [c for c in columns if is_cloud(kept[c])]

    def covered(among: Sequence[int]) -> float:
        return sum(any(row[c].right for c in among) for row in table) / len(table)

    best = _most_accurate(table)
    oracle_choice = [_oracle_index(row, best) for row in table]
    oracle = _route(
        "oracle over all runs",
        [row[c] for row, c in zip(table, oracle_choice, strict=True)],
        any(estimated[c] for c in set(oracle_choice)),
    )
    cost_choice = [_oracle_index(row, best, _cost_key) for row in table]
    oracle_by_cost = _route(
        "oracle by API cost",
        [row[c] for row, c in zip(table, cost_choice, strict=True)],
        any(estimated[c] for c in set(cost_choice)),
    )
    best_single = _route(
        f"best single run: {short_label(kept[best])}", [row[best] for row in table], estimated[best]
    )
    cloud_route = None
    router: list[tuple[float, Route]] = []
    if clouds and local:
        cloud = clouds[_most_accurate([[row[c] for c in clouds] for row in table])]
        cloud_route = _route(
            f"cloud: {short_label(kept[cloud])}", [row[cloud] for row in table], estimated[cloud]
        )
        router = _router_curve(table, local, cloud, estimated)
    return Routing(
        len(order),
        tuple(kept),
        tuple(left_out),
        covered(columns),
        covered(local) if local else None,
        oracle,
        oracle_by_cost,
        best_single,
        cloud_route,
        tuple(router),
    )


def _router_curve(
    table: Sequence[Sequence[_Outcome]], local: Sequence[int], cloud: int, estimated: list[bool]
) -> list[tuple[float, Route]]:
    """Two choices per task: the local oracle's pick (the lowest-energy local run that gets it
    right, else the most accurate local run) or the cloud run. The two-choice oracle takes the
    cheaper of them that gets it right, else the more accurate; a router right with
    probability p follows it with probability p and takes the other choice otherwise, so each
    figure is p times the oracle's plus (1 - p) times the other's, averaged over tasks."""
    best_local = local[_most_accurate([[row[c] for c in local] for row in table])]
    pairs: list[tuple[_Outcome, _Outcome]] = []  # (local choice, cloud) per task
    for row in table:
        local_pick = local[_oracle_index([row[c] for c in local], local.index(best_local))]
        pairs.append((row[local_pick], row[cloud]))
    fallback = _most_accurate([list(pair) for pair in pairs])
    chosen = [_oracle_index(pair, fallback) for pair in pairs]
    mixed = estimated[cloud] or any(estimated[c] for c in local)
    curve = []
    for p in ROUTER_ACCURACIES:
        accuracy = _expected(pairs, chosen, p, "accuracy")
        assert accuracy is not None  # accuracies are always known
        name = f"router right {p:.0%} of the time"
        energy_j = _expected(pairs, chosen, p, "energy_j")
        cost = _expected(pairs, chosen, p, "cost_usd")
        curve.append((p, Route(name, accuracy, energy_j, cost, mixed)))
    return curve


def _expected(
    pairs: Sequence[tuple[_Outcome, _Outcome]], chosen: Sequence[int], p: float, field: str
) -> float | None:
    """Mean over tasks of p x the oracle's choice's figure + (1 - p) x the other's."""
    values = []
    for pair, choice in zip(pairs, chosen, strict=True):
        right, wrong = getattr(pair[choice], field), getattr(pair[1 - choice], field)
        if right is None or wrong is None:
            return None
        values.append(p * right + (1 - p) * wrong)
    return sum(values) / len(values)

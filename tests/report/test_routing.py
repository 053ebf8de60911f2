"""Coverage, oracle routing and the router curve on four hand-made tasks, figures worked out by
hand below (docs/report.md, "Coverage and routing")."""

import pytest

from openjarvis.report.routing import routing
from openjarvis.store import RunRecord, TaskResultRecord

__all__: list[str] = []


def make_run(run_id: str, model: str, engine: str, method: str) -> RunRecord:
    return RunRecord(
        model_name=model,
        model_path=None,
        model_sha256=None,
        engine=engine,
        engine_settings={},
        suite="humaneval",
        options={},
        energy_scope="system",
        energy_method=method,
        sandbox_isolation="bubblewrap",
        tool_version="0.1.0",
        state="complete",
        id=run_id,
    )


def make_task(index: int, passed: bool, energy_j: float | None) -> TaskResultRecord:
    return TaskResultRecord(
        task_id=f"t{index}",
        samples=1,
        passed=int(passed),
        latency_s=1.0,
        ttft_s=None,
        decode_tokens_per_s=None,
        prompt_tokens=100,
        completion_tokens=50,
        energy_j=energy_j,
        net_energy_j=energy_j,
        energy_null_reason=None,
        completions=("",),
        statuses=("passed" if passed else "failed",),
    )


# Passes per task (t0..t3) and joules per task of each run:
#        t0  t1  t2  t3   J
# small  1   0   0   0    10   (local)
# large  1   1   0   0    20   (local)
# cloud  1   1   1   0   100   (a model the price table does not list: its cost is unknown)
PASSES = {"small": (1, 0, 0, 0), "large": (1, 1, 0, 0), "cloud": (1, 1, 1, 0)}
JOULES = {"small": 10.0, "large": 20.0, "cloud": 100.0}
RUNS = [
    make_run("small", "small-1b", "llamacpp", "counter"),
    make_run("large", "large-8b", "llamacpp", "counter"),
    make_run("cloud", "unpriced-model", "openai", "estimate"),
]


def tasks_of(name: str, extra: int = 0) -> list[TaskResultRecord]:
    made = [make_task(i, bool(p), JOULES[name]) for i, p in enumerate(PASSES[name])]
    return made + [make_task(4 + i, True, JOULES[name]) for i in range(extra)]


def test_coverage_oracle_and_router_worked_out_by_hand() -> None:
    # The cloud run has two more tasks than the others: only the four shared ones count.
    tasks = {"small": tasks_of("small"), "large": tasks_of("large"), "cloud": tasks_of("cloud", 2)}
    found = routing(RUNS, tasks)
    assert found is not None
    assert found.tasks == 4 and not found.left_out
    # Solved by some run: t0, t1, t2 -> 3/4; by a local run: t0, t1 -> 2/4.
    assert found.coverage == pytest.approx(0.75)
    assert found.local_coverage == pytest.approx(0.5)
    # Oracle: t0 -> small (10 J, cheapest that passes), t1 -> large (20 J), t2 -> cloud (100 J),
    # t3 (none passes) -> the most accurate run, cloud (3/4): accuracy 3/4, (10+20+100+100)/4 J.
    assert found.oracle.accuracy == pytest.approx(0.75)
    assert found.oracle.energy_j == pytest.approx(57.5)
    assert found.oracle.cost_usd is None  # two tasks went to the unpriced cloud model
    assert found.oracle.estimated
    # By API cost the locals (0 dollars) win where they solve, the unpriced cloud never does
    # unless alone: the same tasks go the same way here.
    assert found.oracle_by_cost.energy_j == pytest.approx(57.5)
    # The best single run is the cloud run: 3/4 at 100 J.
    assert found.best_single.name == "best single run: unpriced-model · cloud · openai"
    assert (found.best_single.accuracy, found.best_single.energy_j) == (0.75, 100.0)
    assert found.cloud is not None and found.cloud.energy_j == pytest.approx(100.0)
    # Router: the local choice per task is the local oracle's (t0 small 10 J pass, t1 large
    # 20 J pass, t2 and t3 none passes -> large, the more accurate local run, 20 J fail). The
    # two-choice oracle keeps local on t0, t1 and sends t2 (only cloud passes) and t3 (neither:
    # cloud, the more accurate of the two, 3/4 against 2/4) to the cloud. Right with
    # probability p:
    #   accuracy = (1 + 1 + p + 0) / 4 = (2 + p) / 4
    #   energy   = ((100 - 90p) + (100 - 80p) + (20 + 80p) + (20 + 80p)) / 4 = (240 - 10p) / 4
    assert [p for p, _ in found.router] == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    for p, route in found.router:
        assert route.accuracy == pytest.approx((2 + p) / 4)
        assert route.energy_j == pytest.approx((240 - 10 * p) / 4)
        assert route.cost_usd is None
    half = dict(found.router)[0.5]
    assert (half.accuracy, half.energy_j) == (pytest.approx(0.625), pytest.approx(58.75))


def test_local_runs_alone_have_no_router_and_a_known_api_cost_of_nothing() -> None:
    tasks = {"small": tasks_of("small"), "large": tasks_of("large")}
    found = routing(RUNS[:2], tasks)
    assert found is not None
    assert found.cloud is None and found.router == ()
    # Oracle: t0 -> small, t1 -> large, t2 and t3 -> large (2/4 against 1/4).
    assert found.oracle.accuracy == pytest.approx(0.5)
    assert found.oracle.energy_j == pytest.approx((10 + 20 + 20 + 20) / 4)
    assert found.oracle.cost_usd == 0.0  # no API call was made, which is known, not unknown
    assert found.coverage == found.local_coverage == pytest.approx(0.5)


def test_an_unknown_energy_is_unknown_in_every_route_that_takes_it() -> None:
    tasks = {"small": tasks_of("small"), "large": tasks_of("large")}
    tasks["large"][1] = make_task(1, True, None)  # t1's energy could not be read
    found = routing(RUNS[:2], tasks)
    assert found is not None
    assert found.oracle.energy_j is None and found.best_single.energy_j is None
    assert found.oracle.accuracy == pytest.approx(0.5)


def test_runs_sharing_no_task_are_not_routed() -> None:
    tasks = {"small": tasks_of("small"), "large": [make_task(9, True, 5.0)]}
    assert routing(RUNS[:2], tasks) is None


def test_the_cost_oracle_prefers_a_free_local_run_to_a_cheaper_in_joules_priced_cloud() -> None:
    """gpt-4o (priced in data/cloud_prices.csv at $2.50 in and $10.00 out per million tokens)
    solves t0..t2 at 5 J; large solves t0, t1 at 20 J. By energy every solved task goes to the
    cloud; by API cost t0 and t1 go to large (0 dollars)."""
    cloud = make_run("gpt", "gpt-4o", "openai", "estimate")
    tasks = {
        "large": tasks_of("large"),
        "gpt": [make_task(i, i < 3, 5.0) for i in range(4)],
    }
    found = routing([RUNS[1], cloud], tasks)
    assert found is not None
    per_task_usd = (100 * 2.50 + 50 * 10.00) / 1e6  # 100 prompt and 50 output tokens a task
    # By energy: t0, t1, t2 to gpt (5 J), t3 (none solves) to gpt, the more accurate.
    assert found.oracle.energy_j == pytest.approx(5.0)
    assert found.oracle.cost_usd == pytest.approx(per_task_usd)
    # By cost: t0, t1 to large (20 J, $0), t2 and t3 to gpt (5 J).
    assert found.oracle_by_cost.energy_j == pytest.approx((20 + 20 + 5 + 5) / 4)
    assert found.oracle_by_cost.cost_usd == pytest.approx(per_task_usd / 2)
    assert found.oracle_by_cost.accuracy == found.oracle.accuracy == pytest.approx(0.75)

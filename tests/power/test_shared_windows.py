"""Windows that run at once on a batching engine share each refresh interval by the work each
did in it: their energies add up to the union's, idle counted once, and twice the tokens in the
same steps is twice the energy."""

import random

import pytest

from openjarvis.power.edges import Knot, Piece, Span, attribute, mean_batch
from openjarvis.power.meter import Meter
from openjarvis.runtime.ledger import StepLedger
from openjarvis.runtime.types import WorkPiece
from tests.fakes.clock import FakeClock
from tests.fakes.nvml import FakeGpu, SteppingCounter, install_fake_nvml
from tests.power.test_meter import spend

UUID = "GPU-aaaa1111-0000-0000-0000-000000000000"
IDLE_W, TOKEN_W, STEP_S = 120.0, 40.0, 0.02
CHUNK = 12  # prompt tokens a step takes of one prompt


class Engine:
    """Steps of a batching engine, back to back; the board draws TOKEN_W per token in a step."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float, int]] = []  # start, end, tokens

    def power_w(self, time_s: float) -> float:
        for start_s, end_s, tokens in reversed(self.steps):
            if start_s <= time_s < end_s:
                return IDLE_W + TOKEN_W * tokens
            if end_s <= time_s:
                break
        return IDLE_W


def meter_on(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, engine: Engine) -> tuple:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID)])
    counter = SteppingCounter(clock, fake.gpus[0], engine.power_w, phase_s=0.037)
    meter = Meter.discover(
        "accelerator", "/nonexistent", estimate_cpu=False, clock=clock, sleep=clock.sleep
    )
    spend(meter, clock, 0.5)
    meter.measure_idle(2.0)
    return meter, counter


def run_batch(
    meter: Meter,
    clock: FakeClock,
    engine: Engine,
    schedule: list[tuple[int, int, int]],
    prompts: list[int] | None = None,
) -> list:
    """Windows open and close at step boundaries (first step, last step + 1, tokens per step);
    the engine runs one step at a time over the windows active in it and files each step in
    its ledger as it lands, as a batching engine does. With `prompts`, a window's first steps
    take that many tokens (its prompt), at most CHUNK a step, and its first token comes at the
    end of the last of them."""
    ledger = StepLedger(clock)
    meter.follow(ledger)
    contexts = [meter.window(f"request-{i}") for i in range(len(schedule))]
    handles: list = [None] * len(schedule)
    works: list[list[WorkPiece]] = [[] for _ in schedule]
    unread = list(prompts) if prompts is not None else [0] * len(schedule)  # prompt tokens left
    ledger.busy()
    for step in range(max(end for _, end, _ in schedule) + 1):
        for i, (first, last, _) in enumerate(schedule):
            if step == last:
                contexts[i].__exit__(None, None, None)
            if step == first:
                handles[i] = contexts[i].__enter__()
                ledger.attach(handles[i].key, works[i])
        active = [i for i, (first, last, _) in enumerate(schedule) if first <= step < last]
        if not active:
            continue
        taken = {i: min(unread[i], CHUNK) or schedule[i][2] for i in active}
        tokens = sum(taken.values())
        start_s = clock.now_s
        engine.steps.append((start_s, start_s + STEP_S, tokens))
        spend(meter, clock, STEP_S)
        pieces: dict[int, WorkPiece] = {}  # rows that took as many tokens share one piece
        for i in active:
            piece = pieces.get(taken[i])
            if piece is None:
                piece = pieces[taken[i]] = WorkPiece(
                    start_s, clock.now_s, taken[i] / tokens, len(active)
                )
            works[i].append(piece)
            if unread[i]:
                unread[i] -= taken[i]
                if not unread[i]:
                    handles[i].mark_first_token(clock.now_s)
        ledger.landed(start_s, clock.now_s, 1.0)  # every row followed
    ledger.idle()
    for handle, work in zip(handles, works, strict=True):
        handle.work = work  # for the checks below
    return handles


def test_overlapping_windows_with_work_add_up_to_the_union_and_idle_counts_once(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    engine = Engine()
    meter, counter = meter_on(monkeypatch, clock, engine)
    run_start_s = clock.now_s
    # Four requests arriving 0.1 s apart, each 30 steps; the first decodes two tokens a step.
    handles = run_batch(meter, clock, engine, [(0, 30, 2), (5, 35, 1), (10, 40, 1), (15, 45, 1)])
    spend(meter, clock, 0.5)  # the wind-down after the last step: the last window's tail
    meter.settle()
    run_end_s = clock.now_s
    results = [handle.wait_settled() for handle in handles]

    assert all(result.shared for result in results)
    total = meter.total()  # the union of the windows and the last one's tail
    assert total.net_energy_j is not None
    net_j = sum(r.net_energy_j for r in results)
    assert net_j == pytest.approx(total.net_energy_j, rel=0.01)
    # and the counter's energy above idle over the run
    bracket_j = counter.true_energy_j(run_start_s, run_end_s) - IDLE_W * (run_end_s - run_start_s)
    assert net_j == pytest.approx(bracket_j, rel=0.01)
    # Gross adds idle over the union's time once, however many windows overlap in it.
    union_s = handles[-1].end_s - handles[0].start_s
    assert total.windows_s == pytest.approx(union_s)
    gross_j = sum(r.energy_j for r in results)
    assert gross_j - net_j == pytest.approx(IDLE_W * union_s, rel=0.01)
    assert gross_j == pytest.approx(total.windows_energy_j, rel=0.01)
    # Each request's share follows its tokens: the above-idle energy of its steps' tokens
    # (whole intervals are split, so a request's figure is close, the sum exact).
    for handle, result in zip(handles, results, strict=True):
        own_j = sum(p.share * (p.end_s - p.start_s) for p in handle.work)
        ideal_j = sum(
            p.share * (p.end_s - p.start_s) * (TOKEN_W * tokens + IDLE_W)
            for p, (_, _, tokens) in zip(
                handle.work,
                [s for s in engine.steps if s[0] >= handle.start_s and s[1] <= handle.end_s],
                strict=True,
            )
        )
        assert own_j > 0
        assert result.energy_j == pytest.approx(ideal_j, rel=0.06)
    # The first request ran at batch 1 for 5 steps, 2 for 5, 3 for 5, then 4 for 15.
    assert results[0].mean_batch == pytest.approx((5 * 1 + 5 * 2 + 5 * 3 + 15 * 4) / 30)


def test_twice_the_tokens_in_the_same_steps_is_twice_the_energy(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    engine = Engine()
    meter, _ = meter_on(monkeypatch, clock, engine)
    double, single = run_batch(meter, clock, engine, [(0, 20, 2), (0, 20, 1)])
    spend(meter, clock, 0.5)
    meter.settle()
    double_result, single_result = double.wait_settled(), single.wait_settled()
    assert double_result.net_energy_j == pytest.approx(2 * single_result.net_energy_j, rel=1e-9)
    assert double_result.energy_j == pytest.approx(2 * single_result.energy_j, rel=1e-9)
    assert (double_result.mean_batch, single_result.mean_batch) == (2.0, 2.0)


def test_one_interval_split_by_claims_with_idle_once_and_a_window_without_work_at_the_mean():
    knots = [Knot(0.0, 0.0), Knot(0.1, 30.0)]  # 300 W; idle 100 W: 20 J above idle
    steps = (Piece(0.0, 0.1, 0.75, 2),)
    halves = (Piece(0.0, 0.1, 0.25, 2),)
    big, small, silent = attribute(
        knots,
        [Span(0.0, 0.1, work=steps), Span(0.0, 0.1, work=halves), Span(0.05, 0.1)],
        idle_power_w=100.0,
    )
    # Claims: 0.075 and 0.025 s; the window without work claims 0.05 s at the mean rate of
    # 0.5 per second of window: 0.025 s. The whole 30 J is split, idle once.
    assert (big.energy_j, small.energy_j, silent.energy_j) == pytest.approx((18.0, 6.0, 6.0))
    assert (big.net_j, small.net_j, silent.net_j) == pytest.approx((12.0, 4.0, 4.0))
    assert big.shared and small.shared and silent.shared
    # A window with work that waited in this interval (no steps in it) gets nothing here.
    waiting = Span(0.0, 0.1, work=(Piece(0.2, 0.3, 1.0, 1),))
    _, queued = attribute(knots, [Span(0.0, 0.1, work=steps), waiting], idle_power_w=100.0)
    assert queued.energy_j == 0.0


def test_intervals_without_work_keep_the_rules_of_windows_without_work():
    knots = [Knot(0.0, 0.0), Knot(0.1, 30.0)]
    with_work = attribute(knots, [Span(0.0, 0.05, work=(Piece(0.5, 0.6, 1.0, 1),))], 100.0)
    without = attribute(knots, [Span(0.0, 0.05)], 100.0)
    assert with_work == without
    assert not with_work[0].shared


def test_mean_batch_is_weighted_by_step_time():
    pieces = [Piece(0.0, 0.1, 0.5, 2), Piece(0.1, 0.4, 0.25, 4)]
    assert mean_batch(pieces) == pytest.approx((2 * 0.1 + 4 * 0.3) / 0.4)
    assert mean_batch([]) is None


@pytest.mark.parametrize("seed", range(4))
def test_attribution_by_the_ledger_equals_splitting_each_window_on_random_batches(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, seed: int
) -> None:
    """Random arrivals, lengths, tokens per step and prompts: each window's energy, energy
    above idle, prefill part and mean batch, from intervals split once for all their windows by the
    ledger's sums as the steps land, equal `attribute` given every window's steps whole (as
    the meter did when requests brought their steps after they ended)."""
    rng = random.Random(seed)
    engine = Engine()
    meter, _ = meter_on(monkeypatch, clock, engine)
    schedule = []
    for _ in range(12):  # even seeds: a token a step each, as decoding (steps shared whole)
        first = rng.randrange(0, 60)
        schedule.append((first, first + rng.randrange(1, 40), rng.choice((1, 1 + seed % 2))))
    prompts = [rng.randrange(1, 30) for _ in schedule]
    handles = run_batch(meter, clock, engine, schedule, prompts)
    spend(meter, clock, 0.5)
    meter.settle()
    results = [handle.wait_settled() for handle in handles]
    (track,) = meter._tracks
    idle_w = meter.idle.power_w[track.source.name]
    assert sum(h.accounts[0].by_ledger.energy_j > 0 for h in handles) >= len(handles) // 2
    for index, (handle, result) in enumerate(zip(handles, results, strict=True)):
        knots, fault = track.knots_around(handle.start_s, handle.end_s)
        assert fault is None
        low_s, high_s = knots[0].time_s, knots[-1].time_s
        near = [i for i, h in enumerate(handles) if h.start_s < high_s and h.end_s > low_s]
        spans = [
            Span(h.start_s, h.end_s, h.split_s, tuple(h.work), reported=True)
            for h in (handles[i] for i in near)
        ]
        share = attribute(knots, spans, idle_w, track.refresh.uncertainty_s)[near.index(index)]
        assert result.energy_j - result.tail_energy_j == pytest.approx(share.energy_j, rel=1e-9)
        assert result.net_energy_j - result.tail_energy_j == pytest.approx(share.net_j, rel=1e-9)
        if handle.split_s is None:  # it ended inside its prompt: no first token
            assert result.prefill_energy_j is None
        else:
            assert result.prefill_energy_j == pytest.approx(share.before_split_j, rel=1e-9)
        assert result.shared == (len(near) > 1 and result.overlapped)
        assert result.mean_batch == pytest.approx(mean_batch(handle.work), rel=1e-9)


def test_a_request_is_published_a_refresh_after_its_end_while_its_neighbour_runs_on(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    engine = Engine()
    meter, _ = meter_on(monkeypatch, clock, engine)
    ledger = StepLedger(clock)
    meter.follow(ledger)
    short_work: list[WorkPiece] = []
    long_work: list[WorkPiece] = []
    long_context = meter.window("long")
    long = long_context.__enter__()
    ledger.attach(long.key, long_work)
    ledger.busy()
    with meter.window("short") as short:
        ledger.attach(short.key, short_work)
        for _ in range(15):  # 0.3 s of steps shared by both
            start_s = clock.now_s
            engine.steps.append((start_s, start_s + STEP_S, 2))
            spend(meter, clock, STEP_S)
            for work in (short_work, long_work):
                work.append(WorkPiece(start_s, clock.now_s, 0.5, 2))
            ledger.landed(start_s, clock.now_s, 1.0)  # every row followed
    assert short.end_s is not None
    published_s = None
    for _ in range(100):  # 2 s more of the long request alone
        start_s = clock.now_s
        engine.steps.append((start_s, start_s + STEP_S, 1))
        spend(meter, clock, STEP_S)
        long_work.append(WorkPiece(start_s, clock.now_s, 1.0, 1))
        ledger.landed(start_s, clock.now_s, 1.0)  # every row followed
        if published_s is None and short.energy is not None:
            published_s = clock.now_s
    long_context.__exit__(None, None, None)
    # About one refresh (100 ms) and a step after its end, the long one still running.
    assert published_s is not None
    assert published_s - short.end_s <= 0.1 + 2 * STEP_S
    assert short.energy.shared and short.energy.mean_batch == pytest.approx(2.0)
    # Its neighbour owned the time after its end: settled as it was published, tail 0 J.
    assert short.settled() is short.energy and short.energy.tail_energy_j == 0
    # Both had half of every shared step: the short one's energy is half of those steps'.
    assert short.result.net_energy_j == pytest.approx(0.5 * TOKEN_W * 2 * 0.3, rel=0.05)


def test_windows_that_overlap_without_steps_count_idle_once(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """Requests to a server whose steps nobody reports (a local server, a cloud API) split
    each interval by time: their gross energies add up to the union's, idle counted once."""
    engine = Engine()
    meter, _ = meter_on(monkeypatch, clock, engine)
    first, second = meter.window("a"), meter.window("b")
    a = first.__enter__()
    engine.steps.append((clock.now_s, clock.now_s + 1.5, 1))
    spend(meter, clock, 0.5)
    b = second.__enter__()
    spend(meter, clock, 0.5)
    first.__exit__(None, None, None)
    spend(meter, clock, 0.5)
    second.__exit__(None, None, None)
    spend(meter, clock, 0.5)
    meter.settle()
    results = [a.wait_settled(), b.wait_settled()]
    total = meter.total()
    assert sum(r.energy_j for r in results) == pytest.approx(total.windows_energy_j, rel=0.01)
    assert sum(r.net_energy_j for r in results) == pytest.approx(total.net_energy_j, rel=0.01)
    # Idle over the 1.5 s the two covered, not over their 2 s together.
    idle_j = sum(r.energy_j - r.net_energy_j for r in results)
    assert idle_j == pytest.approx(IDLE_W * 1.5, rel=0.02)


def test_the_first_token_marked_after_the_window_splits_its_energy(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """A caller learns the first token's time with the completion, after most of the window's
    intervals were split (the meter splits them while it runs): the prefill part still comes
    from them, since it is taken when the window is published."""
    engine = Engine()
    meter, _ = meter_on(monkeypatch, clock, engine)
    with meter.window("task") as window:
        engine.steps.append((clock.now_s, clock.now_s + 1.0, 1))
        spend(meter, clock, 1.0)
        assert window.accounts[0].intervals  # split already, without a first token
    window.mark_first_token(window.start_s + 0.4)
    result = window.result
    assert result.prefill_energy_j == pytest.approx(0.4 * result.energy_j, rel=0.05)
    assert result.decode_energy_j == pytest.approx(0.6 * result.energy_j, rel=0.05)

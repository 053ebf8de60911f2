"""Many sequences at once through the torch engine on the CPU: each gets the greedy tokens it
gets alone (mixed prompt lengths, joining mid-decode, chunked prefill, TP=1 and TP=2 on gloo),
a consumer that leaves frees its blocks, and each step's work shares add up to one."""

import itertools
import threading
from collections import defaultdict
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")

from openjarvis.runtime.torch.config import TorchSettings
from openjarvis.runtime.torch.core import EngineCore
from openjarvis.runtime.torch.engine import TorchEngine
from openjarvis.runtime.torch.paged import BLOCK_SIZE
from openjarvis.runtime.torch.scheduler import Step
from openjarvis.runtime.torch.step_inputs import batch_buckets

PROMPTS = [
    [5, 17, 42, 99, 3, 10, 7, 64],
    [1, 2],
    [200, 100, 50, 25, 12, 6, 3, 1, 0, 9, 8, 7, 6, 5, 4, 3, 2, 1, 30, 31, 32],
    [77],
]
TOKENS = 12


def _engine(tp: int = 1, prefill_tokens: int = 2048) -> TorchEngine:
    settings = TorchSettings(
        device="cpu", tp=tp, max_seq_len=64, seed=11, concurrency=8, prefill_tokens=prefill_tokens
    )
    return TorchEngine("tiny-tp", settings)


def _core(engine: TorchEngine) -> EngineCore:
    """The engine's core, in this process (the default on the CPU)."""
    assert isinstance(engine._core, EngineCore)
    return engine._core


def _alone(engine: TorchEngine, prompt: list[int], count: int = TOKENS) -> list[int]:
    return [token for token, _ in engine.generate_tokens(prompt, count)]


def _together(engine: TorchEngine, prompts: list[list[int]]) -> list[list[int]]:
    """All prompts submitted at once, each read on its own thread."""
    return _read_all([engine.generate_tokens(prompt, TOKENS) for prompt in prompts])


def _read_all(streams: list[Iterator[tuple[int, float]]]) -> list[list[int]]:
    """Each stream's tokens, each read on its own thread."""
    results: list[list[int]] = [[] for _ in streams]

    def read(i: int) -> None:
        results[i] = [token for token, _ in streams[i]]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(streams))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.fixture(scope="module")
def engine() -> Iterator[TorchEngine]:
    engine = _engine()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def expected(engine: TorchEngine) -> list[list[int]]:
    return [_alone(engine, prompt) for prompt in PROMPTS]


def test_a_batch_of_mixed_lengths_gives_each_sequence_its_tokens_alone(
    engine: TorchEngine, expected: list[list[int]]
) -> None:
    assert _together(engine, PROMPTS) == expected
    assert all(len(set(tokens)) > 1 for tokens in expected), "random weights repeat (weak)"


def test_tensor_parallel_batches_give_the_same_tokens(expected: list[list[int]]) -> None:
    engine = _engine(tp=2)
    try:
        assert _together(engine, PROMPTS) == expected
    finally:
        engine.close()


def test_chunked_prefill_gives_the_same_tokens(expected: list[list[int]]) -> None:
    engine = _engine(prefill_tokens=5)  # the longest prompt takes five prefill steps
    try:
        assert _together(engine, PROMPTS) == expected
    finally:
        engine.close()


def test_a_sequence_joins_a_running_decode(engine: TorchEngine, expected: list[list[int]]) -> None:
    first = engine.generate_tokens(PROMPTS[0], TOKENS)
    head = [next(first)[0] for _ in range(4)]  # the first sequence is decoding now
    second = _alone(engine, PROMPTS[2])  # admitted while the first is mid-decode
    rest = [token for token, _ in first]
    assert head + rest == expected[0]
    assert second == expected[2]


def test_a_consumer_that_leaves_frees_its_blocks(
    engine: TorchEngine, expected: list[list[int]]
) -> None:
    pool = _core(engine).scheduler.pool
    free_before = pool.free
    leaving = engine.generate_tokens(PROMPTS[0], 40)
    next(leaving)
    assert pool.free < free_before  # its blocks are taken while it runs
    leaving.close()
    assert _alone(engine, PROMPTS[1]) == expected[1]  # the next step drops the leaver
    assert pool.free == free_before
    assert not _core(engine).scheduler.running


def test_work_shares_of_each_step_add_up_to_one(engine: TorchEngine) -> None:
    """Prefill shares follow the prompt tokens of the step; decode steps share evenly."""
    sequences = []
    for prompt in PROMPTS:
        sequences.append(engine._submit(prompt, TOKENS, frozenset(), 0.0, None))
    for sequence in sequences:
        for _ in engine._deliveries(sequence):
            pass
    steps: dict[tuple[float, float], list[float]] = defaultdict(list)
    batches: dict[tuple[float, float], set[int]] = defaultdict(set)
    for sequence in sequences:
        for piece in sequence.work:
            steps[piece.start_s, piece.end_s].append(piece.share)
            batches[piece.start_s, piece.end_s].add(piece.batch)
    assert steps, "no work recorded"
    for key, shares in steps.items():
        assert sum(shares) == pytest.approx(1.0), key
        assert batches[key] == {len(shares)}
    assert max(len(shares) for shares in steps.values()) > 1, "nothing ran together"


def test_sequences_that_end_mid_decode_leave_the_others_their_tokens(
    engine: TorchEngine, expected: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode steps are continued before the step before them lands, so a sequence that ends
    rides one more step as a stale row: the others' tokens must not change, each ender must
    stop where it stops alone, and the steps must not overlap in time."""
    scheduler = _core(engine).scheduler
    continued: list[int] = []
    original = scheduler.continued

    def counting(step: Step) -> tuple[Step, list[int]] | None:
        continued.append(len(step.rows))
        return original(step)

    monkeypatch.setattr(scheduler, "continued", counting)
    stop = expected[1][4]  # an end token for the second prompt: it ends where it first meets it
    limits = [3, TOKENS, 7, TOKENS]
    results = _read_all(
        [
            engine.generate_tokens(prompt, limit, frozenset({stop}) if i == 1 else frozenset())
            for i, (prompt, limit) in enumerate(zip(PROMPTS, limits, strict=True))
        ]
    )
    assert results[0] == expected[0][:3]
    assert results[1] == expected[1][: expected[1].index(stop) + 1]
    assert results[2] == expected[2][:7]
    assert results[3] == expected[3]
    assert len(continued) > 5, "decode steps were not continued"
    assert not scheduler.running and scheduler.pool.free == scheduler.pool.blocks - 1


def test_steps_do_not_overlap_in_time(engine: TorchEngine) -> None:
    """Continued steps are launched early, but each step's time starts where the one before
    it landed, so the pieces that energy is split by tile the time."""
    sequences = [engine._submit(p, TOKENS, frozenset(), 0.0, None) for p in PROMPTS]
    for sequence in sequences:
        for _ in engine._deliveries(sequence):
            pass
    steps = sorted({(p.start_s, p.end_s) for s in sequences for p in s.work})
    assert len(steps) >= TOKENS
    for (start_s, end_s), (next_start_s, _) in itertools.pairwise(steps):
        assert start_s < end_s <= next_start_s


def test_sampling_is_per_sequence_and_seeded(engine: TorchEngine) -> None:
    def draw(seed: int) -> list[int]:
        return [
            t for t, _ in engine.generate_tokens(PROMPTS[0], TOKENS, temperature=0.9, seed=seed)
        ]

    streams = [engine.generate_tokens(PROMPTS[0], TOKENS, temperature=0.9, seed=s) for s in (1, 2)]
    together = [[t for t, _ in stream] for stream in streams]
    assert together == [draw(1), draw(2)]
    assert together[0] != together[1]


def test_the_cpu_cache_takes_at_most_a_share_of_the_memory_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sized for concurrency full-length sequences unless the machine's free memory says less
    (a laptop would otherwise be asked for gigabytes); with no room at all, one clear line."""
    from types import SimpleNamespace

    from openjarvis.errors import UserError
    from openjarvis.runtime.torch import runner
    from openjarvis.runtime.torch.model import config_for

    config = config_for("tiny-tp")
    block_bytes = 2 * config.n_layers * BLOCK_SIZE * config.n_kv_heads * config.head_dim * 4

    def available(blocks: int) -> None:
        memory = SimpleNamespace(available=int(blocks * block_bytes / runner._KV_MEMORY_SHARE) + 1)
        monkeypatch.setattr(runner.psutil, "virtual_memory", lambda: memory)

    available(10)
    engine = _engine()
    try:
        assert _core(engine).runner.blocks == 10  # 8 sequences of 64 tokens would want 33
        assert _alone(engine, PROMPTS[0], 4) == _alone(engine, PROMPTS[0], 4)
    finally:
        engine.close()
    available(1)
    with pytest.raises(UserError, match="no main memory left for the KV cache"):
        _engine()


def test_steps_are_counted_by_kind_as_they_land(engine: TorchEngine) -> None:
    before = engine.step_counts()
    _together(engine, PROMPTS[:2])
    after = engine.step_counts()
    counts = after.since(before)
    decoded = counts.steps["decode"] + counts.steps["mixed"]
    # The first prompt's first token comes from a prefill step; the second's too (the same step
    # or the next). On the CPU prompts prefill apart by default; with prompt rows on, the second
    # could instead join the first's decode step (one more decode row, in a step counted as
    # mixed). The other 11 tokens of each come from decode steps of one row or two.
    prefill_rows = counts.rows["prefill"]
    assert 1 <= counts.steps["prefill"] <= prefill_rows <= 2
    assert counts.steps["mixed"] == 2 - prefill_rows
    assert TOKENS - 1 <= decoded <= 2 * (TOKENS - 1) + 1
    assert counts.rows["decode"] + counts.rows["mixed"] == 2 * (TOKENS - 1) + 2 - prefill_rows
    assert counts.seconds["decode"] > 0


def test_the_switch_interval_is_short_while_a_gpu_engine_runs_and_restored_after() -> None:
    import sys

    from openjarvis.runtime.torch.loop import SWITCH_INTERVAL_S, _SwitchInterval

    before = sys.getswitchinterval()
    shared = _SwitchInterval()  # what two GPU engines' step loops in one process share
    shared.shorten()
    shared.shorten()
    try:
        assert sys.getswitchinterval() == pytest.approx(min(before, SWITCH_INTERVAL_S))
        shared.restore()  # the first engine closes: the second still runs
        assert sys.getswitchinterval() == pytest.approx(min(before, SWITCH_INTERVAL_S))
    finally:
        shared.restore()
    assert sys.getswitchinterval() == pytest.approx(before)
    # A CPU engine leaves the interval alone.
    engine = _engine()
    try:
        assert sys.getswitchinterval() == pytest.approx(before)
    finally:
        engine.close()


def test_decode_graphs_come_every_8_rows_up_to_the_concurrency_then_in_powers_of_two() -> None:
    assert batch_buckets(320, 64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 128, 256, 320)
    assert batch_buckets(288, 32) == (1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 288)
    assert batch_buckets(280, 24) == (1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 280)
    assert batch_buckets(12, 12) == (1, 2, 4, 8, 12)  # no prompt rows
    assert batch_buckets(1, 1) == (1,)
    # A step of running sequences alone pads fewer than 8 rows; one that prompts joined, fewer
    # rows than it has.
    buckets = batch_buckets(320, 64)
    for rows in range(1, 321):
        bucket = next(size for size in buckets if size >= rows)
        assert bucket - rows < (8 if rows <= 64 else rows)

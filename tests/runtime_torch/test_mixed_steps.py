"""A prompt that arrives while other sequences decode joins their decode steps, its tokens as
rows of one query each, in pieces of the step's prompt-row budget: the scheduler's rows, the
continued steps that take the rest of a prompt, the shares of the work, and (through the engine
on the CPU) the same greedy tokens with no prefill step of its own."""

import pytest

pytest.importorskip("torch")

from openjarvis.runtime.torch.config import TorchSettings
from openjarvis.runtime.torch.engine import TorchEngine
from openjarvis.runtime.torch.paged import BlockPool
from openjarvis.runtime.torch.scheduler import PENDING, Scheduler, Sequence, Step
from tests.runtime_torch.test_prefix_cache import _has_cuda

RUNNING = [5, 17, 42, 99, 3, 10, 7, 64]  # a prompt that decodes while others join it


def _rows(step: Step) -> list[tuple[int, list[int], int, bool]]:
    """(sequence's first prompt token, tokens, start, sample) for each row."""
    return [(row.sequence.prompt[0], row.tokens, row.start, row.sample) for row in step.rows]


def _decoding(prompt_rows: int) -> tuple[Scheduler, Sequence]:
    """A scheduler with one sequence decoding (its prompt prefilled in a step of its own:
    nothing decoded beside it)."""
    scheduler = Scheduler(BlockPool(16, 16, reuse=False), 4, 2048, 64, prompt_rows=prompt_rows)
    first = Sequence([1, 2, 3], 8, frozenset())
    scheduler.add(first)
    prefill = scheduler.next_step()
    assert prefill is not None and prefill.kind == "prefill"
    scheduler.finish_step(prefill, [7], 0.0, 1.0)
    return scheduler, first


def test_a_new_prompt_joins_the_decode_step_in_pieces_of_the_row_budget() -> None:
    scheduler, first = _decoding(prompt_rows=4)
    second = Sequence([10, 11, 12, 13, 14, 15], 8, frozenset())
    scheduler.add(second)
    step = scheduler.next_step()
    assert step is not None and step.kind == "decode"
    # The decode row, then four of the six prompt tokens (none ends the prompt yet).
    assert _rows(step) == [
        (1, [7], 3, True),
        (10, [10], 0, False),
        (10, [11], 1, False),
        (10, [12], 2, False),
        (10, [13], 3, False),
    ]
    # The step after it, decided before it lands: the decode row one on, then the prompt's
    # last two tokens, the last first (it picks the first token: rows that sample lead, the
    # runner computing logits for a step's first `concurrency` rows only).
    continued = scheduler.continued(step)
    assert continued is not None
    after, kept = continued
    assert kept == [0]
    assert _rows(after) == [
        (1, [PENDING], 4, True),
        (10, [15], 5, True),
        (10, [14], 4, False),
    ]
    pieces = scheduler.finish_step(step, [8, 0, 0, 0, 0], 1.0, 2.0)
    shares = {sequences[0].prompt[0]: (piece.share, piece.batch) for piece, sequences in pieces}
    assert shares == {1: (pytest.approx(1 / 5), 2), 10: (pytest.approx(4 / 5), 2)}
    assert second.cached == 4 and second.prefilling
    scheduler.finish_step(after, [9, 20, None], 2.0, 3.0)
    assert not second.prefilling and second.output == [20] and first.output == [7, 8, 9]
    # Both decode now, in one step, the new sequence's sampled row from its prompt's end.
    following = scheduler.continued(after)
    assert following is not None
    assert _rows(following[0]) == [(1, [PENDING], 5, True), (10, [PENDING], 6, True)]
    assert following[1] == [0, 1]


def test_a_scoring_prompt_still_prefills_alone_and_ends_the_chain() -> None:
    scheduler, _ = _decoding(prompt_rows=4)
    decode = scheduler.next_step()
    assert decode is not None and decode.kind == "decode"
    scoring = Sequence([30, 31, 32], 1, frozenset(), all_logits=True)
    scheduler.add(scoring)
    assert scheduler.continued(decode) is None  # admitted; it wants all its logits
    scheduler.finish_step(decode, [8], 1.0, 2.0)
    step = scheduler.next_step()
    assert (
        step is not None and step.kind == "prefill" and _rows(step) == [(30, [30, 31, 32], 0, True)]
    )


def test_without_prompt_rows_a_new_prompt_waits_for_a_prefill_step() -> None:
    scheduler, _ = _decoding(prompt_rows=0)
    decode = scheduler.next_step()
    assert decode is not None
    scheduler.add(Sequence([10, 11], 8, frozenset()))
    assert scheduler.continued(decode) is None  # it could start: the chain makes way
    scheduler.finish_step(decode, [8], 1.0, 2.0)
    step = scheduler.next_step()
    assert step is not None and step.kind == "prefill"


def _engine(prompt_rows: int, device: str) -> TorchEngine:
    settings = TorchSettings(
        device=device,
        max_seq_len=64,
        seed=11,
        concurrency=4,
        decode_prompt_rows=prompt_rows,
        compile=False,  # the GPU run checks the rows (through the decode graphs), not compiling
        engine_process=False,  # the test reads the sequence's work in this process
    )
    return TorchEngine("tiny-tp", settings)


def joined_while_decoding(
    engine: TorchEngine, running: list[int], prompts: list[list[int]], tokens: int
) -> list[list[int]]:
    """Start `running`; once it decodes, submit every prompt at once for `tokens` tokens each.
    Every sequence's greedy tokens, the running one's first (4 * `tokens` of them)."""
    first = engine.generate_tokens(running, 4 * tokens)
    head = [next(first)[0] for _ in range(2)]
    joined = [engine._submit(p, tokens, frozenset(), 0.0, None) for p in prompts]
    replies = [[t for batch in engine._deliveries(s) for t, _ in batch] for s in joined]
    return [head + [t for t, _ in first], *replies]


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _has_cuda(), reason="no CUDA GPU"))],
)
def test_through_the_engine_a_prompt_joins_running_decodes_with_the_tokens_it_gets_alone(
    device: str,
) -> None:
    """A 21-token prompt with a row budget of 8 joins a running decode in three steps; its
    greedy tokens and the running sequence's are those of the engine without prompt rows
    (on a GPU in bf16 too, where the prompt's keys come from the decode kernel's rows instead
    of a prefill graph)."""
    running, joining = RUNNING, list(range(40, 61))
    alone = _engine(prompt_rows=0, device=device)
    try:
        expected = [
            [t for t, _ in alone.generate_tokens(running, 40)],
            [t for t, _ in alone.generate_tokens(joining, 12)],
        ]
    finally:
        alone.close()
    engine = _engine(prompt_rows=8, device=device)
    try:
        first = engine.generate_tokens(running, 40)
        head = [next(first)[0] for _ in range(2)]  # decoding now, 38 tokens to go
        before = engine.step_counts()
        second = engine._submit(joining, 12, frozenset(), 0.0, None)
        tokens = [t for batch in engine._deliveries(second) for t, _ in batch]
        rest = [t for t, _ in first]
        counts = engine.step_counts().since(before)
    finally:
        engine.close()
    assert [head + rest, tokens] == expected
    assert counts.steps["prefill"] == 0
    assert counts.steps["mixed"] == 3  # its 21 prompt tokens in rows of 8, 8 and 5
    # Its prompt went in steps of eight rows, beside the running sequence's one.
    prompt_pieces = [p for p in second.work if p.batch == 2][:3]
    assert [round(p.share * 9) for p in prompt_pieces[:2]] == [8, 8]


def test_prompts_ending_in_a_step_wider_than_the_concurrency_get_their_own_first_tokens() -> None:
    """Three 3-token prompts join one decode step of a 4-sequence engine at once: 10 rows, of
    which the runner computes logits for the first 4 only. The rows that end the prompts come
    right after the decode row, and each prompt gets the tokens it gets alone."""
    prompts = [[40, 41, 42], [50, 51, 52], [60, 61, 62]]
    results, counts = [], []
    for prompt_rows in (0, 16):
        engine = _engine(prompt_rows=prompt_rows, device="cpu")
        try:
            results.append(joined_while_decoding(engine, RUNNING, prompts, 6))
            counts.append(engine.step_counts())
        finally:
            engine.close()
    assert results[1] == results[0]
    assert counts[0].steps["mixed"] == 0 and counts[1].steps["mixed"] >= 1


def test_prompts_join_decode_steps_by_default_on_the_gpu_only() -> None:
    """On the CPU a prompt's one-query rows each gather their sequence's whole table (no decode
    kernel there), so prompts prefill in steps of their own unless asked otherwise."""
    assert TorchSettings(device="cpu").resolved().decode_prompt_rows == 0
    assert TorchSettings(device="cuda").resolved().decode_prompt_rows == 2048
    gpu = TorchSettings(device="cuda", prefill_tokens=512).resolved()
    assert gpu.decode_prompt_rows == 512  # the same prompt tokens a step as a prefill step
    assert TorchSettings(device="cpu", decode_prompt_rows=8).resolved().decode_prompt_rows == 8


def _compiled_engine(compiled: bool, device: str) -> TorchEngine:
    settings = TorchSettings(
        device=device,
        dtype="float32",  # argmax ties broken alike: the paths differ by rounding alone
        max_seq_len=64,
        seed=5,
        concurrency=4,
        decode_prompt_rows=16,
        compile=compiled,
        cuda_graphs=compiled,
        prefill_graphs=compiled,
        engine_process=False,
    )
    # tiny-tp: untied, so greedy tokens vary (the tied tiny presets repeat the last token).
    return TorchEngine("tiny-tp", settings)


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _has_cuda(), reason="no CUDA GPU"))],
)
def test_the_compiled_step_with_its_head_apart_picks_the_eager_tokens(device: str) -> None:
    """The decode step as the engine runs it by default on a GPU (its body compiled, the head
    on the first `concurrency` rows outside it, replayed from CUDA graphs there) against the
    eager model: a running sequence, then three prompts joining it at once in a step wider
    than the concurrency."""
    prompts = [[40, 41, 42, 43], [50, 51], [60, 61, 62]]
    results = []
    for compiled in (False, True):
        engine = _compiled_engine(compiled, device)
        try:
            results.append(joined_while_decoding(engine, RUNNING, prompts, 8))
        finally:
            engine.close()
    eager, compiled_tokens = results
    assert compiled_tokens == eager
    assert all(len(tokens) == 8 for tokens in eager[1:])

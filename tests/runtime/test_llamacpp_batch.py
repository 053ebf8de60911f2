"""Several requests per llama.cpp decode step, on the real embedded model: each gets its own text,
a closed stream frees its sequence, and every step's work shares add up to one."""

import json
import threading
from collections import defaultdict
from collections.abc import Iterator

import pytest

from openjarvis.errors import UserError
from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings
from openjarvis.runtime.models import resolve_model
from openjarvis.runtime.types import ChatMessage, ChatRequest, Completion, GenerationRequest

PROMPTS = (
    'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
    "import os\n\ndef list_files(path):\n",
    "# A function to compute the factorial\ndef factorial(n):\n",
    "class Stack:\n    def __init__(self):\n",
)


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    settings = LlamaCppSettings(n_ctx=512, reuse_prompt_cache=False, concurrency=4)
    engine = LlamaCppEngine(resolve_model(None).path, settings)
    yield engine
    engine.close()


def _at_once(engine: LlamaCppEngine, requests: list[GenerationRequest]) -> list[Completion]:
    """Generate from one thread per request, all started together."""
    completions: list[Completion | None] = [None] * len(requests)
    start = threading.Barrier(len(requests))

    def run(index: int) -> None:
        start.wait()
        completions[index] = engine.generate(requests[index])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(c is not None for c in completions), "a request did not finish"
    return [c for c in completions if c is not None]


def test_four_concurrent_greedy_requests_give_the_text_each_gets_alone(
    engine: LlamaCppEngine,
) -> None:
    """ggml's CPU kernels handle 4 or more rows of a step differently from one row, so a
    sequence in a batch can part from its lone text where its two best tokens are nearly tied
    (docs/benchmarks.md); these prompts' greedy choices are clear for 24 tokens."""
    requests = [GenerationRequest(prompt, max_tokens=24) for prompt in PROMPTS]
    alone = [engine.generate(request) for request in requests]
    together = _at_once(engine, requests)
    assert [c.text for c in together] == [c.text for c in alone]
    assert all(c.completion_tokens == 24 for c in together)
    # They did share steps: otherwise this would only repeat the lone runs.
    assert max(piece.batch for c in together for piece in c.work) >= 3
    assert all(piece.batch == 1 for c in alone for piece in c.work)


def test_work_shares_sum_to_one_per_step(engine: LlamaCppEngine) -> None:
    completions = _at_once(engine, [GenerationRequest(p, max_tokens=12) for p in PROMPTS[:3]])
    steps: dict[tuple[float, float], list[float]] = defaultdict(list)
    for completion in completions:
        assert completion.work, "a batching engine reports the steps a request took part in"
        for piece in completion.work:
            assert 0 < piece.share <= 1 and piece.start_s < piece.end_s
            steps[piece.start_s, piece.end_s].append(piece.share)
    batches = {piece.batch for c in completions for piece in c.work}
    assert max(batches) > 1
    for shares in steps.values():
        assert sum(shares) == pytest.approx(1.0)
    for completion in completions:
        # One prefill step (a short prompt is one chunk), then one decode step per token after
        # the first; every piece lies inside the request's wall time.
        prefill, *decode = completion.work
        assert (prefill.share, prefill.batch) == (1.0, 1)
        assert len(decode) == completion.completion_tokens - 1


def test_a_closed_stream_frees_its_sequence() -> None:
    import llama_cpp

    settings = LlamaCppSettings(n_ctx=512, reuse_prompt_cache=False, concurrency=2)
    engine = LlamaCppEngine(resolve_model(None).path, settings)
    try:
        long = GenerationRequest(PROMPTS[0], max_tokens=400)
        first, second = engine.stream(long), engine.stream(long)
        next(first), next(second)  # both hold a sequence now
        third: list[Completion] = []
        waiting = threading.Thread(
            target=lambda: third.append(engine.generate(GenerationRequest(PROMPTS[1], 4)))
        )
        waiting.start()
        waiting.join(timeout=1.0)
        assert waiting.is_alive(), "a third request waits while both sequences are taken"
        first.close()
        waiting.join(timeout=60)
        assert not waiting.is_alive() and third[0].completion_tokens == 4
        second.close()
        scheduler = engine._scheduler
        assert scheduler.free_slots() == 2
        memory = scheduler._context.memory
        # Without prompt reuse a freed sequence keeps no KV cells.
        assert [llama_cpp.llama_memory_seq_pos_max(memory, s) for s in (0, 1)] == [-1, -1]
    finally:
        engine.close()


def test_a_stream_left_open_is_ended_by_close() -> None:
    settings = LlamaCppSettings(n_ctx=512, reuse_prompt_cache=False, concurrency=1)
    engine = LlamaCppEngine(resolve_model(None).path, settings)
    stream = engine.stream(GenerationRequest(PROMPTS[0], max_tokens=400))
    next(stream)
    engine.close()  # returns instead of waiting for 400 tokens
    with pytest.raises(UserError, match="closed while this stream was open"):
        list(stream)


def test_prompt_reuse_gives_the_text_of_a_cold_cache(engine: LlamaCppEngine) -> None:
    """A repeated prompt reuses its sequence's cached prefix, as llama-cpp-python does."""
    warm = LlamaCppEngine(
        resolve_model(None).path, LlamaCppSettings(n_ctx=512, reuse_prompt_cache=True)
    )
    try:
        request = GenerationRequest(PROMPTS[2], max_tokens=16)
        cold = engine.generate(request).text
        assert [warm.generate(request).text for _ in range(3)] == [cold] * 3
        longer = GenerationRequest(PROMPTS[2] + "    if n < 0:\n", max_tokens=16)
        assert warm.generate(longer).text == engine.generate(longer).text
    finally:
        warm.close()


def test_seeded_sampling_repeats_inside_a_batch(engine: LlamaCppEngine) -> None:
    sampled = GenerationRequest(PROMPTS[3], max_tokens=16, temperature=0.9, seed=11)
    alone = engine.generate(sampled).text
    assert engine.generate(sampled).text == alone
    greedy = engine.generate(GenerationRequest(PROMPTS[3], max_tokens=16)).text
    assert alone != greedy, "temperature 0.9 should leave the greedy path within 16 tokens"


def test_a_json_schema_request_decodes_in_the_batch(engine: LlamaCppEngine) -> None:
    """Its grammar lives in its own sampler chain, so it shares steps with plain requests."""
    schema: dict[str, object] = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    person = (ChatMessage("user", "Describe a person as JSON with a name and an age."),)
    plain = [GenerationRequest(p, max_tokens=40) for p in PROMPTS[:2]]
    results: list[Completion] = []
    threads = [
        threading.Thread(target=lambda r=r: results.append(engine.generate(r))) for r in plain
    ]
    for thread in threads:
        thread.start()
    constrained = engine.generate(ChatRequest(person, max_tokens=40, json_schema=schema))
    for thread in threads:
        thread.join(timeout=120)
    decoded = json.loads(constrained.text)
    assert isinstance(decoded["name"], str) and isinstance(decoded["age"], int)
    assert max(piece.batch for piece in constrained.work) > 1

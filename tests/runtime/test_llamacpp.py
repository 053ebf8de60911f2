"""The llama.cpp engine on the real embedded model (loaded once for the module)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from openjarvis.errors import UserError
from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings
from openjarvis.runtime.models import resolve_model
from openjarvis.runtime.types import GenerationRequest

PROMPT = 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n'


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    model = resolve_model(None)
    engine = LlamaCppEngine(model.path, LlamaCppSettings(n_ctx=512, reuse_prompt_cache=False))
    yield engine
    engine.close()


def test_greedy_generation_is_repeatable_and_timed(engine: LlamaCppEngine) -> None:
    request = GenerationRequest(PROMPT, max_tokens=24)
    first = engine.generate(request)
    second = engine.generate(request)
    assert first.text == second.text
    assert first.completion_tokens == second.completion_tokens > 0
    assert first.prompt_tokens > 10
    assert first.ttft_s is not None and 0 < first.ttft_s <= first.wall_s
    rate = first.decode_tokens_per_s
    assert rate is not None and rate > 1


def test_max_tokens_bounds_the_completion(engine: LlamaCppEngine) -> None:
    completion = engine.generate(GenerationRequest(PROMPT, max_tokens=5))
    assert completion.completion_tokens <= 5


def test_stop_sequence_cuts_the_text(engine: LlamaCppEngine) -> None:
    free = engine.generate(GenerationRequest(PROMPT, max_tokens=40))
    assert len(free.text) > 2
    stop = free.text[1:3]
    stopped = engine.generate(GenerationRequest(PROMPT, max_tokens=40, stop=(stop,)))
    assert stop not in stopped.text
    assert free.text.startswith(stopped.text)
    assert stopped.finish_reason == "stop"


def test_stream_yields_the_same_text_as_generate(engine: LlamaCppEngine) -> None:
    request = GenerationRequest(PROMPT, max_tokens=30, stop=("\ndef ",))
    streamed = "".join(chunk.text for chunk in engine.stream(request))
    assert streamed == engine.generate(request).text


def test_prompt_beyond_the_context_is_refused_not_truncated(engine: LlamaCppEngine) -> None:
    with pytest.raises(UserError, match="exceeds the model context of 512 tokens"):
        engine.generate(GenerationRequest(PROMPT * 40, max_tokens=16))


def test_damaged_gguf_is_a_user_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\0\0\0" + b"\xff" * 64)
    with pytest.raises(UserError, match="could not load"):
        LlamaCppEngine(broken)

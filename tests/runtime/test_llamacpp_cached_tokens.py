"""The llama.cpp engine says how many prompt tokens a request took from its slot's cache: a
second request sharing a long prefix with the first reports most of its prompt as cached."""

from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings
from openjarvis.runtime.models import resolve_model
from openjarvis.runtime.types import GenerationRequest

PREFIX = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n" for i in range(20))


def test_a_shared_prefix_is_reported_as_cached_tokens() -> None:
    settings = LlamaCppSettings(n_ctx=1024, reuse_prompt_cache=True, concurrency=1)
    engine = LlamaCppEngine(resolve_model(None).path, settings)
    try:
        first = engine.generate(GenerationRequest(PREFIX + "def first(", max_tokens=4))
        second = engine.generate(GenerationRequest(PREFIX + "def second(", max_tokens=4))
        cold = LlamaCppEngine(
            resolve_model(None).path, LlamaCppSettings(n_ctx=1024, reuse_prompt_cache=False)
        )
        try:
            unshared = cold.generate(GenerationRequest(PREFIX + "def third(", max_tokens=4))
        finally:
            cold.close()
    finally:
        engine.close()
    assert first.cached_tokens == 0
    assert second.cached_tokens is not None
    assert second.cached_tokens >= 0.7 * second.prompt_tokens
    assert second.cached_tokens < second.prompt_tokens  # its own ending is computed
    assert unshared.cached_tokens == 0  # reuse off: nothing taken from a cache

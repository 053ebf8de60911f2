"""The llama.cpp engine on the real embedded model (loaded once for the module)."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from openjarvis.errors import UserError
from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings
from openjarvis.runtime.models import resolve_model
from openjarvis.runtime.types import ChatMessage, ChatRequest, GenerationRequest

QUESTION = (ChatMessage("user", "What is the capital of France? Answer in one word."),)
PERSON_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}

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
    # Greedy code after a function header runs far past 5 tokens: the limit is what stopped it.
    assert completion.completion_tokens == 5
    assert completion.finish_reason == "length"


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
    chunks = list(engine.stream(request))
    assert [c.completion is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    streamed = "".join(chunk.text for chunk in chunks)
    last = chunks[-1].completion
    assert last is not None
    assert streamed == engine.generate(request).text == last.text


def test_prompt_beyond_the_context_is_refused_not_truncated(engine: LlamaCppEngine) -> None:
    with pytest.raises(UserError, match="exceeds the model context of 512 tokens"):
        engine.generate(GenerationRequest(PROMPT * 40, max_tokens=16))


def test_damaged_gguf_is_a_user_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\0\0\0" + b"\xff" * 64)
    with pytest.raises(UserError, match="damaged"):
        LlamaCppEngine(broken)


def test_chat_matches_llama_cpp_python_with_the_same_template(engine: LlamaCppEngine) -> None:
    """Greedy chat through our token loop gives llama-cpp-python's own chat completion."""
    import llama_cpp

    assert engine.chat_template.name == "llama.cpp:gemma"  # this GGUF carries no template
    reference = llama_cpp.Llama(
        model_path=str(resolve_model(None).path), n_ctx=512, chat_format="gemma", verbose=False
    )
    try:
        theirs = reference.create_chat_completion(
            # QUESTION holds one user message
            messages=[{"role": "user", "content": m.content} for m in QUESTION],
            max_tokens=16,
            temperature=0.0,
        )
    finally:
        reference.close()
    assert isinstance(theirs, dict)  # the whole reply, not a stream of chunks
    ours = engine.generate(ChatRequest(QUESTION, max_tokens=16))
    assert ours.text == theirs["choices"][0]["message"]["content"]
    assert ours.prompt_tokens == theirs["usage"]["prompt_tokens"]
    assert ours.completion_tokens == theirs["usage"]["completion_tokens"]


def test_json_schema_constrains_the_output(engine: LlamaCppEngine) -> None:
    messages = (ChatMessage("user", "Describe a person as JSON with a name and an age."),)
    completion = engine.generate(ChatRequest(messages, max_tokens=40, json_schema=PERSON_SCHEMA))
    person = json.loads(completion.text)
    assert isinstance(person["name"], str) and isinstance(person["age"], int)
    assert completion.finish_reason == "stop"


def test_decode_reports_memory_bandwidth_utilisation(engine: LlamaCppEngine) -> None:
    completion = engine.generate(GenerationRequest(PROMPT, max_tokens=16))
    weights = resolve_model(None).path.stat().st_size
    assert completion.decode_bytes_per_token is not None
    assert weights < completion.decode_bytes_per_token < weights * 1.1
    mbu = completion.memory_bandwidth_utilisation
    assert mbu is not None and 0 < mbu < 2  # above 1 only if the copy test undershot


def test_chat_beyond_the_context_is_refused(engine: LlamaCppEngine) -> None:
    long_chat = (ChatMessage("user", PROMPT * 40),)
    with pytest.raises(UserError, match="exceeds the model context"):
        engine.generate(ChatRequest(long_chat, max_tokens=16))


def test_settings_reach_llama_cpp(engine: LlamaCppEngine) -> None:
    settings = engine.settings_dict()
    assert settings["n_ctx"] == 512
    assert settings["n_threads"] == engine._llama.context_params.n_threads
    assert settings["n_threads_batch"] == engine._llama.context_params.n_threads_batch
    assert settings["chat_template"] == "llama.cpp:gemma"


def test_one_thread_option_sets_decode_and_prefill_threads() -> None:
    settings = LlamaCppSettings(n_threads=1)
    assert (settings.resolved_threads(), settings.resolved_batch_threads()) == (1, 1)

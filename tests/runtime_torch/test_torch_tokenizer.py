"""The torch engine's tokenizer on the embedded Gemma 3 270M GGUF: a chat prompt tokenized in
pieces, each ending with a turn's end, and in chunks of lines, gives exactly the tokens of the
whole prompt."""

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from openjarvis.runtime.models import resolve_model
from openjarvis.runtime.torch.tokenizer import GgufTokenizer
from openjarvis.runtime.types import ChatMessage

SYSTEM = "You are a careful coding assistant.\n\n" + "\n".join(
    f"src/module_{i}.py: def handler_{i}(request) -> Response  # ünïcode, 数字 {i}"
    for i in range(60)
)


@pytest.fixture(scope="module")
def tokenizer() -> GgufTokenizer:
    return GgufTokenizer(Path(resolve_model(None).path))


def _whole(tokenizer: GgufTokenizer, messages: tuple[ChatMessage, ...]) -> list[int]:
    prompt = tokenizer.chat_template.render(messages)
    add_bos = not tokenizer.chat_template.prompt_has_bos(prompt)
    return tokenizer.encode(prompt, add_bos, special=True)


@pytest.mark.parametrize(
    "messages",
    [
        (ChatMessage("user", "hi"),),
        (ChatMessage("system", SYSTEM), ChatMessage("user", "Where is the meter?")),
        (
            ChatMessage("system", SYSTEM),
            ChatMessage("user", "  leading and trailing spaces  \n"),
            ChatMessage("assistant", "It is in power/meter.py.\n\n"),
            ChatMessage("user", "A turn's end written by the user: <end_of_turn> and after"),
        ),
        (ChatMessage("user", ""), ChatMessage("assistant", ""), ChatMessage("user", "\n")),
        (
            ChatMessage("system", "\n\n\n  indented\n\t\ttabs\n" * 40 + "ends in lines\n\n\n"),
            ChatMessage("user", "\n<start_of_turn>  a turn's start after a line\n\n" * 12),
        ),
    ],
    ids=["one-turn", "system", "history-with-a-turn-end-in-text", "empty-turns", "line-runs"],
)
def test_a_chat_prompt_in_pieces_is_the_whole_prompts_tokens(
    tokenizer: GgufTokenizer, messages: tuple[ChatMessage, ...]
) -> None:
    assert tokenizer._split is not None, "Gemma's <end_of_turn> splits its prompts"
    assert tokenizer._lines, "no token of Gemma's has a newline followed by more"
    whole = _whole(tokenizer, messages)
    assert tokenizer.chat_prompt(messages) == whole
    assert tokenizer.chat_prompt(messages) == whole  # from the kept pieces too


def test_a_conversations_earlier_turns_are_tokenized_once(tokenizer: GgufTokenizer) -> None:
    tokenizer._encode_chunk.cache_clear()
    first = (ChatMessage("system", SYSTEM), ChatMessage("user", "first question"))
    second = (*first, ChatMessage("assistant", "an answer"), ChatMessage("user", "and then?"))
    tokenizer.chat_prompt(first)
    chunks = tokenizer._encode_chunk.cache_info().misses
    assert chunks > 5  # the system prompt's lines, about 512 characters a chunk
    before = tokenizer._encode_chunk.cache_info()
    assert tokenizer.chat_prompt(second) == _whole(tokenizer, second)
    after = tokenizer._encode_chunk.cache_info()
    # Kept: every chunk of the first turn (the system prompt with the first question: Gemma
    # writes them in one turn), and the prompt for the model's turn.
    assert after.hits - before.hits == chunks
    assert after.misses - before.misses == 2  # the answer's turn and the new question's


def test_a_new_conversation_tokenizes_only_the_end_of_the_shared_system_prompt(
    tokenizer: GgufTokenizer,
) -> None:
    """Two conversations with one system prompt (an assistant's requests): the second one's
    first turn differs only in its last chunk, the system prompt's last lines with the new
    question; every other chunk is kept."""
    tokenizer._encode_chunk.cache_clear()
    one = (ChatMessage("system", SYSTEM), ChatMessage("user", "What does handler_3 do?"))
    other = (ChatMessage("system", SYSTEM), ChatMessage("user", "Where is the meter?"))
    tokenizer.chat_prompt(one)
    chunks = tokenizer._encode_chunk.cache_info().misses
    assert tokenizer.chat_prompt(other) == _whole(tokenizer, other)
    info = tokenizer._encode_chunk.cache_info()
    assert info.misses - chunks == 1
    assert info.hits == chunks - 1

"""Text to tokens and back for the torch engine, from a GGUF's own vocabulary.

llama-cpp-python (already a core dependency) opens the GGUF with vocab_only=True: no weights,
and exactly the tokenisation, special tokens and chat template that the llama.cpp engine uses,
so the two engines see the same token ids for the same request.

A chat prompt is tokenized in pieces that each end with a turn's end token, and each piece in
chunks of about 512 characters that end with a line, each chunk kept: an assistant's
history and its system prompt come back with every request, and llama.cpp takes 8-10 ms here
for the 1,150 tokens of jarvis's system prompt, longer than their prefill on an H200. llama.cpp
itself splits text at special tokens before it tokenizes the text between them, so the pieces
give the same tokens as the whole wherever nothing crosses a split: no space added before text
that follows a special token, no whitespace stripped beside one, and no longer special token
containing the split's text. A chunk ends after a newline that the next character is not: with
a SentencePiece vocabulary in which no token has a newline followed by another character
(Gemma's), no merge can cross that point, so the chunks too give the whole's tokens.
"""

import functools
import itertools
import re
from pathlib import Path
from typing import Any

from openjarvis.errors import UserError
from openjarvis.runtime.chat_template import ChatTemplate
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.types import ChatMessage

__all__ = ["GgufTokenizer"]

# A chat prompt's chunks: about this many characters each (each call into llama.cpp also
# searches the text for its special tokens: Gemma's 1,150-token system prompt took 12 ms cold in
# chunks of 512 characters, 18 ms in chunks of 256, against 9-10 ms whole and 1.4-1.9 ms with
# its chunks kept, on the 2-core VM), and how many are kept (system prompts and turns).
_CHUNK_CHARS = 512
_KEPT_CHUNKS = 1024
_LINE_END = re.compile(r"\n(?=[^\n])")


class GgufTokenizer:
    def __init__(self, path: Path) -> None:
        try:
            import llama_cpp
        except ImportError as error:
            raise UserError("llama-cpp-python is missing: pip install llama-cpp-python") from error
        self._llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self._pieces: dict[int, bytes] = {}
        model = self._llama._model
        vocab = model.vocab
        self.end_tokens = frozenset(
            token for token in range(model.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, token)
        )
        self._split = _split_pattern(llama_cpp, self._llama, self.end_tokens)
        self._lines = self._split is not None and _lines_stay_whole(self._llama)
        self._encode_chunk = functools.lru_cache(maxsize=_KEPT_CHUNKS)(self._encode_special)
        header = read_gguf_header(path)
        self.chat_template = ChatTemplate.for_model(
            llama_cpp,
            self._llama.metadata,
            header.architecture or "",
            bos=model.token_get_text(self._llama.token_bos()),
            eos=model.token_get_text(self._llama.token_eos()),
        )

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return list(self._llama.tokenize(text.encode("utf-8"), add_bos, special))

    def chat_prompt(self, messages: tuple[ChatMessage, ...]) -> list[int]:
        prompt = self.chat_template.render(messages)
        # The template writes special tokens as text; they must parse back into tokens.
        add_bos = not self.chat_template.prompt_has_bos(prompt)
        if self._split is None:
            return self.encode(prompt, add_bos, special=True)
        cuts = [0, *(match.end() for match in self._split.finditer(prompt)), len(prompt)]
        pieces = [prompt[a:b] for a, b in itertools.pairwise(cuts) if b > a]
        tokens: list[int] = []
        for index, piece in enumerate(pieces):
            for part, chunk in enumerate(self._chunks(piece)):
                tokens.extend(self._encode_chunk(chunk, add_bos and index == 0 and part == 0))
        return tokens

    def _chunks(self, text: str) -> list[str]:
        """The text cut after a newline that another character follows, once a chunk has
        _CHUNK_CHARS characters: the same text gives the same chunks, so a long system prompt's
        are kept; only the last (with what follows it) is new."""
        if not self._lines or len(text) <= _CHUNK_CHARS:
            return [text]
        chunks, start = [], 0
        for match in _LINE_END.finditer(text, _CHUNK_CHARS):
            if match.end() - start >= _CHUNK_CHARS:
                chunks.append(text[start : match.end()])
                start = match.end()
        chunks.append(text[start:])
        return chunks

    def _encode_special(self, text: str, add_bos: bool) -> tuple[int, ...]:
        return tuple(self.encode(text, add_bos, special=True))

    def piece(self, token: int) -> bytes:
        """The bytes of one token: pieces join into text only once a character is complete.
        Kept once looked up: a call into llama.cpp per token per stream cost more than a
        dictionary's lookup, and a token's bytes never change."""
        known = self._pieces.get(token)
        if known is None:
            known = self._pieces[token] = bytes(self._llama.detokenize([token]))
        return known


def _lines_stay_whole(llama: Any) -> bool:
    """Whether tokens never cross a newline that another character follows: a SentencePiece
    vocabulary (no pre-tokenizing pattern) none of whose tokens has a newline then more."""
    if llama.metadata.get("tokenizer.ggml.model") != "llama":
        return False
    model = llama._model
    return not any(
        "\n" in model.token_get_text(token).rstrip("\n") for token in range(model.n_vocab())
    )


def _split_pattern(
    llama_cpp: Any, llama: Any, end_tokens: frozenset[int]
) -> re.Pattern[str] | None:
    """A pattern for the turn-end tokens' texts that a prompt is cut just after, where the
    pieces tokenize exactly as the whole (the module's conditions); None where none qualifies."""
    if str(llama.metadata.get("tokenizer.ggml.add_space_prefix", "false")).lower() == "true":
        return None
    model = llama._model
    special = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    strip = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
    attributes = {token: llama_cpp.llama_vocab_get_attr(model.vocab, token) for token in end_tokens}
    texts = [model.token_get_text(token) for token in end_tokens if not attributes[token] & strip]
    specials = [
        model.token_get_text(token)
        for token in range(model.n_vocab())
        if llama_cpp.llama_vocab_get_attr(model.vocab, token) & special
    ]
    splits = [
        text
        for text in texts
        if text and not any(text in other and text != other for other in specials)
    ]
    if not splits:
        return None
    return re.compile("|".join(re.escape(text) for text in sorted(splits, key=len, reverse=True)))

"""Text to tokens and back for the torch engine, from a GGUF's own vocabulary.

llama-cpp-python (already a core dependency) opens the GGUF with vocab_only=True: no weights,
and exactly the tokenisation, special tokens and chat template that the llama.cpp engine uses,
so the two engines see the same token ids for the same request.

A chat prompt is tokenized in pieces that each end with a turn's end token, each piece kept:
an assistant's history comes back with every turn, and llama.cpp takes 8-10 ms here for the
1,150 tokens of jarvis's system prompt, longer than their prefill on an H200 (a template that
writes the system prompt into the first user turn, as Gemma's does, keeps it in that turn's
piece: a new first question tokenizes it again). llama.cpp itself splits text at special tokens
before it tokenizes the text between them, so the pieces give the same tokens as the whole
wherever nothing crosses a split: no space added before text that follows a special token, no
whitespace stripped beside one, and no longer special token containing the split's text.
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
        self._encode_piece = functools.lru_cache(maxsize=64)(self._encode_special)
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
            tokens.extend(self._encode_piece(piece, add_bos and index == 0))
        return tokens

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

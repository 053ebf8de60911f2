"""Text to tokens and back for the torch engine, from a GGUF's own vocabulary.

llama-cpp-python (already a core dependency) opens the GGUF with vocab_only=True: no weights,
and exactly the tokenisation, special tokens and chat template that the llama.cpp engine uses,
so the two engines see the same token ids for the same request.
"""

from pathlib import Path

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
        self.end_tokens = frozenset(
            token
            for token in range(model.n_vocab())
            if llama_cpp.llama_vocab_is_eog(model.vocab, token)
        )
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
        return self.encode(prompt, not self.chat_template.prompt_has_bos(prompt), special=True)

    def piece(self, token: int) -> bytes:
        """The bytes of one token: pieces join into text only once a character is complete.
        Kept once looked up: a call into llama.cpp per token per stream cost more than a
        dictionary's lookup, and a token's bytes never change."""
        known = self._pieces.get(token)
        if known is None:
            known = self._pieces[token] = bytes(self._llama.detokenize([token]))
        return known

"""Token counts for servers that send no `usage`: the GGUF's own tokenizer, loaded without weights.

A prompt is tokenized as llama.cpp's servers tokenize it (chat messages through the model's chat
template, plain prompts with BOS); a reply's text is re-tokenized, which can differ from the
tokens the server sampled by a token or so where a word splits another way.
"""

import threading
from pathlib import Path
from typing import Any

from openjarvis.runtime.chat_template import ChatTemplate
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.hf_cache import cached_ggufs
from openjarvis.runtime.llamacpp import _import_llama_cpp
from openjarvis.runtime.models import DEFAULT_MODEL_NAME, embedded_default
from openjarvis.runtime.types import ChatRequest, Request

__all__ = ["GgufTokenCounter", "tokenizer_file"]


def tokenizer_file(names: list[str]) -> Path | None:
    """The first of `names` (a model as the user or the server calls it) that is a GGUF here:
    a path to a .gguf file, the embedded model's name, or a name `jarvis models` lists."""
    for name in names:
        path = Path(name).expanduser()
        if path.suffix == ".gguf" and path.is_file():
            return path.resolve()
        if name == DEFAULT_MODEL_NAME:
            return embedded_default().path
        cached = next((model for model in cached_ggufs() if model.name == name), None)
        if cached is not None:
            return cached.path
    return None


class GgufTokenCounter:
    """Counts tokens with one GGUF's vocabulary (no weights are loaded: a few MB at most)."""

    def __init__(self, path: Path) -> None:
        llama_cpp = _import_llama_cpp()
        self.path = path
        self._llama: Any = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        model = self._llama._model
        self._template = ChatTemplate.for_model(
            llama_cpp,
            self._llama.metadata,
            read_gguf_header(path).architecture or "",
            bos=model.token_get_text(self._llama.token_bos()),
            eos=model.token_get_text(self._llama.token_eos()),
        )
        self._lock = threading.Lock()  # requests in flight count from their own threads
        self.counted = 0  # replies counted so far

    def count(self, request: Request, text: str) -> tuple[int, int]:
        """(prompt tokens, reply tokens) of one request and the text it got back."""
        with self._lock:
            self.counted += 1
            return self.prompt_tokens(request), self.text_tokens(text)

    def prompt_tokens(self, request: Request) -> int:
        if isinstance(request, ChatRequest):
            prompt = self._template.render(request.messages)
            add_bos, special = not self._template.prompt_has_bos(prompt), True
        else:
            prompt, add_bos, special = request.prompt, True, False
        return len(self._llama.tokenize(prompt.encode("utf-8"), add_bos, special))

    def text_tokens(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), False, False)) if text else 0

    def close(self) -> None:
        self._llama.close()

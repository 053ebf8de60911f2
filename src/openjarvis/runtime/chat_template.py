"""Chat messages to one prompt string with the model's own template, for token-by-token decoding.

The GGUF's Jinja template is rendered by llama-cpp-python's formatter; a GGUF without one
gets llama.cpp's built-in template for its architecture family, or a UserError.
"""

import ctypes
import re
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from openjarvis.errors import UserError
from openjarvis.runtime.types import ChatMessage

if TYPE_CHECKING:
    from llama_cpp.llama_types import ChatCompletionRequestMessage

__all__ = ["ChatTemplate"]

Render = Callable[[tuple[ChatMessage, ...]], str]


class ChatTemplate:
    """Renders messages to a prompt; `name` says which template (for settings and messages)."""

    def __init__(self, name: str, render: Render, bos_text: str) -> None:
        self.name = name
        self._render = render
        self._bos_text = bos_text

    def render(self, messages: tuple[ChatMessage, ...]) -> str:
        if not messages:
            raise UserError("a chat request needs at least one message")
        try:
            return self._render(messages)
        except (ValueError, TypeError) as error:
            # Templates reject what they cannot format (a system turn, roles out of order).
            raise UserError(f"the model's chat template ({self.name}) refused: {error}") from error

    def prompt_has_bos(self, prompt: str) -> bool:
        """Jinja templates usually write the BOS text themselves; it must not be added twice."""
        return bool(self._bos_text) and prompt.startswith(self._bos_text)

    @classmethod
    def for_model(
        cls, llama_cpp: ModuleType, metadata: dict[str, str], architecture: str, bos: str, eos: str
    ) -> "ChatTemplate":
        template = metadata.get("tokenizer.chat_template")
        if template:
            return cls("gguf", _jinja(llama_cpp, template, bos, eos), bos)
        builtin = _builtin_name(llama_cpp, architecture)
        if builtin is None:
            return cls("none", _no_template(architecture), bos)
        return cls(f"llama.cpp:{builtin}", _builtin(llama_cpp, builtin), bos)


def _jinja(llama_cpp: ModuleType, template: str, bos: str, eos: str) -> Render:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)

    def render(messages: tuple[ChatMessage, ...]) -> str:
        return formatter(messages=[_llama_message(m) for m in messages]).prompt

    return render


def _llama_message(message: ChatMessage) -> "ChatCompletionRequestMessage":
    # llama-cpp-python types a message per role; the branches give the checker each literal.
    if message.role == "system":
        return {"role": "system", "content": message.content}
    if message.role == "user":
        return {"role": "user", "content": message.content}
    return {"role": "assistant", "content": message.content}


def _builtin_names(llama_cpp: ModuleType) -> set[str]:
    names = (ctypes.c_char_p * 256)()
    count = llama_cpp.llama_chat_builtin_templates(names, len(names))
    return {name.decode() for name in names[: min(count, len(names))] if name is not None}


def _builtin_name(llama_cpp: ModuleType, architecture: str) -> str | None:
    """llama.cpp's template named like the architecture (gemma3 -> gemma), if there is one."""
    known = _builtin_names(llama_cpp)
    for candidate in (architecture, re.sub(r"\d+$", "", architecture)):
        if candidate in known:
            return candidate
    return None


def _builtin(llama_cpp: ModuleType, name: str) -> Render:
    def render(messages: tuple[ChatMessage, ...]) -> str:
        encoded = [(m.role.encode(), m.content.encode()) for m in messages]
        chat = (llama_cpp.llama_chat_message * len(encoded))(
            *(llama_cpp.llama_chat_message(role, content) for role, content in encoded)
        )
        size = 4096 + sum(len(content) for _, content in encoded) * 2
        for _ in range(2):  # a too-small buffer reports the size it needs
            buffer = ctypes.create_string_buffer(size)
            needed = llama_cpp.llama_chat_apply_template(
                name.encode(), chat, len(encoded), True, buffer, size
            )
            if needed < 0:
                raise ValueError(f"llama.cpp's {name} template cannot format these messages")
            if needed < size:
                return buffer.raw[:needed].decode("utf-8")
            size = needed + 1
        raise RuntimeError("llama_chat_apply_template kept asking for a larger buffer")

    return render


def _no_template(architecture: str) -> Render:
    def render(messages: tuple[ChatMessage, ...]) -> str:
        raise UserError(
            f"this GGUF has no chat template and llama.cpp has none for its architecture "
            f"'{architecture}'; use plain completions (/v1/completions) or a GGUF with "
            "tokenizer.chat_template"
        )

    return render

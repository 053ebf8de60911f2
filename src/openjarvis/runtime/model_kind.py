"""Whether a GGUF holds a base (pretrained) model or an instruction-tuned one ("chat"), decided
from its header with the evidence that decided it, and the warning chat front ends print.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from openjarvis.errors import UserError
from openjarvis.runtime.gguf import GgufHeader, read_gguf_header

__all__ = [
    "ModelKind",
    "ModelKindVerdict",
    "base_model_note",
    "classify_model",
    "read_model_kind",
]

ModelKind = Literal["base", "chat"]

_TEMPLATE_KEY = "tokenizer.chat_template"  # named variants: tokenizer.chat_template.<name>
# Words of general.finetune / general.name ("gemma-3-270m-it", "Qwen2.5 7B Instruct").
_CHAT_WORDS = frozenset({"it", "instruct", "chat", "sft", "dpo", "rlhf"})
_BASE_WORDS = frozenset({"base", "pt", "pretrained", "pretrain"})
_NAME_KEYS = ("general.finetune", "general.name")  # the more specific key first


@dataclass(frozen=True, slots=True)
class ModelKindVerdict:
    kind: ModelKind | None  # None: the header is unreadable, or its evidence disagrees
    evidence: str  # what decided, in words, e.g. "no tokenizer.chat_template; ..."


def _name_hint(header: GgufHeader) -> tuple[ModelKind, str] | None:
    """The kind a name key states ("general.finetune 'Instruct'"), from the first that does."""
    for key in _NAME_KEYS:
        value = header.metadata.get(key)
        if not isinstance(value, str):
            continue
        words = set(re.split(r"[^a-z0-9]+", value.lower()))
        chat, base = bool(words & _CHAT_WORDS), bool(words & _BASE_WORDS)
        if chat != base:  # a name with both kinds of words states neither
            return ("chat" if chat else "base"), f"{key} {value!r}"
    return None


def _names(header: GgufHeader) -> str:
    shown = [f"{key} {header.metadata[key]!r}" for key in _NAME_KEYS if key in header.metadata]
    return ", ".join(shown) or "no general.finetune or general.name"


def classify_model(header: GgufHeader) -> ModelKindVerdict:
    """A chat template makes a model "chat", its absence "base"; a name that says "instruct",
    "it" or "chat" (or "base", "pt") in general.finetune or general.name is used too, and a
    template beside a name that says base leaves the kind unknown rather than guessed."""
    template = any(
        key == _TEMPLATE_KEY or key.startswith(_TEMPLATE_KEY + ".")
        for key, value in header.metadata.items()
        if isinstance(value, str) and value.strip()
    )
    hint = _name_hint(header)
    if template:
        if hint is None:
            return ModelKindVerdict("chat", f"{_TEMPLATE_KEY} present")
        if hint[0] == "chat":
            return ModelKindVerdict("chat", f"{_TEMPLATE_KEY} present; {hint[1]}")
        return ModelKindVerdict(
            None, f"{_TEMPLATE_KEY} present but {hint[1]} names a base model: undecided"
        )
    if hint is None:
        return ModelKindVerdict(
            "base", f"no {_TEMPLATE_KEY}, and no instruction tuning named ({_names(header)})"
        )
    return ModelKindVerdict(hint[0], f"no {_TEMPLATE_KEY}; {hint[1]}")


def read_model_kind(path: Path) -> ModelKindVerdict:
    """classify_model over the file's header; an unreadable header leaves the kind unknown."""
    try:
        header = read_gguf_header(path)
    except UserError as error:
        return ModelKindVerdict(None, f"header unreadable: {error}")
    return classify_model(header)


def base_model_note(model_name: str, verdict: ModelKindVerdict | None) -> str | None:
    """The line `jarvis` and `jarvis serve` print once for a base model; None for the others."""
    if verdict is None or verdict.kind != "base":
        return None
    return (
        f"note: {model_name} is a base model (no chat template): chat replies will be poor; "
        "use --model with an instruction-tuned GGUF"
    )

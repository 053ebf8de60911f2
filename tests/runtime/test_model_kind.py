"""Base or instruction-tuned, from the GGUF header: the embedded model and files written here."""

from pathlib import Path

import pytest

from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.model_kind import base_model_note, classify_model, read_model_kind
from openjarvis.runtime.models import DEFAULT_MODEL_NAME, resolve_model
from tests.runtime.gguf_files import write_gguf

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{{ message['content'] }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
)


def _kind(tmp_path: Path, metadata: dict[str, object]) -> tuple[str | None, str]:
    path = write_gguf(tmp_path / "m.gguf", {"general.architecture": "llama", **metadata})
    verdict = classify_model(read_gguf_header(path))
    return verdict.kind, verdict.evidence


def test_the_embedded_model_is_a_base_model_and_says_why() -> None:
    verdict = read_model_kind(resolve_model(None).path)
    assert verdict.kind == "base"
    assert verdict.evidence == (
        "no tokenizer.chat_template, and no instruction tuning named (general.name 'Gemma 3 270m')"
    )
    assert "-it" not in DEFAULT_MODEL_NAME and "270m" in DEFAULT_MODEL_NAME


def test_a_chat_template_makes_a_chat_model(tmp_path: Path) -> None:
    kind, evidence = _kind(tmp_path, {"tokenizer.chat_template": GEMMA_TEMPLATE})
    assert (kind, evidence) == ("chat", "tokenizer.chat_template present")
    kind, evidence = _kind(
        tmp_path, {"general.finetune": "it", "tokenizer.chat_template": GEMMA_TEMPLATE}
    )
    assert (kind, evidence) == ("chat", "tokenizer.chat_template present; general.finetune 'it'")


@pytest.mark.parametrize(
    ("metadata", "kind", "evidence"),
    [
        (
            {"general.name": "Qwen2.5 7B Instruct"},
            "chat",
            "no tokenizer.chat_template; general.name 'Qwen2.5 7B Instruct'",
        ),
        # general.finetune is read before general.name.
        (
            {"general.finetune": "pt", "general.name": "gemma-3-1b-it"},
            "base",
            "no tokenizer.chat_template; general.finetune 'pt'",
        ),
        # "it" is a word of the name, not any pair of letters ("Fitness" says nothing).
        (
            {"general.name": "Fitness 1B"},
            "base",
            "no tokenizer.chat_template, and no instruction tuning named "
            "(general.name 'Fitness 1B')",
        ),
        (
            {},
            "base",
            "no tokenizer.chat_template, and no instruction tuning named "
            "(no general.finetune or general.name)",
        ),
        # A template beside a name that says base is evidence both ways: unknown, not guessed.
        (
            {"general.finetune": "Base", "tokenizer.chat_template": GEMMA_TEMPLATE},
            None,
            "tokenizer.chat_template present but general.finetune 'Base' names a base model: "
            "undecided",
        ),
    ],
)
def test_names_say_the_kind_when_the_template_does_not_decide(
    tmp_path: Path, metadata: dict[str, object], kind: str | None, evidence: str
) -> None:
    assert _kind(tmp_path, metadata) == (kind, evidence)


def test_an_unreadable_header_leaves_the_kind_unknown_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(write_gguf(tmp_path / "whole.gguf", {"general.name": "x"}).read_bytes()[:30])
    verdict = read_model_kind(path)
    assert verdict.kind is None and verdict.evidence.startswith("header unreadable: ")


def test_only_a_base_model_gets_the_warning(tmp_path: Path) -> None:
    base = read_model_kind(write_gguf(tmp_path / "b.gguf", {"general.name": "tiny"}))
    chat = read_model_kind(
        write_gguf(tmp_path / "c.gguf", {"tokenizer.chat_template": GEMMA_TEMPLATE})
    )
    assert base_model_note("tiny-Q4_K_M", base) == (
        "note: tiny-Q4_K_M is a base model (no chat template): chat replies will be poor; "
        "use --model with an instruction-tuned GGUF"
    )
    assert base_model_note("c", chat) is None
    assert base_model_note("cloud", None) is None

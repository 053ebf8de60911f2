"""The model catalog over a Hugging Face cache laid out as huggingface_hub writes it."""

import os
from pathlib import Path

import pytest

from openjarvis.errors import UserError
from openjarvis.runtime.catalog import list_models
from openjarvis.runtime.hf_cache import cached_ggufs, hub_cache_dir
from openjarvis.runtime.models import DEFAULT_MODEL_NAME, resolve_model
from tests.runtime.gguf_files import write_gguf

TINY = {"general.architecture": "llama", "general.file_type": 15}


def _cached_file(repo_dir: Path, revision: str, name: str, size: int = 0) -> Path:
    """A snapshot file that links to its blob, as the hub client stores files."""
    blob = write_gguf(repo_dir / "blobs" / f"{revision}-{name}", TINY, {"w": (8, 8)}, size)
    link = repo_dir / "snapshots" / revision / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    return link


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    repo = root / "models--acme--coder-GGUF"
    _cached_file(repo, "old", "coder-Q8_0.gguf")
    _cached_file(repo, "new", "coder-Q4_K_M.gguf", size=100)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("new")
    sharded = root / "models--acme--big-GGUF"
    for part in (1, 2):
        _cached_file(sharded, "r1", f"big-{part:05d}-of-00002.gguf", size=1000)
    return root


def test_hub_cache_location_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert hub_cache_dir() == tmp_path / "cache" / "huggingface" / "hub"


def test_current_snapshot_and_first_shard_only(hub: Path) -> None:
    found = {model.name: model for model in cached_ggufs()}
    assert set(found) == {"acme/big-GGUF/big", "acme/coder-GGUF/coder-Q4_K_M"}
    big = found["acme/big-GGUF/big"]
    assert big.path.name == "big-00001-of-00002.gguf"
    assert big.size_bytes == sum(p.stat().st_size for p in big.path.parent.glob("big-*.gguf"))


def test_list_models_reads_quantisation_and_parameters(hub: Path, tmp_path: Path) -> None:
    local = write_gguf(tmp_path / "mine" / "local.gguf", TINY, {"a": (4, 4), "b": (4,)})
    chat = write_gguf(
        tmp_path / "mine" / "chat.gguf", {**TINY, "tokenizer.chat_template": "{{ messages }}"}
    )
    (tmp_path / "mine" / "broken-Q6_K.gguf").write_bytes(b"GGUF\x03\0\0\0")
    entries = {e.name: e for e in list_models([tmp_path / "mine"], include_embedded=False)}
    mine = entries[str(local)]
    assert (mine.origin, mine.quantisation, mine.parameters) == ("local", "Q4_K_M", 20)
    assert (mine.kind, entries[str(chat)].kind) == ("base", "chat")
    broken = entries[str(tmp_path / "mine" / "broken-Q6_K.gguf")]
    assert broken.parameters is None and broken.problem and "damaged" in broken.problem
    assert broken.quantisation == "Q6_K"  # no header to read: the file name's
    coder = entries["acme/coder-GGUF/coder-Q4_K_M"]
    assert (coder.origin, coder.parameters) == ("huggingface", 64)


def test_missing_local_path_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file or folder"):
        list_models([tmp_path / "absent"], include_embedded=False)


def test_resolve_model_by_cached_name(hub: Path) -> None:
    model = resolve_model("acme/coder-GGUF/coder-Q4_K_M")
    assert model.name == "acme/coder-GGUF/coder-Q4_K_M"
    assert model.quantisation == "Q4_K_M"
    assert model.path.parent.name == "blobs"


def test_embedded_default_is_listed_first_and_resolvable_by_name() -> None:
    first = list_models()[0]
    assert (first.name, first.origin, first.quantisation) == (
        DEFAULT_MODEL_NAME,
        "embedded",
        "Q4_K_M",
    )
    assert first.parameters is not None and first.parameters > 200_000_000
    assert first.kind == "base"  # Gemma 3 270M pretrained: no chat template
    assert resolve_model(DEFAULT_MODEL_NAME).path == first.path

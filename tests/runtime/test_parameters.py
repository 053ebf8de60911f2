"""A model's parameter count for the run record: summed over the GGUF's tensor shapes."""

from pathlib import Path

from openjarvis.runtime.models import resolve_model
from openjarvis.runtime.parameters import model_parameters
from tests.runtime.gguf_files import write_gguf

__all__: list[str] = []


def test_the_count_sums_every_tensor_of_the_header(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "m.gguf",
        {"general.architecture": "llama"},
        {"token_embd.weight": (64, 1000), "blk.0.attn_norm.weight": (64,)},
    )
    assert model_parameters(path) == 64 * 1000 + 64


def test_the_embedded_model_has_about_268_million_parameters() -> None:
    count = model_parameters(resolve_model(None).path)
    assert count is not None and 250_000_000 < count < 300_000_000


def test_an_unreadable_header_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf")
    assert model_parameters(path) is None

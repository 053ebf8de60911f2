"""The GGUF header reader on files written here and on the real embedded model."""

from pathlib import Path

import pytest

from openjarvis.errors import UserError
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.models import resolve_model
from tests.runtime.gguf_files import write_gguf

LLAMA_METADATA: dict[str, object] = {
    "general.architecture": "llama",
    "general.name": "tiny",
    "general.file_type": 7,
    "llama.block_count": 2,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2,
    "llama.embedding_length": 64,
    "llama.rope.freq_base": 10000.0,
    "tokenizer.ggml.add_bos_token": True,
    "general.tags": ["a", "b"],
    "tokenizer.ggml.tokens": [f"t{i}" for i in range(1000)],
    "tokenizer.ggml.token_type": list(range(1000)),
}


def test_reads_keys_skips_long_arrays_and_counts_parameters(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "tiny.gguf", LLAMA_METADATA, {"embed": (64, 1000), "norm": (64,)}, 128
    )
    header = read_gguf_header(path)
    assert header.version == 3
    assert header.architecture == "llama"
    assert header.arch_value("block_count") == 2
    assert header.metadata["tokenizer.ggml.add_bos_token"] is True
    assert header.metadata["llama.rope.freq_base"] == pytest.approx(10000.0)
    assert header.metadata["general.tags"] == ["a", "b"]
    assert header.metadata["tokenizer.ggml.tokens"] is None
    assert header.array_lengths["tokenizer.ggml.tokens"] == 1000
    assert header.array_lengths["tokenizer.ggml.token_type"] == 1000
    assert header.tensors["embed"].shape == (64, 1000)
    assert header.parameter_count == 64 * 1000 + 64
    assert header.quantisation == "Q8_0"


def test_unknown_file_type_has_no_quantisation_name(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "odd.gguf", {"general.file_type": 999})
    assert read_gguf_header(path).quantisation is None


def test_truncated_header_is_a_user_error(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "cut.gguf", LLAMA_METADATA, {"embed": (64, 1000)})
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UserError, match=r"header of .* is damaged.*re-download"):
        read_gguf_header(path)


def test_embedded_model_header() -> None:
    header = read_gguf_header(resolve_model(None).path)
    assert header.architecture == "gemma3"
    assert header.quantisation == "Q4_K_M"
    assert 260_000_000 < header.parameter_count < 280_000_000  # "270M"
    assert header.arch_value("block_count") == 18


@pytest.mark.parametrize("alignment", [None, 64])
def test_each_tensor_is_where_ggufs_own_reader_finds_it(
    tmp_path: Path, alignment: int | None
) -> None:
    """A file written by the gguf package (F32, F16 and Q8_0 tensors, a long vocabulary): our
    table gives each tensor's type and data offset as gguf's reader does."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "written.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_token_list([f"t{i}" for i in range(300)])
    rng = np.random.default_rng(0)
    writer.add_tensor("norm", rng.standard_normal(48).astype(np.float32))
    writer.add_tensor("half", rng.standard_normal((3, 40)).astype(np.float16))
    q8 = gguf.quantize(
        rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0
    )
    writer.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = read_gguf_header(path).tensors
    theirs = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    assert set(ours) == set(theirs) == {"norm", "half", "q8"}
    for name, tensor in ours.items():
        assert tensor.offset == theirs[name].data_offset
        assert tensor.kind == int(theirs[name].tensor_type)
        assert tensor.shape == tuple(int(d) for d in theirs[name].shape)


def test_a_skipped_array_with_strings_longer_than_the_read_ahead(tmp_path: Path) -> None:
    strings = ["x" * (3 * 1024 * 1024) if i == 40 else f"s{i}" for i in range(100)]
    metadata = {"general.architecture": "llama", "long": strings, "after": 7}
    path = write_gguf(tmp_path / "long.gguf", metadata, {"w": (8, 2)})
    header = read_gguf_header(path)
    assert header.array_lengths["long"] == 100
    assert header.metadata["after"] == 7
    assert {n: t.shape for n, t in header.tensors.items()} == {"w": (8, 2)}

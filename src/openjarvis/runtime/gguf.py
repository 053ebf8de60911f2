"""A small reader of a GGUF file's header: its key-value metadata and its tensors' table.

Enough for the catalog (quantisation, parameter count), the roofline (layers, KV heads) and
the torch engine's loader (each tensor's type and place in the file); long arrays such as the
tokenizer's vocabulary are skipped, not loaded (gguf's own reader builds an array per
vocabulary entry: 22-29 s for the embedded model on a 2-core CPU).
"""

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from openjarvis.errors import UserError

__all__ = ["GgufHeader", "GgufTensor", "quantisation_name", "read_gguf_header"]

_MAGIC = b"GGUF"
_MAX_ARRAY_KEPT = 64  # longer arrays (vocabularies, merges) are skipped: only their length is kept
# Fixed-size value types of the format: type id -> struct code.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_DEFAULT_ALIGNMENT = 32  # of the tensor data, unless general.alignment says otherwise

# llama.cpp's `general.file_type` values (enum llama_ftype) and their conventional names.
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip

MetadataValue = int | float | bool | str | list[object] | None


@dataclass(frozen=True, slots=True)
class GgufTensor:
    shape: tuple[int, ...]  # as the file lists it: the fastest-varying dimension first
    kind: int  # ggml's type id (GGMLQuantizationType)
    offset: int  # of its data, from the start of the file


@dataclass(frozen=True, slots=True)
class GgufHeader:
    version: int
    metadata: dict[str, MetadataValue]  # long arrays are None; see array_lengths
    array_lengths: dict[str, int]
    tensors: dict[str, GgufTensor]

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    def arch_value(self, key: str) -> MetadataValue:
        """An architecture-specific key, e.g. arch_value("block_count") for llama.block_count."""
        return self.metadata.get(f"{self.architecture}.{key}")

    @property
    def parameter_count(self) -> int:
        count = 0
        for tensor in self.tensors.values():
            size = 1
            for dimension in tensor.shape:
                size *= dimension
            count += size
        return count

    @property
    def quantisation(self) -> str | None:
        file_type = self.metadata.get("general.file_type")
        return quantisation_name(file_type) if isinstance(file_type, int) else None


def quantisation_name(file_type: int) -> str | None:
    return _FILE_TYPES.get(file_type)


class _Reader:
    def __init__(self, handle: BinaryIO, file_bytes: int) -> None:
        self._handle = handle
        self._file_bytes = file_bytes

    def take(self, size: int) -> bytes:
        if size > self._file_bytes:  # a damaged length would otherwise ask for exabytes
            raise ValueError(f"a length of {size} bytes runs past the end of the file")
        data = self._handle.read(size)
        if len(data) != size:
            raise EOFError("the file ends inside its header")
        return data

    def unpack(self, code: str) -> int | float | bool:
        return struct.unpack("<" + code, self.take(struct.calcsize(code)))[0]

    def string(self) -> str:
        size = int(self.unpack("Q"))
        return self.take(size).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Skip `count` length-prefixed strings (a vocabulary: 262,144 for Gemma 3), reading
        ahead a megabyte at a time (the embedded model's header: 0.34 s with a read and a seek
        per string, 0.08 s so)."""
        handle, block, at = self._handle, b"", 0
        for _ in range(count):
            if at + 8 > len(block):
                block, at = block[at:] + handle.read(1 << 20), 0
                if len(block) < 8:
                    raise EOFError("the file ends inside its header")
            size = _U64.unpack_from(block, at)[0]
            if size > self._file_bytes:
                raise ValueError(f"a length of {size} bytes runs past the end of the file")
            at += 8 + size
            if at > len(block):  # a string longer than what was read ahead: seek past it
                handle.seek(at - len(block), 1)
                block, at = b"", 0
        handle.seek(at - len(block), 1)  # give back what was read ahead

    def value(self, kind: int) -> MetadataValue:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        raise ValueError(f"unknown GGUF value type {kind}")


def _read_array(reader: _Reader) -> tuple[list[object] | None, int]:
    kind, length = int(reader.unpack("I")), int(reader.unpack("Q"))
    if length <= _MAX_ARRAY_KEPT:
        return [reader.value(kind) for _ in range(length)], length
    if kind in _SCALARS:
        reader._handle.seek(struct.calcsize(_SCALARS[kind]) * length, 1)
    elif kind == _STRING:
        reader.skip_strings(length)
    else:
        raise ValueError(f"cannot skip a long GGUF array of type {kind}")
    return None, length


def read_gguf_header(path: Path) -> GgufHeader:
    """Parse the header of a GGUF (version 2 or 3) file; a broken header is a UserError."""
    try:
        with path.open("rb") as raw:
            reader = _Reader(raw, path.stat().st_size)
            if reader.take(4) != _MAGIC:
                raise ValueError("it does not start with 'GGUF'")
            version = int(reader.unpack("I"))
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version} is not supported (2 or 3 are)")
            tensor_count, kv_count = int(reader.unpack("Q")), int(reader.unpack("Q"))
            metadata: dict[str, MetadataValue] = {}
            array_lengths: dict[str, int] = {}
            for _ in range(kv_count):
                key, kind = reader.string(), int(reader.unpack("I"))
                if kind == _ARRAY:
                    metadata[key], array_lengths[key] = _read_array(reader)
                else:
                    metadata[key] = reader.value(kind)
            table: list[tuple[str, tuple[int, ...], int, int]] = []
            for _ in range(tensor_count):
                name = reader.string()
                dimensions = int(reader.unpack("I"))
                shape = tuple(int(reader.unpack("Q")) for _ in range(dimensions))
                table.append((name, shape, int(reader.unpack("I")), int(reader.unpack("Q"))))
            alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
            if not isinstance(alignment, int) or alignment <= 0:
                raise ValueError(f"general.alignment is {alignment!r}")
            data_start = -(-raw.tell() // alignment) * alignment
            tensors = {
                name: GgufTensor(shape, kind, data_start + offset)
                for name, shape, kind, offset in table
            }
    except OSError as error:
        raise UserError(f"cannot read model file {path}: {error.strerror}") from error
    except (EOFError, ValueError, UnicodeDecodeError, struct.error) as error:
        raise UserError(
            f"the GGUF header of {path} is damaged ({error}); re-download the model file"
        ) from error
    return GgufHeader(version, metadata, array_lengths, tensors)

"""Writes small GGUF files (header only) for tests of the header reader and the catalog.

Follows the GGUF v3 layout: magic, version, counts, key-value pairs, tensor infos.
"""

import struct
from pathlib import Path

__all__ = ["write_gguf"]

_CODES = {int: (4, "<I"), float: (6, "<f"), bool: (7, "<?")}


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(value: object) -> bytes:
    if isinstance(value, str):
        return struct.pack("<I", 8) + _string(value)
    if isinstance(value, list):
        if all(isinstance(item, str) for item in value):
            items = b"".join(_string(str(item)) for item in value)
            return struct.pack("<IIQ", 9, 8, len(value)) + items
        items = b"".join(struct.pack("<i", int(item)) for item in value)
        return struct.pack("<IIQ", 9, 5, len(value)) + items
    kind, code = _CODES[type(value)]
    return struct.pack("<I", kind) + struct.pack(code, value)


def write_gguf(
    path: Path,
    metadata: dict[str, object],
    tensors: dict[str, tuple[int, ...]] | None = None,
    padding_bytes: int = 0,
) -> Path:
    """A GGUF header with these keys and tensor shapes, then `padding_bytes` zero bytes."""
    tensors = tensors or {}
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for key, value in metadata.items():
        parts += [_string(key), _value(value)]
    for name, shape in tensors.items():
        parts += [_string(name), struct.pack("<I", len(shape))]
        parts += [struct.pack("<Q", dimension) for dimension in shape]
        parts.append(struct.pack("<IQ", 12, 0))  # tensor type Q4_K, data offset
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(parts) + b"\0" * padding_bytes)
    return path

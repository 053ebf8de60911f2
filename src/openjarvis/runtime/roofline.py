"""The roofline of decode, one model for every engine: the bytes a decode step reads per token
it makes, and the memory bandwidth it reads them at (measured once per host or device, cached).

MBU = decode rate x bytes read per token / bandwidth (docs/energy.md and the README's figures).
The torch engine measures a GPU's bandwidth itself (torch lives in runtime/torch) and caches it
here, beside the host's.
"""

import itertools
import json
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil

from openjarvis.paths import user_cache_dir
from openjarvis.runtime.gguf import GgufHeader

__all__ = [
    "Bandwidth",
    "bandwidth_cache_path",
    "cached_bandwidth",
    "decode_bytes_per_token",
    "host_bandwidth",
    "kv_bytes_per_position",
    "measure_bandwidth",
    "step_bytes_per_token",
]

_ARRAY_BYTES = 256 << 20  # per array: far beyond any CPU cache, so each copy goes to DRAM
_REPEATS = 5
_KV_BYTES_PER_VALUE = 2  # llama.cpp's default KV cache type is f16


@dataclass(frozen=True, slots=True)
class Bandwidth:
    bytes_per_s: float
    threads: int | None  # host threads that drew the most; None for a copy on a device
    method: str  # how it was measured, for reports
    measured_at: str  # ISO date-time, UTC

    @property
    def gb_per_s(self) -> float:
        return self.bytes_per_s / 1e9


def bandwidth_cache_path(device: str | None = None) -> Path:
    """The cache file of this host's bandwidth, or of one of its devices (by a stable id)."""
    name = socket.gethostname() if device is None else f"{socket.gethostname()}-{device}"
    return user_cache_dir() / "openjarvis" / f"bandwidth-{name}.json"


def measure_bandwidth(array_bytes: int = _ARRAY_BYTES, max_threads: int | None = None) -> Bandwidth:
    """Best of parallel numpy copies with 1..physical-cores threads, each on its own slice.

    A copy reads and writes each byte (2x its size, STREAM's convention). numpy releases the
    GIL while copying; which thread count draws the most depends on the machine, so try each.
    """
    source = np.ones(array_bytes // 8, dtype=np.float64)
    target = np.empty_like(source)
    np.copyto(target, source)  # first touch: page faults are not bandwidth
    best = (float("inf"), 1)
    for threads in range(1, (max_threads or psutil.cpu_count(logical=False) or 1) + 1):
        edges = np.linspace(0, source.size, threads + 1, dtype=np.int64)
        slices = [slice(int(a), int(b)) for a, b in itertools.pairwise(edges)]
        with ThreadPoolExecutor(threads) as pool:
            for _ in range(_REPEATS):
                start_s = time.perf_counter()
                list(pool.map(lambda part: np.copyto(target[part], source[part]), slices))
                best = min(best, (time.perf_counter() - start_s, threads))
    seconds, threads = best
    return Bandwidth(
        bytes_per_s=2 * source.nbytes / seconds,
        threads=threads,
        method=f"numpy copy of {source.nbytes >> 20} MiB, best of {_REPEATS} x thread counts",
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def host_bandwidth(cache_path: Path | None = None) -> Bandwidth:
    """This host's bandwidth from its cache file, measured (about a second) the first time."""
    return cached_bandwidth(cache_path or bandwidth_cache_path(), measure_bandwidth)


def cached_bandwidth(path: Path, measure: Callable[[], Bandwidth]) -> Bandwidth:
    """The bandwidth in `path`, or `measure()`'s, written there for the next process."""
    try:
        return Bandwidth(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass  # absent or unreadable: measure again and rewrite it
    bandwidth = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(bandwidth), indent=2))
    except OSError:
        pass  # an unwritable cache costs one measurement per process, nothing else
    return bandwidth


def step_bytes_per_token(
    weights_bytes: float, kv_bytes_per_context: float, context_tokens: float, batch: float = 1.0
) -> float:
    """Bytes a decode step reads per token it makes: the weights once per step, shared by the
    `batch` sequences in it, plus each sequence's keys and values over its context."""
    return (weights_bytes + batch * kv_bytes_per_context * context_tokens) / batch


def kv_bytes_per_position(
    layers: int, kv_heads: int, key_length: int, value_length: int, element_bytes: int
) -> int:
    """Bytes of keys and values one cached position holds over all layers."""
    return layers * kv_heads * (key_length + value_length) * element_bytes


def decode_bytes_per_token(
    header: GgufHeader, weights_bytes: int, context_tokens: float
) -> float | None:
    """Weights (the whole GGUF: a dense model reads every tensor once per token) plus the f16
    KV cache read at the mean context length; None when the header lacks the shapes."""
    layers = header.arch_value("block_count")
    kv_heads = header.arch_value("attention.head_count_kv")
    key_length = header.arch_value("attention.key_length")
    value_length = header.arch_value("attention.value_length")
    if not isinstance(key_length, int) or not isinstance(value_length, int):
        heads, width = (
            header.arch_value("attention.head_count"),
            header.arch_value("embedding_length"),
        )
        if not isinstance(heads, int) or not isinstance(width, int) or heads == 0:
            return None
        key_length = value_length = width // heads
    if not isinstance(layers, int) or not isinstance(kv_heads, int):
        return None
    kv_bytes = kv_bytes_per_position(
        layers, kv_heads, key_length, value_length, _KV_BYTES_PER_VALUE
    )
    # Every layer is counted over the whole context: an upper bound for sliding-window layers,
    # and small beside the weights at the context lengths of coding prompts.
    return step_bytes_per_token(weights_bytes, kv_bytes, context_tokens)

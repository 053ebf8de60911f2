"""The roofline of decode: this host's memory bandwidth (measured once, cached) and bytes/token.

MBU = decode rate x bytes read per token / bandwidth (docs/energy.md and the README's figures).
"""

import itertools
import json
import socket
import time
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
    "decode_bytes_per_token",
    "host_bandwidth",
    "measure_bandwidth",
]

_ARRAY_BYTES = 256 << 20  # per array: far beyond any CPU cache, so each copy goes to DRAM
_REPEATS = 5
_KV_BYTES_PER_VALUE = 2  # llama.cpp's default KV cache type is f16


@dataclass(frozen=True, slots=True)
class Bandwidth:
    bytes_per_s: float
    threads: int
    method: str  # how it was measured, for reports
    measured_at: str  # ISO date-time, UTC

    @property
    def gb_per_s(self) -> float:
        return self.bytes_per_s / 1e9


def bandwidth_cache_path() -> Path:
    return user_cache_dir() / "openjarvis" / f"bandwidth-{socket.gethostname()}.json"


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
    path = cache_path or bandwidth_cache_path()
    try:
        return Bandwidth(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass  # absent or unreadable: measure again and rewrite it
    bandwidth = measure_bandwidth()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(bandwidth), indent=2))
    except OSError:
        pass  # an unwritable cache costs one measurement per process, nothing else
    return bandwidth


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
    kv_per_token = layers * kv_heads * (key_length + value_length) * _KV_BYTES_PER_VALUE
    # Every layer is counted over the whole context: an upper bound for sliding-window layers,
    # and small beside the weights at the context lengths of coding prompts.
    return weights_bytes + kv_per_token * context_tokens

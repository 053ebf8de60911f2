"""The torch engine's inputs to the roofline of runtime/roofline.py: the bytes its decode reads
(weights and KV cache, from the model's config and dtype) and a GPU's copy bandwidth.

The bandwidth is measured once per device (two 1 GiB buffers, best of 5 copies) and cached
beside the host's, so an engine start neither repeats the copy nor needs 2 GiB free after the
KV cache has taken its share; a device is known by its UUID, so another GPU measures anew.
"""

import time

import torch

from openjarvis.runtime.roofline import (
    Bandwidth,
    bandwidth_cache_path,
    cached_bandwidth,
    kv_bytes_per_position,
    step_bytes_per_token,
)
from openjarvis.runtime.torch.model import ModelConfig

__all__ = ["DecodeRoofline", "device_bandwidth", "measure_device_bandwidth"]

_COPY_ELEMENTS = 1 << 29  # float16: 1 GiB per buffer, far beyond any GPU cache
_COPIES = 5


class DecodeRoofline:
    """Bytes one decode step reads, for a model in a dtype (on all GPUs together)."""

    def __init__(self, config: ModelConfig, dtype: str) -> None:
        self.config = config
        self.element_bytes = torch.finfo(getattr(torch, dtype)).bits // 8

    def weight_bytes(self) -> float:
        """Every weight but the embedding table, of which a step reads one row per token."""
        config = self.config
        weights = config.parameter_count - config.vocab_size * config.dim
        if config.tie_embeddings:
            weights += config.vocab_size * config.dim  # the head reads the shared table
        return float(weights * self.element_bytes)

    def kv_bytes(self, context: float) -> float:
        """Bytes of keys and values one sequence's attention reads at `context` tokens."""
        config = self.config
        per_position = kv_bytes_per_position(
            config.n_layers, config.n_kv_heads, config.head_dim, config.head_dim, self.element_bytes
        )
        return per_position * context

    def bytes_per_token(self, context: float, batch: float) -> float:
        """Per token made, at a mean `context` with `batch` sequences per step."""
        return step_bytes_per_token(self.weight_bytes(), self.kv_bytes(1), context, batch)


def device_bandwidth(device: torch.device) -> Bandwidth | None:
    """The GPU's copy bandwidth from its cache file, measured the first time; None on the CPU
    (not measured there, so the engine reports no MBU)."""
    if device.type != "cuda":
        return None
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    path = bandwidth_cache_path(f"cuda-{uuid}")
    return cached_bandwidth(path, lambda: measure_device_bandwidth(device))


def measure_device_bandwidth(device: torch.device) -> Bandwidth:
    """Bytes read + written per second by the best of 5 device-to-device copies of 1 GiB."""
    source = torch.empty(_COPY_ELEMENTS, dtype=torch.float16, device=device).normal_()
    target = torch.empty_like(source)
    best_s = float("inf")
    for _ in range(_COPIES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        best_s = min(best_s, start.elapsed_time(end) / 1e3)
    copied = source.numel() * source.element_size()
    del source, target
    torch.cuda.empty_cache()  # hand the 2 GiB back before the model and KV cache are built
    return Bandwidth(
        bytes_per_s=2 * copied / best_s,
        threads=None,
        method=f"torch copy of {copied >> 20} MiB on {torch.cuda.get_device_name(device)}, "
        f"best of {_COPIES}",
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )

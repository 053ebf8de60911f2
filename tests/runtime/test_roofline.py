"""The roofline: the measured bandwidth, its per-host cache, and the bytes a decode step reads."""

import json
from pathlib import Path

import pytest

from openjarvis.runtime import roofline
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.roofline import (
    decode_bytes_per_token,
    host_bandwidth,
    measure_bandwidth,
    step_bytes_per_token,
)
from tests.runtime.gguf_files import write_gguf


def test_measured_bandwidth_is_plausible() -> None:
    bandwidth = measure_bandwidth(array_bytes=64 << 20, max_threads=2)
    assert 0.5e9 < bandwidth.bytes_per_s < 2e12  # any machine from a phone to an HBM GPU host
    assert bandwidth.threads in (1, 2) and "numpy copy" in bandwidth.method


def test_bandwidth_is_measured_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "bw.json"
    calls: list[int] = []

    def counted(*args: object, **kwargs: object) -> roofline.Bandwidth:
        calls.append(1)
        return measure_bandwidth(array_bytes=16 << 20, max_threads=1)

    monkeypatch.setattr(roofline, "measure_bandwidth", counted)
    first = host_bandwidth(cache)
    assert host_bandwidth(cache) == first and len(calls) == 1
    assert json.loads(cache.read_text())["bytes_per_s"] == first.bytes_per_s
    cache.write_text("{not json")
    host_bandwidth(cache)
    assert len(calls) == 2  # a damaged cache is measured again, not trusted


def test_cache_file_is_per_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(roofline.socket, "gethostname", lambda: "bench-7")
    assert roofline.bandwidth_cache_path() == tmp_path / "openjarvis" / "bandwidth-bench-7.json"
    gpu = roofline.bandwidth_cache_path("GPU-1234")
    assert gpu == tmp_path / "openjarvis" / "bandwidth-bench-7-GPU-1234.json"


def test_a_batch_shares_the_weights_but_not_the_kv_cache() -> None:
    # 4 sequences at 100 positions of 10 bytes each: 1000 bytes of weights read once per step.
    assert step_bytes_per_token(1000, 10, 100, batch=4) == (1000 + 4 * 10 * 100) / 4
    assert step_bytes_per_token(1000, 10, 100) == 1000 + 10 * 100


def test_bytes_per_token_is_weights_plus_kv_read(tmp_path: Path) -> None:
    metadata = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "llama.attention.head_count": 8,
        "llama.attention.head_count_kv": 2,
        "llama.embedding_length": 512,  # head size 64
    }
    header = read_gguf_header(write_gguf(tmp_path / "m.gguf", metadata))
    kv_per_token = 2 * 2 * (64 + 64) * 2  # layers x kv heads x (key + value) x f16 bytes
    assert decode_bytes_per_token(header, 1_000_000, 100) == 1_000_000 + kv_per_token * 100


def test_bytes_per_token_unknown_without_shapes(tmp_path: Path) -> None:
    header = read_gguf_header(write_gguf(tmp_path / "m.gguf", {"general.architecture": "x"}))
    assert decode_bytes_per_token(header, 1_000_000, 100) is None

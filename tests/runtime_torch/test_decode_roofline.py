"""The torch engine's side of the roofline: the bytes its decode reads, from a model's config
and dtype, through the one formula of runtime/roofline.py, and no bandwidth on the CPU."""

import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch

from openjarvis.runtime.roofline import Bandwidth, step_bytes_per_token
from openjarvis.runtime.torch import decode_roofline
from openjarvis.runtime.torch.decode_roofline import (
    DecodeRoofline,
    device_bandwidth,
    measure_device_bandwidth,
)
from openjarvis.runtime.torch.model import config_for


def test_weights_leave_out_the_embedding_table_unless_the_head_shares_it() -> None:
    config = config_for("tiny-llama")  # untied: embedding and head are two tables
    assert not config.tie_embeddings
    roofline = DecodeRoofline(config, "bfloat16")
    table = config.vocab_size * config.dim
    assert roofline.weight_bytes() == (config.parameter_count - table) * 2
    tied = DecodeRoofline(config_for("tiny-qwen3"), "float32")
    assert tied.config.tie_embeddings
    assert tied.weight_bytes() == tied.config.parameter_count * 4


def test_kv_bytes_count_keys_and_values_of_every_layer() -> None:
    config = config_for("tiny-llama")  # 2 layers, 2 KV heads of 16
    roofline = DecodeRoofline(config, "float32")
    assert roofline.kv_bytes(10) == 10 * 2 * 2 * (16 + 16) * 4


def test_a_step_shares_its_weights_among_the_batch() -> None:
    roofline = DecodeRoofline(config_for("tiny-llama"), "bfloat16")
    one = roofline.bytes_per_token(context=100, batch=1)
    four = roofline.bytes_per_token(context=100, batch=4)
    assert one == roofline.weight_bytes() + roofline.kv_bytes(100)
    assert four == (roofline.weight_bytes() + 4 * roofline.kv_bytes(100)) / 4
    assert four == step_bytes_per_token(roofline.weight_bytes(), roofline.kv_bytes(1), 100, 4)


def test_the_cpu_has_no_measured_bandwidth() -> None:
    assert device_bandwidth(torch.device("cpu")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (-m gpu)")
def test_a_gpu_is_measured_once_then_read_from_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls: list[torch.device] = []

    def counted(device: "torch.device") -> Bandwidth:
        calls.append(device)
        return measure_device_bandwidth(device)

    monkeypatch.setattr(decode_roofline, "measure_device_bandwidth", counted)
    device = torch.device("cuda", 0)
    first = device_bandwidth(device)
    assert first is not None and len(calls) == 1
    assert 100e9 < first.bytes_per_s < 20e12  # any GPU with HBM or GDDR, read + written
    assert device_bandwidth(device) == first and len(calls) == 1
    assert [path.name for path in (tmp_path / "openjarvis").iterdir()] == [
        f"bandwidth-{socket.gethostname()}-cuda-{torch.cuda.get_device_properties(0).uuid}.json"
    ]

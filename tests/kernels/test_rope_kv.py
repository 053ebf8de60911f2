"""The kernel between the q/k/v product and attention (q/k norms, RoPE, the cache write) against
the torch functions the operator runs off the GPU: the same queries out, the same keys and
values in the same slots, every other slot as it was. On a GPU in bf16 (`-m gpu`), or on the CPU
under TRITON_INTERPRET=1 in float32 (the interpreter loads masked bf16 lanes as their raw
bits)."""

from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from openjarvis.runtime.torch import qkv as qkv_module
from tests.kernels.triton_device import KERNEL_MARKS, Tolerance, kernel_device

pytestmark = KERNEL_MARKS


def _torch_path(args: dict[str, Any], caches: tuple) -> "torch.Tensor":
    """The operator's own CPU path, on CPU copies of everything."""
    cpu = {name: value.cpu() if isinstance(value, torch.Tensor) else value
           for name, value in args.items()}  # fmt: skip
    return qkv_module.rope_write_kv(**cpu, k_cache=caches[0], v_cache=caches[1])


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "norm", "offset", "tokens"),
    [
        (4, 2, 16, False, 0.0, 1),  # Llama: no norms
        (32, 8, 128, False, 0.0, 37),  # the 8B's heads
        (4, 1, 256, True, 1.0, 5),  # Gemma 3: norms stored as w - 1
        (8, 2, 128, True, 0.0, 3),  # Qwen 3
        (3, 1, 80, False, 0.0, 4),  # a head that is not a power of two
    ],
)
def test_kernel_norms_rotates_and_places_as_the_torch_path_does(
    heads: int, kv_heads: int, head_dim: int, norm: bool, offset: float, tokens: int
) -> None:
    from openjarvis.kernels.rope_kv import rope_write_kv

    device = kernel_device()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    generator = torch.Generator().manual_seed(heads * 1000 + tokens)
    blocks, block_size, positions_max = 8, 16, 200
    width = (heads + 2 * kv_heads) * head_dim
    # The rows strided, as a slice of a wider product would be.
    qkv = torch.randn(tokens, width + 8, generator=generator)[:, :width].to(dtype)
    angles = torch.rand(positions_max, head_dim // 2, generator=generator) * 6
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1)
    sin = torch.cat((-angles.sin(), angles.sin()), dim=-1)
    weights = [torch.randn(head_dim, generator=generator).to(dtype) for _ in range(2)]
    # The torch path's keyword arguments: tensors, optional tensors, floats and an int
    args: dict[str, Any] = {
        "qkv": qkv,
        "positions": torch.randint(0, positions_max, (tokens,), generator=generator),
        "cos": cos,
        "sin": sin,
        "q_weight": weights[0] if norm else None,
        "k_weight": weights[1] if norm else None,
        "eps": 1e-6,
        "weight_offset": offset,
        "slots": torch.randperm(blocks * block_size, generator=generator)[:tokens],
        "heads": heads,
    }
    shape = (blocks, block_size, kv_heads, head_dim)
    before = [torch.randn(shape, generator=generator).to(dtype) for _ in range(2)]
    expected_caches = tuple(cache.clone() for cache in before)
    expected_q = _torch_path(args, expected_caches)

    on_device = {n: v.to(device) if isinstance(v, torch.Tensor) else v for n, v in args.items()}
    caches = [cache.clone().to(device) for cache in before]
    q = torch.empty(tokens, heads, head_dim, dtype=dtype, device=device)
    norms = (on_device["q_weight"], on_device["k_weight"]) if norm else None
    rows = [cache.view(-1, kv_heads, head_dim) for cache in caches]
    rope_write_kv(
        on_device["qkv"], on_device["positions"], on_device["cos"], on_device["sin"], norms,
        1e-6, offset, on_device["slots"], rows[0], rows[1], q,
    )  # fmt: skip
    # bf16 on the GPU: one rounding step apart at most (the kernel may fuse a multiply-add).
    tolerance: Tolerance = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(q.cpu(), expected_q, **tolerance)
    torch.testing.assert_close(caches[0].cpu(), expected_caches[0], **tolerance)
    torch.testing.assert_close(caches[1].cpu(), expected_caches[1], atol=0, rtol=0)
    untouched = torch.ones(blocks * block_size, dtype=torch.bool)
    untouched[args["slots"]] = False
    for cache, original in zip(caches, before, strict=True):
        kept = cache.cpu().view(-1, kv_heads, head_dim)[untouched]
        torch.testing.assert_close(
            kept, original.view(-1, kv_heads, head_dim)[untouched], atol=0, rtol=0
        )

"""The experimental one-launch product for a few rows (kernels/experimental/skinny_mm.py)
against torch's, with one slice of the reduction and with several (the last program of a tile
sums the slices and zeroes the tile's counter for the next call). On a GPU in bf16 (`-m gpu`), or
on the CPU under TRITON_INTERPRET=1 in float32."""

import pytest

pytest.importorskip("torch")

import torch

from tests.kernels.triton_device import KERNEL_MARKS, Tolerance, kernel_device

pytestmark = KERNEL_MARKS


@pytest.mark.parametrize(("m", "n", "k"), [(1, 70, 300), (17, 33, 129), (64, 100, 520)])
@pytest.mark.parametrize(("block_n", "block_k", "split_k"), [(32, 64, 1), (16, 64, 3)])
def test_product_matches_torch_and_leaves_its_counters_at_zero(
    m: int, n: int, k: int, block_n: int, block_k: int, split_k: int
) -> None:
    from openjarvis.kernels.experimental.skinny_mm import SkinnyConfig, skinny_mm, workspace_for

    device = kernel_device()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    generator = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=generator).to(device, dtype)
    w = torch.randn(n, k, generator=generator).to(device, dtype)
    config = SkinnyConfig(block_n, block_k, split_k, warps=4, stages=2)
    space = workspace_for(m, n, config, x.device)
    expected = x.float() @ w.float().T
    # bf16 inputs, or float32 summed in another order than torch sums them.
    tolerance: Tolerance = (
        {"atol": 0.1, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-3, "rtol": 1e-4}
    )
    for _ in range(2):  # the second call finds the counters the first left
        torch.testing.assert_close(skinny_mm(x, w, config, space).float(), expected, **tolerance)
        assert int(space[1].abs().sum()) == 0

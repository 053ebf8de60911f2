"""A decode step's weight products at a few rows: cuBLAS (torch's default), cuBLASLt (torch's
other BLAS backend) and our experimental one-launch Triton product
(`kernels/experimental/skinny_mm.py`) over a sweep of its launch shapes, side by side, on the
GPU, as achieved shares of the copy bandwidth.

Each product runs over `--layers` distinct weights of its shape (a step's layers, so that no
weight is read from L2), captured in one CUDA graph and replayed. The shapes are a preset's
(q/k/v stacked, gate and up stacked, as the model runs them). Every Triton result is checked
against cuBLAS's first (max relative difference printed).

`PYTHONPATH=src python3 benchmarks/skinny_products.py --preset llama-3-8b --rows 1,64`
"""

import argparse
import itertools
import json
from collections.abc import Callable, Iterator
from functools import partial

import torch
import torch.nn.functional as F
from attention_rows import step_ms
from torch_step import layer_products

from openjarvis.kernels.experimental.skinny_mm import SkinnyConfig, skinny_mm, workspace_for
from openjarvis.runtime.torch.decode_roofline import measure_device_bandwidth
from openjarvis.runtime.torch.model import config_for

__all__ = ["main"]


def configs() -> list[SkinnyConfig]:
    grid = itertools.product((32, 64), (128, 256), (1, 2, 4), (4,), (3, 5))
    return [SkinnyConfig(n, k, split, warps, stages) for n, k, split, warps, stages in grid]


def _skinny_next(
    x: torch.Tensor,
    layer: Iterator[torch.Tensor],
    config: SkinnyConfig,
    space: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """The Triton product on the next layer's weight."""
    return skinny_mm(x, next(layer), config, space)


def product_ms(call: Callable[[], torch.Tensor], layers: int, steps: int) -> float:
    return step_ms(call, layers, steps) / layers


def sweep(name: str, m: int, weights: list[torch.Tensor], bandwidth: float, steps: int) -> None:
    """Print each kernel's share of the copy bandwidth for one product at `m` rows."""
    n, k = weights[0].shape
    x = torch.randn(m, k, device=weights[0].device, dtype=torch.bfloat16)
    read = (n * k + m * k + m * n) * 2
    expected = F.linear(x, weights[0]).float()
    layer = itertools.cycle(weights)

    def report(
        label: str, call: Callable[[], torch.Tensor], check: torch.Tensor | None = None
    ) -> float:
        ms = product_ms(call, len(weights), steps)
        row = {"product": name, "rows": m, "kernel": label, "us": round(ms * 1e3, 1)}
        share = round(read / (ms / 1e3) / bandwidth, 3)
        row["share"] = share
        if check is not None:
            error = (check.float() - expected).abs().max() / expected.abs().max()
            row["max_rel_diff"] = float(f"{error.item():.2e}")
        print(json.dumps(row), flush=True)
        return share

    report("cublas", lambda: F.linear(x, next(layer)))
    torch.backends.cuda.preferred_blas_library("cublaslt")
    report("cublaslt", lambda: F.linear(x, next(layer)))
    torch.backends.cuda.preferred_blas_library("cublas")
    best: tuple[float, str] = (0.0, "")
    for config in configs():
        space = workspace_for(m, n, config, x.device)
        try:
            check = skinny_mm(x, weights[0], config, space)
            call = partial(_skinny_next, x, layer, config, space)
            share = report(f"triton {config}", call, check)
        except Exception as error:  # a launch shape the GPU cannot hold (shared memory)
            message = str(error).splitlines()[0][:120]
            print(json.dumps({"product": name, "rows": m, "kernel": str(config), "error": message}))
            continue
        best = max(best, (share, str(config)))
    print(json.dumps({"product": name, "rows": m, "best_triton": best[1], "share": best[0]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="llama-3-8b")
    parser.add_argument("--rows", default="1,64")
    parser.add_argument("--products", default="wqkv,wo,w13,w2,output")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    device = torch.device("cuda")
    bandwidth = measure_device_bandwidth(device).bytes_per_s
    print(
        json.dumps({"copy_bandwidth_tb_s": bandwidth / 1e12, "gpu": torch.cuda.get_device_name()})
    )
    for name in args.products.split(","):
        k, n = layer_products(config_for(args.preset))[name]
        layers = args.layers if name != "output" else 4
        weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(layers)]
        for m in (int(r) for r in args.rows.split(",")):
            sweep(name, m, weights, bandwidth, args.steps)
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

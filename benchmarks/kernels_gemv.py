"""The decode GEMV of a row-parallel layer fused with its all-reduce, against cuBLAS + NCCL and
cuBLAS + our peer all-reduce, at Llama-8B and Llama-70B decode shapes; correctness first.

Run with every GPU visible, NVLink multicast off:
`NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
 PYTHONPATH=src python3 benchmarks/kernels_gemv.py --out gemv.json`
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from gpu_ranks import join_group, run_on_every_gpu

__all__ = ["main"]

# name -> (output rows N, full input width K before the split): the two row-parallel layers.
SHAPES = {
    "8B attention-out": (4096, 4096),
    "8B MLP-down": (4096, 14336),
    "70B attention-out": (8192, 8192),
    "70B MLP-down": (8192, 28672),
}
GRAPH_CALLS = 20


class _Results(TypedDict):
    """What rank 0 writes to the JSON file."""

    world_size: int
    rows: list[dict[str, object]]
    errors: list[str]
    block_rows: NotRequired[int]


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    device = join_group(rank, world_size, port, timeout_s=150)
    group = dist.group.WORLD
    assert group is not None, "set by init_process_group"
    from openjarvis.kernels.all_reduce import graph_call_us
    from openjarvis.kernels.gemv_all_reduce import GemvAllReduce
    from openjarvis.kernels.peer_all_reduce import PeerAllReduce

    max_rows = max(n for n, _ in SHAPES.values())
    fused = GemvAllReduce(group, device, torch.bfloat16, max_rows)
    peer = PeerAllReduce(group, device, torch.bfloat16, max_rows * 2)
    results: _Results = {"world_size": world_size, "rows": [], "errors": []}
    results["block_rows"] = fused.block_n
    for name, (n, full_k) in SHAPES.items():
        k = full_k // world_size
        generator = torch.Generator(device=device).manual_seed(100 + rank)
        weight = (torch.randn(n, k, device=device, generator=generator) / k**0.5).to(torch.bfloat16)
        x = torch.randn(k, device=device, generator=generator).to(torch.bfloat16)
        reference = _reference(x, weight, group)

        def gemv(v: torch.Tensor, weight: torch.Tensor = weight) -> torch.Tensor:
            return F.linear(v, weight)

        def gemv_nccl(v: torch.Tensor, weight: torch.Tensor = weight) -> torch.Tensor:
            y = F.linear(v, weight)
            dist.all_reduce(y, group=group)
            return y

        def gemv_peer(v: torch.Tensor, weight: torch.Tensor = weight) -> torch.Tensor:
            return peer(F.linear(v, weight))

        def ours(v: torch.Tensor, weight: torch.Tensor = weight) -> torch.Tensor:
            return fused(v, weight)

        methods: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            "gemv_alone": gemv, "cublas_nccl": gemv_nccl, "cublas_peer": gemv_peer, "fused": ours,
        }  # fmt: skip
        row: dict[str, object] = {"shape": name, "n": n, "k_per_gpu": k}
        for method_name, method in methods.items():
            try:
                if method_name != "gemv_alone":
                    result = method(x).float()
                    error = (result - reference).norm() / reference.norm()
                    row[f"{method_name}_relative_error"] = float(error)
                row[f"{method_name}_us"] = graph_call_us(method, x, GRAPH_CALLS)
            except Exception as error:  # a failing method is reported, not fatal
                row[f"{method_name}_us"] = None
                results["errors"].append(f"{method_name} at {name}: {error!r}")
        # The fused results must agree on every rank (rank-order float32 sum).
        mine = fused(x, weight)
        everyone = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(everyone, mine, group=group)
        row["fused_identical_on_all_ranks"] = all(torch.equal(everyone[0], t) for t in everyone)
        bytes_read = n * k * 2
        if row.get("gemv_alone_us"):
            row["gemv_alone_tb_per_s"] = bytes_read / row["gemv_alone_us"] / 1e6  # type: ignore[operator]  # graph_call_us's float, checked first
        if row.get("fused_us"):
            row["fused_tb_per_s"] = bytes_read / row["fused_us"] / 1e6  # type: ignore[operator]  # graph_call_us's float, checked first
        results["rows"].append(row)
        if rank == 0:
            Path(out).write_text(json.dumps(results, indent=2))
    dist.barrier()
    dist.destroy_process_group()


def _reference(x: torch.Tensor, weight: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The float32 sum over ranks of weight_r @ x_r."""
    partial = weight.float() @ x.float()
    dist.all_reduce(partial, group=group)
    return partial


def _print(results: dict[str, Any]) -> None:  # the JSON file, as parsed
    print(f"world size {results['world_size']}; rows per program {results.get('block_rows')}")
    columns = ["gemv_alone_us", "cublas_nccl_us", "cublas_peer_us", "fused_us"]
    print(f"{'shape':<20}" + "".join(f"{c[:-3]:>14}" for c in columns) + "  best base/fused")
    for row in results.get("rows", []):
        cells = [row.get(c) for c in columns]
        text = "".join(f"{v:14.1f}" if v is not None else f"{'—':>14}" for v in cells)
        bases = [v for v in cells[1:3] if v is not None]
        ratio = min(bases) / cells[3] if bases and cells[3] else float("nan")
        errors = [row.get(f"{c[:-3]}_relative_error") for c in columns[1:]]
        error_text = " / ".join(f"{e:.1e}" if e is not None else "—" for e in errors)
        print(f"{row['shape']:<20}{text}  {ratio:6.2f}x   rel err {error_text}")
        print(f"{'':<20}identical on all ranks: {row.get('fused_identical_on_all_ranks')}")
    for error in results.get("errors", []):
        print("error:", error)


def main() -> None:
    run_on_every_gpu(_worker, _print, __doc__ or "", "gemv.json")


if __name__ == "__main__":
    main()

"""All-gather + GEMM and GEMM + reduce-scatter on the GPUs of one host (tensor parallelism's
column- and row-parallel layers): our copy-engine overlap against the GEMM alone, NCCL + cuBLAS
one after the other, and torch's fused symmetric-memory ops; correctness first.

Run with every GPU visible, NVLink multicast off:
`NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
 PYTHONPATH=src python3 benchmarks/kernels_overlap.py --out overlap.json`

Times are medians of a fixed number of calls timed with CUDA events, not triton's do_bench: that
picks its number of calls from a first estimate on each process, so two ranks could make
different numbers of collective calls and wait for each other forever. Each figure is the
slowest rank's median (tensor parallelism waits for it).
"""

import faulthandler
import json
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import torch
import torch.distributed as dist
from gpu_ranks import join_group, run_on_every_gpu

from openjarvis.kernels.experimental.overlap import AllGatherMatmul, MatmulReduceScatter

__all__ = ["main"]

TOKENS = 8192  # M: rows of the full activation
# All-gather + GEMM: the gathered A is [M, K]; B [K, N] is each GPU's weight shard.
GATHER_SHAPES = {"M8192 K4096 N3072": (4096, 3072), "M8192 K4096 N14336": (4096, 14336)}
GATHER_SHAPES["M8192 K8192 N28672"] = (8192, 28672)
# GEMM + reduce-scatter: the full K of the Llama layer (split over the GPUs), and N.
SCATTER_SHAPES = {"8B attention-out": (4096, 4096), "8B MLP-down": (14336, 4096)}
SCATTER_SHAPES |= {"70B attention-out": (8192, 8192), "70B MLP-down": (28672, 8192)}
# (chunks per peer, copy streams); the first is the module's default, reported as "ours".
VARIANTS = [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2)]
WARMUP = 5
REPEATS = 21
BACK_TO_BACK_CALLS = 6
SKEW_CYCLES = 2_000_000  # ~1 ms of one rank sleeping on its stream before some calls
SHAPE_TIMEOUT_S = 180


class _Results(TypedDict):
    """What rank 0 writes to the JSON file (after every shape)."""

    world_size: int
    variants: list[tuple[int, int]]
    rows: list[dict[str, object]]
    torch: NotRequired[str]
    device: NotRequired[str]
    errors: NotRequired[list[str]]


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    # A hang ends the run, with every thread's stack; re-armed for each shape.
    device = join_group(rank, world_size, port, SHAPE_TIMEOUT_S)
    group = dist.group.WORLD
    assert group is not None, "set by init_process_group"
    errors: list[str] = []
    results: _Results = {"world_size": world_size, "variants": VARIANTS, "rows": []}
    results |= {"torch": torch.__version__, "device": torch.cuda.get_device_name(device)}
    max_k = max(k for k, _ in GATHER_SHAPES.values())
    max_n = max(n for _, n in SCATTER_SHAPES.values())
    gathers = {
        variant: AllGatherMatmul(group, device, torch.bfloat16, TOKENS, max_k, *variant)
        for variant in VARIANTS
    }
    scatters = {
        variant: MatmulReduceScatter(group, device, torch.bfloat16, TOKENS, max_n, *variant)
        for variant in VARIANTS
    }
    torch_ready = _enable_torch_fused(group, errors)
    for name, (k, n) in GATHER_SHAPES.items():
        faulthandler.dump_traceback_later(SHAPE_TIMEOUT_S, exit=True)
        row = _gather_row(name, k, n, gathers, group, device, rank, torch_ready, errors)
        results["rows"].append(row)
        _write(results, errors, rank, out)
    for name, (k, n) in SCATTER_SHAPES.items():
        faulthandler.dump_traceback_later(SHAPE_TIMEOUT_S, exit=True)
        k_per_rank = k // world_size
        row = _scatter_row(name, k_per_rank, n, scatters, group, device, rank, torch_ready, errors)
        results["rows"].append(row)
        _write(results, errors, rank, out)
    faulthandler.cancel_dump_traceback_later()
    dist.barrier()
    dist.destroy_process_group()


def _gather_row(
    name: str, k: int, n: int, ops: dict[tuple[int, int], AllGatherMatmul],
    group: dist.ProcessGroup, device: torch.device, rank: int, torch_ready: bool,
    errors: list[str],
) -> dict[str, object]:  # fmt: skip
    world_size = dist.get_world_size(group)
    rows = TOKENS // world_size
    a_shard = _random((rows, k), device, seed=rank)
    b = _random((k, n), device, seed=100 + rank)
    gathered = torch.empty(TOKENS, k, dtype=a_shard.dtype, device=device)
    dist.all_gather_into_tensor(gathered, a_shard, group=group)
    reference = gathered.float() @ b.float()
    default = ops[VARIANTS[0]]
    methods: dict[str, Callable[[], torch.Tensor]] = {
        "gemm": lambda: gathered @ b,
        "baseline": lambda: default.baseline(a_shard, b),
    }
    methods |= {_variant_name(v): partial(op, a_shard, b) for v, op in ops.items()}
    if torch_ready:
        methods["torch_fused"] = lambda: torch.ops.symm_mem.fused_all_gather_matmul(
            a_shard, [b], 0, group.group_name, return_A=False
        )[1][0]
    row: dict[str, object] = {"op": "all-gather + GEMM", "shape": name, "m": TOKENS, "k": k}
    row["n"] = n
    calls = [
        (_random((rows, k), device, 1000 * call + rank), b) for call in range(BACK_TO_BACK_CALLS)
    ]
    row["back_to_back"] = _back_to_back(default, calls, rank)
    del calls
    _measure(row, methods, reference, name, errors)
    return row


def _scatter_row(
    name: str, k_per_rank: int, n: int, ops: dict[tuple[int, int], MatmulReduceScatter],
    group: dist.ProcessGroup, device: torch.device, rank: int, torch_ready: bool,
    errors: list[str],
) -> dict[str, object]:  # fmt: skip
    world_size = dist.get_world_size(group)
    rows = TOKENS // world_size
    a = _random((TOKENS, k_per_rank), device, seed=rank)
    b = _random((k_per_rank, n), device, seed=100 + rank)
    # The reference from every rank's inputs: the full A [M, K] and B [K, N], our rows of A @ B.
    every_a = torch.empty(world_size * TOKENS, k_per_rank, dtype=a.dtype, device=device)
    dist.all_gather_into_tensor(every_a, a, group=group)
    full_a = every_a.view(world_size, TOKENS, k_per_rank).permute(1, 0, 2).reshape(TOKENS, -1)
    full_b = torch.empty(world_size * k_per_rank, n, dtype=b.dtype, device=device)
    dist.all_gather_into_tensor(full_b, b, group=group)
    reference = full_a[rank * rows : (rank + 1) * rows].float() @ full_b.float()
    del every_a, full_a, full_b
    default = ops[VARIANTS[0]]
    methods: dict[str, Callable[[], torch.Tensor]] = {
        "gemm": lambda: a @ b,
        "baseline": lambda: default.baseline(a, b),
    }
    methods |= {_variant_name(v): partial(op, a, b) for v, op in ops.items()}
    if torch_ready:
        methods["torch_fused"] = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(
            a, b, "sum", 0, group.group_name
        )
    row: dict[str, object] = {"op": "GEMM + reduce-scatter", "shape": name, "m": TOKENS}
    row |= {"k": k_per_rank * world_size, "k_per_rank": k_per_rank, "n": n}
    shape = (TOKENS, k_per_rank)
    calls = [(_random(shape, device, 1000 * call + rank), b) for call in range(BACK_TO_BACK_CALLS)]
    row["back_to_back"] = _back_to_back(default, calls, rank)
    del calls
    _measure(row, methods, reference, name, errors)
    return row


def _measure(
    row: dict[str, object], methods: dict[str, Callable[[], torch.Tensor]],
    reference: torch.Tensor, shape: str, errors: list[str],
) -> None:  # fmt: skip
    """Relative error of each method against the float32 reference (the GEMM alone of the
    reduce-scatter makes a partial sum, not comparable), then its median time; the slowest
    rank's time is kept."""
    times = []
    for name, method in methods.items():
        error_name, time_name = f"{name}_relative_error", f"{name}_ms"
        row[error_name] = row[time_name] = None
        try:
            result = method()
            if result.shape == reference.shape:
                difference = (result.float() - reference).norm() / reference.norm()
                row[error_name] = float(difference)
            del result
            times.append(_median_ms(method))
        except Exception as error:  # a failing method is reported, not fatal
            errors.append(f"{name} at {shape}: {error!r}")
            traceback.print_exc()
            times.append(-1.0)
    slowest = torch.tensor(times, dtype=torch.float64, device=reference.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    for name, value in zip(methods, slowest.tolist(), strict=True):
        row[f"{name}_ms"] = value if value >= 0 else None


def _median_ms(method: Callable[[], object]) -> float:
    for _ in range(WARMUP):
        method()
    torch.cuda.synchronize()
    dist.barrier()
    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(REPEATS)
    ]
    for start, end in pairs:
        start.record()
        method()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in pairs)
    return times[len(times) // 2]


def _back_to_back(
    op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: list[tuple[torch.Tensor, torch.Tensor]], rank: int,
) -> dict[str, object]:  # fmt: skip
    """Calls with different inputs issued back to back while the ranks drift apart (one rank's
    stream sleeps before some calls) must give exactly what the same calls give one at a time:
    the buffer halves and the barrier keep a fast rank from overwriting what a slow one reads."""
    expected = []
    for a, b in inputs:
        expected.append(op(a, b))
        torch.cuda.synchronize()
        dist.barrier()
    outputs = []
    for call, (a, b) in enumerate(inputs):
        if call % 3 == rank % 3:
            torch.cuda._sleep(SKEW_CYCLES)
        outputs.append(op(a, b))
    torch.cuda.synchronize()
    mismatches = sum(not torch.equal(x, y) for x, y in zip(outputs, expected, strict=True))
    worst = max(
        float((x.float() - y.float()).norm() / y.float().norm())
        for x, y in zip(outputs, expected, strict=True)
    )
    return {"calls": len(inputs), "mismatches": mismatches, "worst_relative_difference": worst}


def _enable_torch_fused(group: dist.ProcessGroup, errors: list[str]) -> bool:
    try:
        import torch.distributed._symmetric_memory as symmetric_memory

        if hasattr(symmetric_memory, "enable_symm_mem_for_group"):  # needed before torch 2.10
            symmetric_memory.enable_symm_mem_for_group(group.group_name)
        return hasattr(torch.ops.symm_mem, "fused_all_gather_matmul")
    except Exception as error:
        errors.append(f"torch symmetric memory: {error!r}")
        return False


def _random(shape: tuple[int, int], device: torch.device, seed: int) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(*shape, device=device, generator=generator).to(torch.bfloat16)


def _variant_name(variant: tuple[int, int]) -> str:
    chunks, streams = variant
    return "ours" if variant == VARIANTS[0] else f"ours_c{chunks}_s{streams}"


def _write(results: _Results, errors: list[str], rank: int, out: str) -> None:
    """After every shape, so that a later hang still leaves the rows measured so far."""
    everyone: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, errors)
    results["errors"] = [
        f"rank {r}: {e}" for r, theirs in enumerate(everyone) for e in theirs or []
    ]
    if rank == 0:
        Path(out).write_text(json.dumps(results, indent=2))


def _print(results: dict[str, Any]) -> None:  # the JSON file, as parsed
    print(f"world size {results['world_size']}; times: slowest rank's median, ms")
    header = f"{'op':<22} {'shape':<19} {'gemm':>7} {'base':>7} {'ours':>7} {'torch':>7}"
    header += f" {'ours/gemm':>9} {'base/ours':>9}   rel err ours / base / torch"
    print(header)
    for row in results["rows"]:
        times = [row.get(f"{name}_ms") for name in ("gemm", "baseline", "ours", "torch_fused")]
        cells = " ".join(f"{t:7.3f}" if t is not None else f"{'—':>7}" for t in times)
        gemm, base, ours, _ = times
        over_gemm = f"{ours / gemm:9.2f}" if ours and gemm else f"{'—':>9}"
        speedup = f"{base / ours:8.2f}x" if ours and base else f"{'—':>9}"
        errors = [row.get(f"{name}_relative_error") for name in ("ours", "baseline", "torch_fused")]
        text = " / ".join(f"{e:.1e}" if e is not None else "—" for e in errors)
        print(f"{row['op']:<22} {row['shape']:<19} {cells} {over_gemm} {speedup}   {text}")
    print("variants (chunks per peer, copy streams), ms; back-to-back check with drifting ranks:")
    for row in results["rows"]:
        variant_cells = []
        for chunks, streams in results["variants"]:
            value = row.get(f"{_variant_name((chunks, streams))}_ms")
            variant_cells.append(f"c{chunks}s{streams} " + (f"{value:.3f}" if value else "—"))
        variant_errors = [
            value
            for key, value in row.items()
            if key.startswith("ours") and key.endswith("_relative_error") and value is not None
        ]
        worst = f"{max(variant_errors):.1e}" if variant_errors else "—"
        print(f"  {row['shape']:<19} {'  '.join(variant_cells)}   worst rel err {worst}")
        print(f"  {'':<19} back-to-back: {row.get('back_to_back')}")
    for error in results.get("errors", []):
        print("error:", error)


def main() -> None:
    run_on_every_gpu(_worker, _print, __doc__ or "", "overlap.json")


if __name__ == "__main__":
    main()

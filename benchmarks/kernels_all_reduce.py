"""All-reduce on the GPUs of one host: our one-shot peer kernel against NCCL and torch's
symmetric-memory one-shot and two-shot, for 8 KB to 4 MB of bf16; correctness first.

Run with every GPU visible, NVLink multicast off:
`NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
 PYTHONPATH=src python3 benchmarks/kernels_all_reduce.py --out all_reduce.json`
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import torch
import torch.distributed as dist
from gpu_ranks import join_group, run_on_every_gpu

__all__ = ["main"]

SIZES_BYTES = [8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10]
SIZES_BYTES += [1 << 20, 2 << 20, 4 << 20]
CHECK_ELEMENTS = [1000, 4096, 12_345, 262_144, 2 << 20]  # odd sizes exercise the masks
CALLS = 20  # back-to-back calls per timed round
GRAPH_CALLS = 20  # calls captured in one CUDA graph


class _Results(TypedDict):
    """What rank 0 writes to the JSON file."""

    world_size: int
    errors: list[str]
    checks: NotRequired[list[dict[str, object]]]
    graph_checks: NotRequired[dict[str, object]]
    rows: NotRequired[list[dict[str, object]]]


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    device = join_group(rank, world_size, port, timeout_s=100)  # a hung kernel ends the run
    group = dist.group.WORLD
    assert group is not None, "set by init_process_group"
    results: _Results = {"world_size": world_size, "errors": []}
    from openjarvis.kernels.all_reduce import graph_call_us, median_call_us
    from openjarvis.kernels.peer_all_reduce import PeerAllReduce

    peer = PeerAllReduce(group, device, torch.bfloat16, max(SIZES_BYTES))
    results["checks"] = _checks(peer, group, device, rank)
    results["graph_checks"] = _graph_checks(peer, group, device, rank)
    torch_ops = _torch_symmetric_ops(group, device, max(SIZES_BYTES), results)

    def nccl(x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=group)
        return x

    rows = []
    for size in SIZES_BYTES:
        source = torch.randn(size // 2, device=device).to(torch.bfloat16)
        row: dict[str, object] = {"bytes": size}
        methods: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"nccl": nccl, "ours": peer}
        methods.update({name: op(size) for name, op in torch_ops.items()})
        for name, method in methods.items():
            try:
                row[f"{name}_us"] = median_call_us(method, source, CALLS)
            except Exception as error:  # a baseline that fails is reported, not fatal
                row[f"{name}_us"] = None
                results["errors"].append(f"{name} at {size}: {error!r}")
        for name in methods:
            try:
                row[f"{name}_graph_us"] = graph_call_us(methods[name], source, GRAPH_CALLS)
            except Exception as error:
                row[f"{name}_graph_us"] = None
                results["errors"].append(f"{name} graph at {size}: {error!r}")
        rows.append(row)
    # Ranks report their own timings; rank 0's table is printed (ranks agree within noise).
    results["rows"] = rows
    if rank == 0:
        Path(out).write_text(json.dumps(results, indent=2))
    dist.barrier()
    dist.destroy_process_group()


def _checks(
    peer: Callable[[torch.Tensor], torch.Tensor], group: dist.ProcessGroup, device: torch.device,
    rank: int,
) -> list[dict[str, object]]:  # fmt: skip
    """Fresh random inputs per check: relative error of ours and NCCL against a float32 sum,
    and whether every rank got bit-identical results."""
    rows: list[dict[str, object]] = []
    for trial, numel in enumerate(CHECK_ELEMENTS * 3):
        generator = torch.Generator(device=device).manual_seed(1000 * trial + rank)
        x = torch.randn(numel, device=device, generator=generator).to(torch.bfloat16)
        everyone = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(everyone, x, group=group)
        reference = torch.stack([t.float() for t in everyone]).sum(0)
        ours = peer(x.clone())
        nccl = x.clone()
        dist.all_reduce(nccl, group=group)
        mine = [torch.empty_like(ours) for _ in everyone]
        dist.all_gather(mine, ours, group=group)
        rows.append(
            {
                "elements": numel,
                "ours_relative_error": float((ours.float() - reference).norm() / reference.norm()),
                "nccl_relative_error": float((nccl.float() - reference).norm() / reference.norm()),
                "ours_identical_on_all_ranks": all(torch.equal(mine[0], t) for t in mine),
                "ours_finite": bool(torch.isfinite(ours).all()),
            }
        )
    return rows


def _graph_checks(
    peer: Callable[[torch.Tensor], torch.Tensor], group: dist.ProcessGroup, device: torch.device,
    rank: int, replays: int = 50,
) -> dict[str, object]:  # fmt: skip
    """Messages of three sizes (so that different numbers of programs take part) reduced in
    turn inside one CUDA graph, replayed many times: every replay must give the exact sum that
    the same kernel gives eagerly, on every rank (the per-program call counts and the buffer
    halves must stay in step across replays)."""
    sizes = (4096, 300_000, 2048)
    sources = []
    for index, numel in enumerate(sizes):
        generator = torch.Generator(device=device).manual_seed(7 * index + rank)
        sources.append(torch.randn(numel, device=device, generator=generator).to(torch.bfloat16))
    expected = [peer(source.clone()) for source in sources]
    work = [source.clone() for source in sources]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for target, source in zip(work, sources, strict=True):
            target.copy_(source)
            peer(target)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for target, source in zip(work, sources, strict=True):
            target.copy_(source)
            peer(target)
    mismatches = 0
    for _ in range(replays):
        graph.replay()
        mismatches += sum(not torch.equal(a, b) for a, b in zip(work, expected, strict=True))
    torch.cuda.synchronize()
    return {"replays": replays, "messages_per_replay": len(sizes), "mismatches": mismatches}


def _torch_symmetric_ops(
    group: dist.ProcessGroup, device: torch.device, max_bytes: int, results: _Results
) -> dict[str, Callable[[int], Callable[[torch.Tensor], torch.Tensor]]]:
    """torch's own symmetric-memory all-reduces; their input must already live in a
    symmetric buffer, so each call copies the message in first (as a model would)."""
    try:
        import torch.distributed._symmetric_memory as symmetric_memory

        buffer = symmetric_memory.empty(max_bytes // 2, dtype=torch.bfloat16, device=device)
        symmetric_memory.rendezvous(buffer, group.group_name)
    except Exception as error:
        results["errors"].append(f"torch symmetric memory: {error!r}")
        return {}
    name = group.group_name

    def one_shot(size: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def call(x: torch.Tensor) -> torch.Tensor:
            staged = buffer[: x.numel()]
            staged.copy_(x)
            return torch.ops.symm_mem.one_shot_all_reduce(staged, "sum", name)

        return call

    def two_shot(size: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def call(x: torch.Tensor) -> torch.Tensor:
            staged = buffer[: x.numel()]
            staged.copy_(x)
            torch.ops.symm_mem.two_shot_all_reduce_(staged, "sum", name)
            return staged

        return call

    return {"torch_one_shot": one_shot, "torch_two_shot": two_shot}


def _print(results: dict[str, Any]) -> None:  # the JSON file, as parsed
    checks = results.get("checks", [])
    worst = max((c["ours_relative_error"] for c in checks), default=float("nan"))
    worst_nccl = max((c["nccl_relative_error"] for c in checks), default=float("nan"))
    identical = all(c["ours_identical_on_all_ranks"] for c in checks)
    print(f"checks: {len(checks)}; worst relative error ours {worst:.2e}, NCCL {worst_nccl:.2e}")
    print(f"ours bit-identical on all ranks: {identical}")
    print(f"graph replays with mixed sizes: {results.get('graph_checks')}")
    columns = ["nccl_us", "ours_us", "torch_one_shot_us", "torch_two_shot_us"]
    columns += ["nccl_graph_us", "ours_graph_us", "torch_one_shot_graph_us"]
    columns += ["torch_two_shot_graph_us"]
    print("bytes      " + " ".join(f"{c[:-3]:>14}" for c in columns) + "   nccl/ours  graph")
    for row in results.get("rows", []):
        cells = [row.get(c) for c in columns]
        text = " ".join(f"{v:14.1f}" if v is not None else f"{'—':>14}" for v in cells)
        ratio = row["nccl_us"] / row["ours_us"] if row.get("ours_us") else float("nan")
        graph = (
            row["nccl_graph_us"] / row["ours_graph_us"]
            if row.get("ours_graph_us")
            else float("nan")
        )
        print(f"{row['bytes']:<10} {text} {ratio:10.2f}x {graph:6.2f}x")
    for error in results.get("errors", []):
        print("error:", error)


def main() -> None:
    run_on_every_gpu(_worker, _print, __doc__ or "", "all_reduce.json")


if __name__ == "__main__":
    main()

"""The parts of the overlapped tensor-parallel GEMMs that run anywhere: the chunk and peer
schedule, the argument checks, and the collective fallback on the CPU with two gloo ranks (the
copy-engine paths run in benchmarks/kernels_overlap.py on the GPU machine)."""

import threading
from collections.abc import Iterator
from contextlib import nullcontext
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing

from openjarvis.kernels.experimental import overlap
from openjarvis.kernels.experimental.overlap import (
    AllGatherMatmul,
    Chunk,
    MatmulReduceScatter,
    all_gather_matmul_baseline,
    check_operands,
    matmul_reduce_scatter_baseline,
    peer_chunks,
    peer_order,
    split_rows,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_peer_order_gives_every_gpu_one_sender_per_step(world_size: int) -> None:
    orders = [peer_order(rank, world_size) for rank in range(world_size)]
    for rank, order in enumerate(orders):
        assert order[:1] == ((rank + 1) % world_size,)[: len(order)]
        assert sorted(order) == [peer for peer in range(world_size) if peer != rank]
    for step in range(world_size - 1):
        assert sorted(order[step] for order in orders) == list(range(world_size))


def test_peer_order_refuses_a_rank_outside_the_group() -> None:
    with pytest.raises(ValueError, match="rank 2 is outside a group of 2"):
        peer_order(2, 2)


@pytest.mark.parametrize(
    ("rows", "chunks", "spans"),
    [
        (4096, 4, ((0, 1024), (1024, 2048), (2048, 3072), (3072, 4096))),
        (4096, 3, ((0, 1408), (1408, 2816), (2816, 4096))),
        (300, 4, ((0, 128), (128, 256), (256, 300))),
        (100, 2, ((0, 100),)),
        (4096, 1, ((0, 4096),)),
    ],
)
def test_split_rows_cuts_whole_tiles(
    rows: int, chunks: int, spans: tuple[tuple[int, int], ...]
) -> None:
    assert split_rows(rows, chunks) == spans


@pytest.mark.parametrize("rows", [1, 127, 128, 129, 1000, 4096, 4097])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 7])
def test_split_rows_covers_every_row_once(rows: int, chunks: int) -> None:
    spans = split_rows(rows, chunks, align=128)
    assert spans[0][0] == 0 and spans[-1][1] == rows
    assert all(stop == start for (_, stop), (start, _) in pairwise(spans))
    assert all(start < stop for start, stop in spans)
    assert all(start % 128 == 0 for start, _ in spans)
    assert len(spans) == min(chunks, -(-rows // 128))


@pytest.mark.parametrize(("rows", "chunks"), [(0, 2), (8, 0)])
def test_split_rows_refuses_nothing_to_split(rows: int, chunks: int) -> None:
    with pytest.raises(ValueError, match="need rows, chunks and align >= 1"):
        split_rows(rows, chunks)


def test_peer_chunks_follow_peer_order_in_global_rows() -> None:
    assert peer_chunks(1, 4, 256, 2) == (
        Chunk(2, 512, 640), Chunk(2, 640, 768),
        Chunk(3, 768, 896), Chunk(3, 896, 1024),
        Chunk(0, 0, 128), Chunk(0, 128, 256),
    )  # fmt: skip
    assert peer_chunks(0, 1, 256, 2) == ()


@pytest.mark.parametrize(
    ("a", "b", "error"),
    [
        (torch.zeros(4, 8, 2), torch.zeros(8, 3), "must be matrices"),
        (torch.zeros(4, 8), torch.zeros(7, 3), "A has 8 columns but B has 7 rows"),
        (torch.zeros(4, 8), torch.zeros(8, 3, dtype=torch.float64), "B is torch.float64"),
        (torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, 3), "A is torch.bfloat16"),
        (torch.zeros(4, 8, device="meta"), torch.zeros(8, 3), "A is on meta"),
    ],
)
def test_check_operands_refuses_what_the_gemm_cannot_take(
    a: "torch.Tensor", b: "torch.Tensor", error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        check_operands(a, b, CPU, torch.float32)


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator["dist.ProcessGroup"]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    group = dist.group.WORLD
    assert group is not None
    try:
        yield group
    finally:
        dist.destroy_process_group()


def test_ops_refuse_bad_settings_and_oversized_calls(one_rank: "dist.ProcessGroup") -> None:
    with pytest.raises(ValueError, match="chunks_per_peer must be at least 1; got 0"):
        AllGatherMatmul(one_rank, CPU, torch.float32, 64, 16, chunks_per_peer=0)
    with pytest.raises(ValueError, match="max_n must be at least 1"):
        MatmulReduceScatter(one_rank, CPU, torch.float32, 64, 0)
    gather = AllGatherMatmul(one_rank, CPU, torch.float32, max_tokens=64, max_k=16)
    assert gather.why_not_overlapped == "not on a GPU"
    with pytest.raises(ValueError, match="max_tokens=64, max_k=16"):
        gather(torch.zeros(65, 16), torch.zeros(16, 4))
    with pytest.raises(ValueError, match="max_tokens=64, max_k=16"):
        gather(torch.zeros(8, 17), torch.zeros(17, 4))
    scatter = MatmulReduceScatter(one_rank, CPU, torch.float32, max_tokens=64, max_n=16)
    with pytest.raises(ValueError, match="max_tokens=64, max_n=16"):
        scatter(torch.zeros(8, 4), torch.zeros(4, 17))


def _inputs(rank: int, shape: tuple[int, int]) -> "torch.Tensor":
    return torch.randn(*shape, generator=torch.Generator().manual_seed(rank))


def _two_ranks(rank: int, store: str) -> None:
    """Each rank rebuilds every rank's inputs from their seeds, so its reference needs no
    collective; both the baseline functions and the ops (falling back on the CPU) must match."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        group = dist.group.WORLD
        assert group is not None
        shards = [_inputs(peer, (3, 8)) for peer in range(2)]
        b = _inputs(10 + rank, (8, 5))
        expected = torch.cat(shards) @ b
        gather = AllGatherMatmul(group, CPU, torch.float32, max_tokens=8, max_k=8)
        for result in (all_gather_matmul_baseline(shards[rank], b, group), gather(shards[rank], b)):
            torch.testing.assert_close(result, expected)
        a = [_inputs(20 + peer, (6, 4)) for peer in range(2)]
        bs = [_inputs(30 + peer, (4, 5)) for peer in range(2)]
        expected = (a[0] @ bs[0] + a[1] @ bs[1])[3 * rank : 3 * rank + 3]
        scatter = MatmulReduceScatter(group, CPU, torch.float32, max_tokens=8, max_n=8)
        baseline = matmul_reduce_scatter_baseline(a[rank], bs[rank], group)
        for result in (baseline, scatter(a[rank], bs[rank])):
            torch.testing.assert_close(result, expected)
        with pytest.raises(ValueError, match="7 rows do not split evenly over 2 ranks"):
            scatter(torch.zeros(7, 4), bs[rank])
    finally:
        dist.destroy_process_group()


def test_baselines_and_cpu_fallback_agree_with_the_plain_product_on_two_ranks(
    tmp_path: Path,
) -> None:
    multiprocessing.spawn(_two_ranks, args=(str(tmp_path / "store"),), nprocs=2)


class _Stream:
    """A CUDA stream or event on the CPU: work runs as it is issued, so order is program order."""

    def wait_stream(self, other: object) -> None: ...

    def wait_event(self, event: object) -> None: ...

    def record(self, stream: object = None) -> None: ...


def test_overlapped_paths_move_the_right_rows_on_two_emulated_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both copy-engine paths, run by two threads as two ranks over shared CPU tensors. Faked
    only where the hardware is (symmetric memory: shared tensors and a thread barrier; streams
    and events: program order); every index, offset and buffer half is the real code's. Buffers
    start as NaN, so a row read before it was written shows; ragged chunks, two copy streams and
    two calls (both halves) each."""
    world_size = 2
    meeting = threading.Barrier(world_size, timeout=20)
    shared: dict[int, tuple[torch.Tensor, ...]] = {}

    class EmulatedPeerBuffers(overlap._PeerBuffers):
        def __init__(
            self, group: SimpleNamespace, device: torch.device, dtype: torch.dtype,
            half_elements: int, streams: int, events: int,
        ) -> None:  # fmt: skip
            group.built += 1  # the n-th op built on each rank shares memory with its peers' n-th
            self.flat = shared.setdefault(
                group.built,
                tuple(torch.full((2 * half_elements,), torch.nan) for _ in range(world_size)),
            )
            self.handle = SimpleNamespace(barrier=lambda channel: meeting.wait())
            self.half_elements = half_elements
            # Stand-ins for CUDA streams and events, which cannot be made on the CPU
            self.streams = tuple(cast(torch.cuda.Stream, _Stream()) for _ in range(streams))
            self.events = tuple(cast(torch.cuda.Event, _Stream()) for _ in range(events))
            self.calls = 0

    monkeypatch.setattr(overlap, "_PeerBuffers", EmulatedPeerBuffers)
    monkeypatch.setattr(overlap, "_why_not_overlapped", lambda device, world_size: None)
    monkeypatch.setattr(dist, "get_rank", lambda group: group.rank)
    monkeypatch.setattr(dist, "get_world_size", lambda group: world_size)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    rows, k, n, calls = 300, 16, 24, 2
    # Stand-ins for process groups: the patched get_rank reads their rank, and
    # EmulatedPeerBuffers counts the ops built on them
    groups = [
        cast(dist.ProcessGroup, SimpleNamespace(rank=rank, built=0)) for rank in range(world_size)
    ]
    gathers = [
        AllGatherMatmul(group, CPU, torch.float32, 640, 20, chunks_per_peer=3, copy_streams=2)
        for group in groups
    ]
    scatters = [
        MatmulReduceScatter(group, CPU, torch.float32, 640, 32, chunks_per_peer=3, copy_streams=2)
        for group in groups
    ]
    shards = [[_inputs(10 * call + rank, (rows, k)) for rank in range(2)] for call in range(calls)]
    weights = [_inputs(100 + rank, (k, n)) for rank in range(2)]
    results: dict[tuple[str, int, int], torch.Tensor] = {}
    failures: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            for call in range(calls):
                results["gather", call, rank] = gathers[rank](shards[call][rank], weights[rank])
                # Row-parallel: rank r holds A_r [2 * rows, k] and B_r [k, n].
                a = torch.cat(shards[call]).roll(rank, dims=1)
                results["scatter", call, rank] = scatters[rank](a, weights[rank])
        except BaseException as error:
            failures.append(error)
            meeting.abort()

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    for call in range(calls):
        full = torch.cat(shards[call])
        products = (full.roll(rank, dims=1) @ weights[rank] for rank in range(world_size))
        total = sum(products, torch.zeros(world_size * rows, n))
        for rank in range(world_size):
            torch.testing.assert_close(results["gather", call, rank], full @ weights[rank])
            block = total[rank * rows : (rank + 1) * rows]
            torch.testing.assert_close(results["scatter", call, rank], block)

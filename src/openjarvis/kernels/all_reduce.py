"""The all-reduce that tensor parallelism calls: our peer kernel where a size table measured on
this machine says it wins, NCCL (or gloo on the CPU) everywhere else.

Calls go through one registered torch operator, so that torch.compile traces a model around
them (an opaque in-place op) instead of breaking its graph at each one.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor

from openjarvis.kernels.handles import Handles

__all__ = [
    "AllReduce",
    "SizeTable",
    "graph_call_us",
    "measure_size_table",
    "median_call_us",
    "timed_us",
]

Choice = Literal["auto", "nccl", "peer"]
DEFAULT_MAX_BYTES = 4 << 20  # decode messages are KBs; prefill chunks of a few K tokens fit
_FIRST_MEASURED_BYTES = 4 << 10


@dataclass(frozen=True, slots=True)
class SizeTable:
    """Median microseconds per call of each implementation at each size, and the decision."""

    sizes_bytes: tuple[int, ...]
    nccl_us: tuple[float, ...]
    peer_us: tuple[float, ...]

    @property
    def peer_max_bytes(self) -> int:
        """The largest size up to which the peer kernel won at every measured size (0: none)."""
        limit = 0
        for size, nccl, peer in zip(self.sizes_bytes, self.nccl_us, self.peer_us, strict=True):
            if peer >= nccl:
                break
            limit = size
        return limit


# The operator finds its AllReduce from an integer; the caller owns the object (weakly listed).
_HANDLES: Handles["AllReduce"] = Handles("AllReduce")


@torch.library.custom_op("openjarvis::all_reduce_", mutates_args=("x",))
def _all_reduce_op(x: Tensor, instance: int) -> None:
    _HANDLES.get(instance).reduce(x)


@_all_reduce_op.register_fake
def _(x: Tensor, instance: int) -> None:
    return None


class AllReduce:
    """In-place sum over `group`: x -> x. One instance per process, built before graph capture
    and held by its caller (the tensor-parallel layers) for as long as they call it."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        device: torch.device,
        dtype: torch.dtype,
        choice: Choice = "auto",
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.group = group
        self.choice = choice
        self.peer: Callable[[Tensor], Tensor] | None = None
        self.peer_max_bytes = 0
        self.table: SizeTable | None = None
        self.why_not_peer: str | None = None
        if device.type != "cuda":
            self.why_not_peer = "not on a GPU"
        elif choice == "nccl":
            self.why_not_peer = "NCCL chosen"
        else:
            try:
                from openjarvis.kernels.peer_all_reduce import PeerAllReduce
            except ImportError as error:  # Triton missing: only a forced choice is an error
                if choice == "peer":
                    raise
                self.why_not_peer = f"unavailable: {error}"
            else:
                self.peer = PeerAllReduce(group, device, dtype, max_bytes)
        if self.peer is not None and choice == "peer":
            self.peer_max_bytes = max_bytes
        elif self.peer is not None:
            self.table = measure_size_table(self.peer, group, device, dtype, max_bytes)
            self.peer_max_bytes = self.table.peer_max_bytes
        self.instance = _HANDLES.add(self)

    def __call__(self, x: Tensor) -> Tensor:
        torch.ops.openjarvis.all_reduce_(x, self.instance)
        return x

    def reduce(self, x: Tensor) -> Tensor:
        """The sum itself, in place: the peer kernel up to its size limit, else NCCL/gloo."""
        if self.peer is not None and x.numel() * x.element_size() <= self.peer_max_bytes:
            return self.peer(x)
        dist.all_reduce(x, group=self.group)
        return x

    def table_summary(self) -> dict[str, str]:
        summary = {"choice": self.choice, "peer_up_to_bytes": str(self.peer_max_bytes)}
        if self.why_not_peer:
            summary["why_not_peer"] = self.why_not_peer
        return summary


def measure_size_table(
    peer: Callable[[Tensor], Tensor],
    group: dist.ProcessGroup,
    device: torch.device,
    dtype: torch.dtype,
    max_bytes: int,
) -> SizeTable:
    """Time both implementations from 4 KB to max_bytes, doubling, replayed from a CUDA graph
    as decode runs them (timed eagerly, both are bound by Python's launch cost: measured on
    two H200s, 2026-11-30, ~40 µs eager against ~10 µs in a graph). Ranks average their timings
    so that every rank takes the same decisions."""
    element = torch.finfo(dtype).bits // 8
    sizes: list[int] = []
    size = _FIRST_MEASURED_BYTES
    while size <= max_bytes:
        sizes.append(size)
        size *= 2

    def nccl(x: Tensor) -> Tensor:
        dist.all_reduce(x, group=group)
        return x

    timings = torch.zeros(2, len(sizes), dtype=torch.float64, device=device)
    for column, size in enumerate(sizes):
        x = torch.randn(size // element, device=device).to(dtype)
        for row, method in enumerate((nccl, peer)):
            timings[row, column] = graph_call_us(method, x)
    dist.all_reduce(timings, group=group)
    timings /= dist.get_world_size(group)
    nccl_us, peer_us = timings.tolist()
    return SizeTable(tuple(sizes), tuple(nccl_us), tuple(peer_us))


def median_call_us(method: Callable[[Tensor], Tensor], source: Tensor, calls: int) -> float:
    """Median over 5 rounds of the mean time of `calls` back-to-back in-place eager calls, µs.

    Each round starts from `source` again: repeated in-place sums grow by the world size per
    call, and values near overflow would time something else."""
    x = source.clone()
    for _ in range(3):
        method(x)
    rounds = []
    for _ in range(5):
        x.copy_(source)
        rounds.append(timed_us(lambda: [method(x) for _ in range(calls)]) / calls)
    return sorted(rounds)[len(rounds) // 2]


def graph_call_us(method: Callable[[Tensor], Tensor], source: Tensor, calls: int = 20) -> float:
    """Per-call time of `calls` in-place calls captured in one CUDA graph: median of 7 replays."""
    x = source.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the graph (communicators, compilation)
        method(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            method(x)
    replays = []
    for _ in range(7):
        x.copy_(source)
        replays.append(timed_us(graph.replay) / calls)
    return sorted(replays)[len(replays) // 2]


def timed_us(work: Callable[[], object]) -> float:
    """Microseconds `work` takes on the current stream (CUDA events around it)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3

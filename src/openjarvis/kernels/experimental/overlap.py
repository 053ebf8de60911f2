"""Tensor parallelism's two GEMMs with communication, overlapped: all-gather + GEMM (a
column-parallel layer) and GEMM + reduce-scatter (a row-parallel layer), each beside its baseline.

ParallelKittens style with no device code of our own: torch symmetric memory maps every rank's
buffer into each process, copy engines move row chunks to and from peers over NVLink (multicast is
never used), cuBLAS computes chunk by chunk, and CUDA events start each chunk's GEMM (or push) as
soon as its rows are there. Off the GPU, or alone, each op is its NCCL/gloo + matmul baseline.
"""

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from openjarvis.kernels.symmetric import rendezvous_buffers

__all__ = [
    "AllGatherMatmul",
    "Chunk",
    "MatmulReduceScatter",
    "all_gather_matmul_baseline",
    "check_operands",
    "matmul_reduce_scatter_baseline",
    "peer_chunks",
    "peer_order",
    "split_rows",
]

ROW_ALIGN = 128  # chunk heights are whole GEMM tiles, so only a block's last chunk has a ragged one
# Measured on 2x H200 (docs/benchmarks.md): one chunk per peer was best, or within 4 %, at every
# benchmarked shape; more chunks start GEMMs earlier but run smaller, less efficient ones.
DEFAULT_CHUNKS_PER_PEER = 1
DEFAULT_COPY_STREAMS = 1

# torch 2.13 renamed these collectives; the GPU machines run torch 2.11, which has the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# Reusing the symmetric buffers, in both ops. Every call makes exactly one cross-rank barrier, on
# the caller's stream, and alternate calls use alternate halves of every rank's buffer. A rank
# writes half h (call n + 2) only after it has passed the barrier of call n + 1 on that stream,
# which needs every peer to have reached that barrier on its own stream; and a peer reaches it
# only after all its accesses to half h in call n are done (its stream waited on each copy or
# push of call n, and ran the sum of call n, before that barrier). So no rank overwrites data
# that a peer may still read, or that it still reads itself. One barrier per call instead of a
# second one before each write, at the price of twice the memory. The half is picked on the host,
# so a captured CUDA graph would replay one half back to back: capture is refused.


class Chunk(NamedTuple):
    """Rows [start, stop) of the full operand (all ranks' rows, rank p's block first at
    p * rows_per_rank), exchanged with rank `peer`."""

    peer: int
    start: int
    stop: int


def peer_order(rank: int, world_size: int) -> tuple[int, ...]:
    """Every other rank, from rank + 1 on. At step i every rank talks to rank + i, so each GPU is
    the target of exactly one peer at a time and all links carry traffic at once."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a group of {world_size}")
    return tuple((rank + step) % world_size for step in range(1, world_size))


def split_rows(rows: int, chunks: int, align: int = ROW_ALIGN) -> tuple[tuple[int, int], ...]:
    """[0, rows) as at most `chunks` contiguous (start, stop) spans, as even as possible in whole
    multiples of `align` (fewer spans when there are fewer than `chunks` tiles of rows)."""
    if rows < 1 or chunks < 1 or align < 1:
        raise ValueError(f"need rows, chunks and align >= 1; got {rows}, {chunks}, {align}")
    tiles = -(-rows // align)
    chunks = min(chunks, tiles)
    spans = []
    start = 0
    for index in range(chunks):
        stop = min(rows, start + align * (tiles // chunks + (index < tiles % chunks)))
        spans.append((start, stop))
        start = stop
    return tuple(spans)


def peer_chunks(
    rank: int, world_size: int, rows_per_rank: int, chunks_per_peer: int
) -> tuple[Chunk, ...]:
    """The chunks that `rank` exchanges, peers in peer_order and each peer's block split by
    split_rows: the order in which copies are issued and GEMMs run."""
    spans = split_rows(rows_per_rank, chunks_per_peer)
    return tuple(
        Chunk(peer, peer * rows_per_rank + start, peer * rows_per_rank + stop)
        for peer in peer_order(rank, world_size)
        for start, stop in spans
    )


def check_operands(a: Tensor, b: Tensor, device: torch.device, dtype: torch.dtype) -> None:
    """Two matrices for A @ B: on `device`, of `dtype`, A's columns matching B's rows."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"A and B must be matrices; got shapes {tuple(a.shape)}, {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"A has {a.shape[1]} columns but B has {b.shape[0]} rows; they must match")
    for name, operand in (("A", a), ("B", b)):
        if operand.device != device:
            raise ValueError(f"{name} is on {operand.device}; this op was built for {device}")
        if operand.dtype != dtype:
            raise ValueError(f"{name} is {operand.dtype}; this op was built for {dtype}")


def all_gather_matmul_baseline(a_shard: Tensor, b: Tensor, group: dist.ProcessGroup) -> Tensor:
    """cat(every rank's A_shard) @ B: the collective, then the GEMM."""
    gathered = a_shard.new_empty(a_shard.shape[0] * dist.get_world_size(group), a_shard.shape[1])
    _all_gather_single(gathered, a_shard.contiguous(), group=group)
    return gathered @ b


def matmul_reduce_scatter_baseline(a: Tensor, b: Tensor, group: dist.ProcessGroup) -> Tensor:
    """Rows rank * M / W .. (rank + 1) * M / W of the sum over ranks of A @ B: GEMM, collective."""
    partial = a @ b
    out = partial.new_empty(partial.shape[0] // dist.get_world_size(group), partial.shape[1])
    _reduce_scatter_single(out, partial, group=group)
    return out


class _PeerBuffers:
    """Every rank's symmetric buffer (two halves, see the note on reuse) as seen from this rank,
    with the side streams and events that move chunks between ranks."""

    def __init__(
        self, group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype,
        half_elements: int, streams: int, events: int,
    ) -> None:  # fmt: skip
        self.local, self.flat, self.handle = rendezvous_buffers(
            group, device, dtype, 2 * half_elements
        )
        self.half_elements = half_elements
        self.streams = tuple(torch.cuda.Stream(device) for _ in range(streams))
        self.events = tuple(torch.cuda.Event() for _ in range(events))
        self.calls = 0

    def next_half(self) -> int:
        """The half this call uses: calls alternate, in step on every rank (same calls)."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "overlapped tensor-parallel GEMMs pick their buffer half on the host and cannot "
                "be captured in a CUDA graph; run them eagerly (prefill) or use the baseline"
            )
        self.calls += 1
        return self.calls % 2

    def view(self, rank: int, half: int, offset: int, shape: tuple[int, ...]) -> Tensor:
        """`shape` elements of `rank`'s buffer, from `offset` in the given half."""
        start = half * self.half_elements + offset
        return self.flat[rank][start : start + math.prod(shape)].view(shape)


def _why_not_overlapped(device: torch.device, world_size: int) -> str | None:
    if device.type != "cuda":
        return "not on a GPU"
    if world_size == 1:
        return "one rank: nothing to overlap"
    return None


def _settled_device(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _check_settings(**settings: int) -> None:
    for name, value in settings.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1; got {value}")


class _Overlapped:
    """What both ops share: the group, the settings and, on GPUs, the peers' buffers."""

    def __init__(
        self, group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype,
        max_tokens: int, chunks_per_peer: int, **sizes: int,
    ) -> None:  # fmt: skip
        _check_settings(max_tokens=max_tokens, chunks_per_peer=chunks_per_peer, **sizes)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = _settled_device(device)
        self.dtype = dtype
        self.max_tokens = max_tokens
        self.chunks_per_peer = chunks_per_peer
        self.peers: _PeerBuffers | None = None
        self.why_not_overlapped = _why_not_overlapped(self.device, self.world_size)

    def _connect(self, elements: int, copy_streams: int) -> None:
        """Symmetric buffers of `elements` per half on every rank, and the copy streams."""
        events = (self.world_size - 1) * self.chunks_per_peer
        self.peers = _PeerBuffers(
            self.group, self.device, self.dtype, elements, copy_streams, events
        )


class AllGatherMatmul(_Overlapped):
    """C = cat(A_0, ..., A_{W-1}) @ B, where rank r holds A_r [M/W, K] and its own B [K, N]:
    a column-parallel layer fed by row-sharded activations. Build once per process, on every
    rank of `group` alike, for up to `max_tokens` rows of C and `max_k` columns of A."""

    def __init__(
        self, group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype,
        max_tokens: int, max_k: int, chunks_per_peer: int = DEFAULT_CHUNKS_PER_PEER,
        copy_streams: int = DEFAULT_COPY_STREAMS,
    ) -> None:  # fmt: skip
        super().__init__(
            group,
            device,
            dtype,
            max_tokens,
            chunks_per_peer,
            max_k=max_k,
            copy_streams=copy_streams,
        )
        self.max_k = max_k
        if self.why_not_overlapped is None:
            self._connect(max_tokens // self.world_size * max_k, copy_streams)
            # The peers' shards land here at their rows of the full A; our own rows stay unused,
            # our GEMM reads our shard where it is.
            self.gathered = torch.empty(max_tokens * max_k, dtype=dtype, device=self.device)

    def __call__(self, a_shard: Tensor, b: Tensor) -> Tensor:
        rows, k = self._check(a_shard, b)
        if self.peers is None:
            return self.baseline(a_shard, b)
        peers = self.peers
        half = peers.next_half()
        tokens = rows * self.world_size
        main = torch.cuda.current_stream(self.device)
        out = torch.empty(tokens, b.shape[1], dtype=self.dtype, device=self.device)
        # Publish our shard, then meet: past the barrier every rank's shard of this call is in
        # its buffer. Both run on the caller's stream, before our GEMM: the barrier is a kernel,
        # and on a side stream beside our GEMM it might get no SM until that GEMM ends (cuBLAS's
        # persistent kernels keep every SM), holding back all the copies.
        peers.view(self.rank, half, 0, (rows, k)).copy_(a_shard)
        peers.handle.barrier(channel=0)
        gathered = self.gathered[: tokens * k].view(tokens, k)
        chunks = peer_chunks(self.rank, self.world_size, rows, self.chunks_per_peer)
        for stream in peers.streams:
            # Also orders this call's copies after the previous call's GEMMs read `gathered`.
            stream.wait_stream(main)
        for index, chunk in enumerate(chunks):
            stream = peers.streams[index % len(peers.streams)]
            offset = (chunk.start - chunk.peer * rows) * k
            with torch.cuda.stream(stream):
                source = peers.view(chunk.peer, half, offset, (chunk.stop - chunk.start, k))
                gathered[chunk.start : chunk.stop].copy_(source)  # a copy engine, over NVLink
                peers.events[index].record(stream)
        own = slice(self.rank * rows, (self.rank + 1) * rows)
        torch.mm(a_shard, b, out=out[own])
        for index, chunk in enumerate(chunks):
            main.wait_event(peers.events[index])
            torch.mm(gathered[chunk.start : chunk.stop], b, out=out[chunk.start : chunk.stop])
        return out

    def baseline(self, a_shard: Tensor, b: Tensor) -> Tensor:
        """The same result from the collective then the GEMM (NCCL and cuBLAS on the GPU)."""
        self._check(a_shard, b)
        return all_gather_matmul_baseline(a_shard, b, self.group)

    def _check(self, a_shard: Tensor, b: Tensor) -> tuple[int, int]:
        check_operands(a_shard, b, self.device, self.dtype)
        rows, k = a_shard.shape
        if rows * self.world_size > self.max_tokens or k > self.max_k:
            raise ValueError(
                f"{self.world_size} shards of {rows}x{k} exceed the buffers, built for "
                f"max_tokens={self.max_tokens}, max_k={self.max_k}; build the op larger"
            )
        return rows, k


class MatmulReduceScatter(_Overlapped):
    """Rows r * M/W .. (r + 1) * M/W, on rank r, of the sum over ranks of A_r [M, K_r] @ B_r
    [K_r, N]: a row-parallel layer leaving row-sharded activations. Build once per process, on
    every rank of `group` alike, for up to `max_tokens` rows (M) and `max_n` columns (N)."""

    def __init__(
        self, group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype,
        max_tokens: int, max_n: int, chunks_per_peer: int = DEFAULT_CHUNKS_PER_PEER,
        copy_streams: int = DEFAULT_COPY_STREAMS,
    ) -> None:  # fmt: skip
        super().__init__(
            group,
            device,
            dtype,
            max_tokens,
            chunks_per_peer,
            max_n=max_n,
            copy_streams=copy_streams,
        )
        self.max_n = max_n
        if self.why_not_overlapped is None:
            # Each rank's half is W slots [M/W, N], slot s for source rank s's partial block.
            self._connect(self.world_size * (max_tokens // self.world_size) * max_n, copy_streams)
            # The blocks for peers are computed here, then pushed.
            self.partial = torch.empty(max_tokens * max_n, dtype=dtype, device=self.device)

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        tokens, n = self._check(a, b)
        if self.peers is None:
            return self.baseline(a, b)
        peers = self.peers
        half = peers.next_half()
        rows = tokens // self.world_size
        main = torch.cuda.current_stream(self.device)
        partial = self.partial[: tokens * n].view(tokens, n)
        # Blocks for the peers first, from rank + 1 on, each chunk pushed into its destination's
        # slot for us as soon as its GEMM is done; our own block last, straight into our slot,
        # while the last pushes are in flight.
        chunks = peer_chunks(self.rank, self.world_size, rows, self.chunks_per_peer)
        for index, chunk in enumerate(chunks):
            torch.mm(a[chunk.start : chunk.stop], b, out=partial[chunk.start : chunk.stop])
            peers.events[index].record(main)
            stream = peers.streams[index % len(peers.streams)]
            stream.wait_event(peers.events[index])
            offset = (self.rank * rows + chunk.start - chunk.peer * rows) * n
            with torch.cuda.stream(stream):
                target = peers.view(chunk.peer, half, offset, (chunk.stop - chunk.start, n))
                target.copy_(partial[chunk.start : chunk.stop])  # a copy engine, over NVLink
        own = slice(self.rank * rows, (self.rank + 1) * rows)
        torch.mm(a[own], b, out=peers.view(self.rank, half, self.rank * rows * n, (rows, n)))
        for stream in peers.streams:
            main.wait_stream(stream)
        # Past the barrier every peer's pushes into our slots are complete.
        peers.handle.barrier(channel=0)
        slots = peers.view(self.rank, half, 0, (self.world_size, rows, n))
        # One pass, accumulating in float32, rounding once; torch's reduction uses no atomics,
        # so the result is the same on every run.
        return slots.sum(dim=0)

    def baseline(self, a: Tensor, b: Tensor) -> Tensor:
        """The same result from the GEMM then the collective (cuBLAS and NCCL on the GPU)."""
        self._check(a, b)
        return matmul_reduce_scatter_baseline(a, b, self.group)

    def _check(self, a: Tensor, b: Tensor) -> tuple[int, int]:
        check_operands(a, b, self.device, self.dtype)
        tokens, n = a.shape[0], b.shape[1]
        if tokens % self.world_size:
            raise ValueError(f"A's {tokens} rows do not split evenly over {self.world_size} ranks")
        if tokens > self.max_tokens or n > self.max_n:
            raise ValueError(
                f"a {tokens}x{n} product exceeds the buffers, built for max_tokens="
                f"{self.max_tokens}, max_n={self.max_n}; build the op larger"
            )
        return tokens, n

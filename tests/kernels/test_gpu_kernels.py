"""Each kernel the torch engine runs, against the eager path it replaces, on real GPUs: the paged
decode attention (one GPU) against the gathered attention in float32, and the peer all-reduce
and the fused decode GEMV + all-reduce (two GPUs or more, NCCL) against the sum in rank order
and against NCCL's all-reduce.

Marked `gpu` and skipped without CUDA; run them on the GPU machine with `pytest -m gpu`.
"""

import math
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist

from openjarvis.runtime.torch.paged import Layout, PagedKV

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU (run on the GPU machine: -m gpu)"),
]
needs_two = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs of one host")
# The peer kernels read peers' memory over NVLink; multicast stays off on the lent machines.
PEER_ENVIRONMENT = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
Spawn = Callable[[Callable[[int, int, str], None], int], None]  # spawn_ranks(ranks, world_size)


# Paged decode attention ---------------------------------------------------------------------


def _paged_case(
    batch: int, heads: int, kv_heads: int, head_dim: int, block_size: int, blocks_per_row: int
) -> tuple[PagedKV, PagedKV, "torch.Tensor", Layout]:
    """A bf16 cache filled with random keys and values, the same cache in float32, one query
    per row, and rows whose blocks are scattered over the cache and whose contexts differ
    (1 position, a partial block, a full table)."""
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(batch * 1000 + heads + head_dim)
    blocks = 1 + batch * blocks_per_row  # block 0 is the engine's scratch block
    caches = []
    for dtype in (torch.bfloat16, torch.float32):
        caches.append(PagedKV(blocks, block_size, kv_heads, head_dim, dtype, device))
    shape = (blocks, block_size, kv_heads, head_dim)
    for name in ("k", "v"):
        values = torch.randn(shape, device=device, generator=generator).to(torch.bfloat16)
        getattr(caches[0], name).copy_(values)
        getattr(caches[1], name).copy_(values.float())
    order = torch.randperm(blocks - 1, device=device, generator=generator) + 1
    tables = order.view(batch, blocks_per_row).to(torch.int32)
    span = blocks_per_row * block_size
    contexts = torch.randint(1, span + 1, (batch,), device=device, generator=generator)
    contexts[0] = 1
    contexts[-1] = span
    if batch > 2:
        contexts[1] = block_size + 3
    positions = (contexts - 1)[:, None]  # each row's query is its last position
    slots = torch.zeros_like(positions)  # not written: the test reads only
    q = torch.randn(batch, 1, heads, head_dim, device=device, generator=generator)
    return caches[0], caches[1], q.to(torch.bfloat16), Layout(positions, slots, tables)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [(4, 1, 256), (8, 2, 64), (32, 8, 128), (12, 12, 64)],
    ids=["gemma-270m", "gqa-4", "llama-8b", "mha"],
)
@pytest.mark.parametrize("batch", [1, 7, 64], ids=lambda b: f"batch-{b}")
@pytest.mark.parametrize("window", [None, 40], ids=["full", "window-40"])
@pytest.mark.parametrize("block_size", [16, 256], ids=lambda b: f"block-{b}")
def test_paged_decode_kernel_matches_the_gathered_attention(
    heads: int, kv_heads: int, head_dim: int, batch: int, window: int | None, block_size: int
) -> None:
    """Batch 1 splits the context over many programs (flash-decoding) and batch 64 barely
    splits it, so both the split and the combining kernel are checked; a window hides the
    oldest keys; a context of 1 and one ending inside a block check the edges."""
    cache, reference_cache, q, layout = _paged_case(
        batch, heads, kv_heads, head_dim, block_size, blocks_per_row=max(1, 1024 // block_size)
    )
    scale = 1 / math.sqrt(head_dim)
    out = cache.attend(q, layout, mask=None, window=window, scale=scale, softcap=None)
    mask = layout.masks(block_size, window)
    expected = reference_cache.gathered(q.float(), layout, mask, scale, softcap=None)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    # bf16 output of a float32 accumulation: within two bf16 steps of values of order 1.
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("window", [None, 40], ids=["full", "window-40"])
@pytest.mark.parametrize("length", [2, 16], ids=lambda n: f"{n}-new-tokens")
def test_several_new_tokens_per_row_through_the_kernel_match_the_gathered_attention(
    length: int, window: int | None
) -> None:
    """A short prefill step (a prompt's new tokens after a cached prefix) runs each query as a
    row of the decode kernel: each sees its own key and those before it, as the causal mask
    over the gathered blocks lets it."""
    cache, reference_cache, q, layout = _paged_case(3, 4, 1, 256, 16, blocks_per_row=8)
    last = layout.positions.clamp(min=length - 1)  # each row's last query, at least length - 1
    positions = last - torch.arange(length - 1, -1, -1, device=last.device)[None, :]
    layout = Layout(positions, torch.zeros_like(positions), layout.block_tables)
    generator = torch.Generator(device="cuda").manual_seed(length)
    q = torch.randn(3, length, 4, 256, device="cuda", generator=generator).to(torch.bfloat16)
    out = cache.attend(q, layout, mask=None, window=window, scale=1 / 16, softcap=None)
    mask = layout.masks(16, window)
    expected = reference_cache.gathered(q.float(), layout, mask, 1 / 16, softcap=None)
    assert out.shape == q.shape
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("window", [None, 40], ids=["full", "window-40"])
def test_short_rows_in_a_wide_table_spread_over_the_splits_and_match(window: int | None) -> None:
    """Rows of 1 to 300 keys in tables sized for 4,096 (the engine's default context): each row
    divides its own keys among the splits that the table's width allows, most of them empty
    for the shortest rows, and the parts combine to the gathered attention."""
    cache, reference_cache, q, layout = _paged_case(7, 4, 1, 256, 16, blocks_per_row=256)
    contexts = torch.tensor([1, 2, 17, 63, 64, 65, 300], device="cuda")
    positions = (contexts - 1)[:, None]
    layout = Layout(positions, torch.zeros_like(positions), layout.block_tables)
    out = cache.attend(q, layout, mask=None, window=window, scale=1 / 16, softcap=None)
    mask = layout.masks(16, window)
    expected = reference_cache.gathered(q.float(), layout, mask, 1 / 16, softcap=None)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_paged_decode_kernel_sees_a_changed_key() -> None:
    """The comparison above can fail: change a visible key and the row's output moves, while a
    key past a row's context leaves its output as it was."""
    cache, _, q, layout = _paged_case(2, 4, 1, 256, 16, blocks_per_row=4)
    scale = 1 / 16
    before = cache.attend(q, layout, None, None, scale, None).clone()
    # Row 1's context is its whole table, so its last key is visible; row 0 sees position 0 only.
    cache.k[int(layout.block_tables[1, -1]), -1] += 50
    cache.k[int(layout.block_tables[0, 0]), 5] += 50
    changed = cache.attend(q, layout, None, None, scale, None)
    assert not torch.allclose(changed[1], before[1], atol=1e-2)
    torch.testing.assert_close(changed[0], before[0], atol=0, rtol=0)


# Peer all-reduce and fused GEMV + all-reduce (one process per GPU) ---------------------------


def _join(rank: int, world_size: int, store: str) -> "dist.ProcessGroup":
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"file://{store}", rank=rank, world_size=world_size, device_id=device
    )
    group = dist.group.WORLD
    assert group is not None
    return group


def _rank_input(rank: int, call: int, shape: tuple[int, ...]) -> "torch.Tensor":
    """Rank `rank`'s input of call `call`, the same wherever it is built (seeded on the CPU)."""
    generator = torch.Generator().manual_seed(1000 * call + rank)
    return torch.randn(*shape, generator=generator)


def _rank_order_sum(parts: list["torch.Tensor"], dtype: "torch.dtype") -> "torch.Tensor":
    """The sum the peer kernels compute: float32, added in rank order, rounded once."""
    total = torch.zeros_like(parts[0], dtype=torch.float32)
    for part in parts:
        total += part.float()
    return total.to(dtype)


def _peer_all_reduce_ranks(rank: int, world_size: int, store: str) -> None:
    from openjarvis.kernels.peer_all_reduce import PeerAllReduce

    group = _join(rank, world_size, store)
    try:
        device = torch.device("cuda", rank)
        max_bytes = 1 << 20
        peer = PeerAllReduce(group, device, torch.bfloat16, max_bytes)
        # Sizes below one program's block, ragged, many programs, the whole buffer; three calls
        # each, so both buffer halves and several epochs are used.
        for call, numel in enumerate([1, 7, 2048, 2049, 65_537, max_bytes // 2] * 3):
            parts = [_rank_input(r, call, (numel,)).to(torch.bfloat16) for r in range(world_size)]
            x = parts[rank].to(device)
            reference = x.clone()
            dist.all_reduce(reference, group=group)  # NCCL: the engine's eager path
            peer(x)
            expected = _rank_order_sum(parts, torch.bfloat16).to(device)
            assert torch.equal(x, expected), f"call {call}, {numel} elements: not the sum"
            # NCCL may add in another order (and in bf16): close, not equal.
            torch.testing.assert_close(x.float(), reference.float(), atol=6e-2, rtol=2e-2)
            gathered = [torch.empty_like(x) for _ in range(world_size)]
            dist.all_gather(gathered, x, group=group)
            assert all(torch.equal(other, x) for other in gathered), "ranks disagree"
        # Replayed from a CUDA graph, as decode runs it: the epochs count on across replays.
        x = torch.empty(4096, dtype=torch.bfloat16, device=device)
        x.copy_(_rank_input(rank, 99, (4096,)))
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            peer(x)  # warm-up outside the graph
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            peer(x)
        for call in (100, 101, 102):
            parts = [_rank_input(r, call, (4096,)).to(torch.bfloat16) for r in range(world_size)]
            x.copy_(parts[rank])
            graph.replay()
            torch.cuda.synchronize(device)
            assert torch.equal(x, _rank_order_sum(parts, torch.bfloat16).to(device))
    finally:
        dist.destroy_process_group()


@pytest.fixture
def spawn_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Spawn:
    """Runs `ranks(rank, world_size, store)` in one process per GPU, with peer access set up
    as on the lent machines (the spawned ranks inherit the environment)."""
    for name, value in PEER_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)

    def spawn(ranks: Callable[[int, int, str], None], world_size: int) -> None:
        store = str(tmp_path / "store")
        torch.multiprocessing.spawn(ranks, args=(world_size, store), nprocs=world_size)

    return spawn


@needs_two
def test_peer_all_reduce_sums_in_rank_order_like_nccl(spawn_ranks: Spawn) -> None:
    spawn_ranks(_peer_all_reduce_ranks, GPUS)


# Row-parallel shapes of the engine's decode (out rows x this rank's columns): a gemma-3-270m
# attention output and MLP down projection at tp 2, a ragged one, and a larger model's.
GEMV_SHAPES = [(640, 512), (640, 1024), (1000, 300), (4096, 7168)]


def _gemv_ranks(rank: int, world_size: int, store: str) -> None:
    import torch.nn.functional as F

    from openjarvis.kernels.gemv_all_reduce import GemvAllReduce

    group = _join(rank, world_size, store)
    try:
        device = torch.device("cuda", rank)
        for n, k in GEMV_SHAPES:
            fused = GemvAllReduce(group, device, torch.bfloat16, max_rows=n)
            for call in range(3):
                weights = [
                    (_rank_input(r, 10 * call + 1, (n, k)) / math.sqrt(k)).to(torch.bfloat16)
                    for r in range(world_size)
                ]
                xs = [
                    _rank_input(r, 10 * call + 2, (k,)).to(torch.bfloat16)
                    for r in range(world_size)
                ]
                weight, x = weights[rank].to(device), xs[rank].to(device)
                # The engine's eager path: this rank's GEMV, then the all-reduce (NCCL).
                reference = F.linear(x, weight)
                dist.all_reduce(reference, group=group)
                for result in (fused(x, weight), fused.op(x, weight)):
                    products = [w.float() @ v.float() for w, v in zip(weights, xs, strict=True)]
                    expected = _rank_order_sum(products, torch.bfloat16).to(device)
                    # The kernel's float32 dot products add in another order than the CPU's.
                    torch.testing.assert_close(
                        result.float(), expected.float(), atol=2e-2, rtol=1e-2
                    )
                    torch.testing.assert_close(
                        result.float(), reference.float(), atol=5e-2, rtol=2e-2
                    )
                    gathered = [torch.empty_like(result) for _ in range(world_size)]
                    dist.all_gather(gathered, result, group=group)
                    assert all(torch.equal(other, result) for other in gathered), "ranks disagree"
    finally:
        dist.destroy_process_group()


@needs_two
def test_fused_gemv_all_reduce_matches_the_gemv_then_nccl(spawn_ranks: Spawn) -> None:
    spawn_ranks(_gemv_ranks, GPUS)


def test_fused_gemv_on_one_gpu_is_the_plain_product(spawn_ranks: Spawn) -> None:
    """World size 1 takes the kernel's no-exchange branch; the product alone must be right."""
    spawn_ranks(_gemv_ranks, 1)

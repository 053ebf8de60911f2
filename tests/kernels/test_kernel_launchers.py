"""The parts of openjarvis.kernels that run anywhere: launcher checks, the size table's
decision, and the collective fallback on the CPU (the GPU kernel itself runs in
benchmarks/kernels_all_reduce.py on the GPU machine)."""

import gc
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist

from openjarvis.kernels import AllReduce, SizeTable, check_message
from openjarvis.kernels.handles import Handles

CPU = torch.device("cpu")


def test_check_message_accepts_a_plain_contiguous_message() -> None:
    check_message(torch.zeros(4096, dtype=torch.bfloat16), CPU, torch.bfloat16, 8192)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (torch.zeros(16, dtype=torch.float32), "built for torch.bfloat16"),
        (torch.zeros(8, 4, dtype=torch.bfloat16).t(), "must be contiguous"),
        (torch.zeros(8192, dtype=torch.bfloat16), "exceeds the buffer"),
        (torch.zeros(4097, dtype=torch.bfloat16)[1:], "16-byte boundary"),
    ],
)
def test_check_message_refuses_what_the_kernel_cannot_take(
    message: "torch.Tensor", error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        check_message(message, CPU, torch.bfloat16, 8192)


def test_check_message_refuses_another_device() -> None:
    with pytest.raises(ValueError, match="is on cpu"):
        check_message(torch.zeros(8), torch.device("meta"), torch.float32, 64)


def test_size_table_uses_the_peer_kernel_only_up_to_its_first_loss() -> None:
    table = SizeTable((4096, 8192, 16384, 32768), (10.0, 10.0, 10.0, 10.0), (8.0, 9.0, 11.0, 9.0))
    assert table.peer_max_bytes == 8192
    never = SizeTable((4096,), (10.0,), (12.0,))
    assert never.peer_max_bytes == 0


def _two_rank_all_reduce(rank: int, store_path: str, results_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        group = dist.group.WORLD
        assert group is not None
        reduce = AllReduce(group, CPU, torch.float32, choice="auto")
        summed = reduce(torch.arange(6, dtype=torch.float32) * (rank + 1))
        assert reduce.peer is None
        assert reduce.table_summary()["why_not_peer"] == "not on a GPU"
        torch.save(summed, f"{results_path}.{rank}")
    finally:
        dist.destroy_process_group()


def test_all_reduce_on_the_cpu_sums_the_ranks(tmp_path: Path) -> None:
    """Two real ranks (gloo): each gets the sum, so an all-reduce that returned its input
    unchanged (the identity a one-rank check cannot tell apart) fails here."""
    results = tmp_path / "summed"
    torch.multiprocessing.spawn(
        _two_rank_all_reduce, args=(str(tmp_path / "store"), str(results)), nprocs=2
    )
    expected = torch.arange(6, dtype=torch.float32) * 3
    for rank in range(2):
        assert torch.equal(torch.load(f"{results}.{rank}"), expected)


def test_an_operator_handle_does_not_keep_its_object_alive() -> None:
    """The caller owns a kernel object; the handle table only finds it while the caller holds
    it, and a call after that names what went wrong instead of reading a freed object."""

    class Op:
        pass

    handles: Handles[Op] = Handles("Op")
    op = Op()
    handle = handles.add(op)
    assert handles.get(handle) is op
    assert handles.add(Op()) != handle  # handles are not reused
    del op
    gc.collect()
    assert len(handles) == 0
    with pytest.raises(RuntimeError, match="Op 0 was released by its owner"):
        handles.get(handle)

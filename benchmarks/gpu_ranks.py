"""What the multi-GPU benchmark scripts share: one process per visible GPU joined in an NCCL
group (NVLink multicast off), and the script's entry point that spawns them and prints the
table from the JSON that rank 0 wrote, even when a rank failed."""

import argparse
import faulthandler
import json
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing

__all__ = ["join_group", "run_on_every_gpu"]

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

Worker = Callable[[int, int, int, str], None]  # (rank, world size, port, output path)


def join_group(rank: int, world_size: int, port: int, timeout_s: float) -> torch.device:
    """This process's GPU, in the default NCCL group; a hang after `timeout_s` ends the process
    with every thread's stack (call faulthandler.dump_traceback_later again to re-arm it)."""
    faulthandler.dump_traceback_later(timeout_s, exit=True)
    for name, value in MULTICAST_OFF.items():
        os.environ.setdefault(name, value)
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
        device_id=device,
    )  # fmt: skip
    return device


def run_on_every_gpu(
    worker: Worker, print_table: Callable[[dict], None], description: str, default_out: str
) -> None:
    """The script's main(): `--out FILE`, one `worker` process per GPU, then the table."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=Path(default_out))
    args = parser.parse_args()
    world_size = torch.cuda.device_count()
    if world_size < 2:
        raise SystemExit("needs at least 2 GPUs")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        multiprocessing.spawn(worker, args=(world_size, port, str(args.out)), nprocs=world_size)
    except Exception:
        traceback.print_exc()
    if args.out.exists():
        print_table(json.loads(args.out.read_text()))

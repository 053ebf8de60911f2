"""What the power sampler costs on a real GPU: NVML reads per second, CPU per read, and the
sampler thread's share of a core, for a few settings of its refresh clock (the margin between
reads while it learns the refresh, refreshes per read), idle and under a load of short bursts.

Run on a machine with an NVIDIA GPU, torch and nvidia-ml-py:
`PYTHONPATH=src python3 benchmarks/power_sampler_cost.py [--seconds 8]`.
"""

import argparse
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from openjarvis.power import Meter
from openjarvis.power.nvml import discover_nvml

__all__ = ["main"]

SETTINGS = ((0.008, 1), (0.008, 2), (0.008, 3))  # (margin s, refreshes per read)


def _thread_cpu_s(native_id: int) -> float:
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load(torch: object, stop: threading.Event) -> None:
    """20 ms of matmuls every 100 ms, like short tasks back to back."""
    import torch as t

    a = t.randn(4096, 4096, device="cuda", dtype=t.bfloat16)
    while not stop.is_set():
        for _ in range(110):
            a @ a
        t.cuda.synchronize()
        time.sleep(0.08)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--strides", default="1,2,3", help="refreshes per read to try, comma-separated"
    )
    args = parser.parse_args(argv)
    strides = {int(x) for x in args.strides.split(",")}
    import torch

    (gpu,) = discover_nvml(None, gpus=(0,)).sources
    start = time.thread_time()
    for _ in range(300):
        gpu.read()
    cpu_per_read_ms = (time.thread_time() - start) / 300 * 1000
    print(f"one NVML energy read: {cpu_per_read_ms:.3f} ms of CPU")
    print(
        "| margin ms | refreshes per read | load | reads/s | late reads/s | relearns/s "
        "| sampler % core |"
    )
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for margin_s, stride in [(m, k) for m, k in SETTINGS if k in strides]:
        for loaded in (False, True):
            meter = Meter([gpu], "accelerator")
            track = meter._tracks[0]
            assert track.refresh is not None
            track.refresh.margin_s, track.refresh.stride = margin_s, stride
            stop = threading.Event()
            loader = threading.Thread(target=_load, args=(torch, stop)) if loaded else None
            if loader is not None:
                loader.start()
            meter.start()
            assert meter._thread is not None and meter._thread.native_id is not None
            native_id = meter._thread.native_id
            time.sleep(1.0)  # learn the phase
            reads, late, relearns = (
                track.read_count,
                track.refresh.late_reads,
                track.refresh.relearns,
            )
            cpu_s, wall_s = _thread_cpu_s(native_id), time.monotonic()
            time.sleep(args.seconds)
            elapsed_s = time.monotonic() - wall_s
            share = (_thread_cpu_s(native_id) - cpu_s) / elapsed_s
            row = (
                (track.read_count - reads) / elapsed_s,
                (track.refresh.late_reads - late) / elapsed_s,
                (track.refresh.relearns - relearns) / elapsed_s,
            )
            meter.stop()
            stop.set()
            if loader is not None:
                loader.join()
            print(
                f"| {margin_s * 1000:g} | {stride} | {'bursts' if loaded else 'idle'} "
                f"| {row[0]:.1f} | {row[1]:.1f} | {row[2]:.2f} | {100 * share:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""How soon after a refresh NVML's energy counter can be read: for each margin (the read's
start after the expected refresh), the read's wall time and CPU, when it ends after the
refresh, and how often it already sees the new value; idle and under short bursts of matmuls.

The meter reads the counter `margin` after each refresh it waits for (power/track.py's
RefreshClock), so a reply's energy is known that long plus the read after the refresh that
covers its end: this picks the margin that makes that soonest.

Run on a machine with an NVIDIA GPU and nvidia-ml-py (torch for the load):
`PYTHONPATH=src python3 benchmarks/nvml_read_latency.py [--refreshes 40] [--margins-ms 2,8,16]`.
"""

import argparse
import statistics
import threading
import time

import pynvml
from power_sampler_cost import _load  # 20 ms of matmuls every 100 ms

__all__ = ["main"]


def read(handle: object) -> tuple[int, float, float, float]:
    """(the counter in mJ, the read's start, its end, its CPU seconds)."""
    cpu_s, start_s = time.thread_time(), time.monotonic()
    value = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    return value, start_s, time.monotonic(), time.thread_time() - cpu_s


def pin_refresh(handle: object, period_s: float) -> float:
    """A refresh's time, from back-to-back reads: the middle of the narrowest bracket seen
    over a few refreshes (a read before it with the old value, one after with the new)."""
    best: tuple[float, float] | None = None
    value, _, last_end_s, _ = read(handle)
    deadline_s = time.monotonic() + 6 * period_s
    while time.monotonic() < deadline_s:
        new, start_s, end_s, _ = read(handle)
        if new != value:
            bracket = (last_end_s, start_s) if start_s > last_end_s else (start_s, end_s)
            if best is None or bracket[1] - bracket[0] < best[1] - best[0]:
                best = bracket
        value, last_end_s = new, end_s
    assert best is not None, "the counter did not refresh in six periods"
    return 0.5 * (best[0] + best[1])


def margin_run(
    handle: object, refresh_s: float, period_s: float, margin_s: float, refreshes: int
) -> dict[str, float]:
    """Read `margin_s` after each of the next `refreshes` expected refreshes."""
    walls, cpus, after, fresh = [], [], [], 0
    value, _, _, _ = read(handle)
    now_s = time.monotonic()
    k = int((now_s - refresh_s) // period_s) + 2
    for _ in range(refreshes):
        expected_s = refresh_s + k * period_s
        time.sleep(max(0.0, expected_s + margin_s - time.monotonic()))
        new, start_s, end_s, cpu_s = read(handle)
        walls.append(end_s - start_s)
        cpus.append(cpu_s)
        after.append(end_s - expected_s)
        fresh += new != value
        value = new
        k += 1
    walls.sort()
    after.sort()
    return {
        "wall_p50_ms": 1e3 * statistics.median(walls),
        "wall_max_ms": 1e3 * walls[-1],
        "cpu_p50_ms": 1e3 * statistics.median(cpus),
        "done_p50_ms": 1e3 * statistics.median(after),
        "done_p90_ms": 1e3 * after[int(0.9 * (len(after) - 1))],
        "fresh": fresh / refreshes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--refreshes", type=int, default=40, help="reads per margin")
    parser.add_argument("--margins-ms", default="2,4,6,8,10,12,16")
    parser.add_argument("--period-ms", type=float, default=100.0)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    period_s = args.period_ms / 1e3
    print(
        "load | margin ms | read wall p50/max ms | read CPU p50 ms | "
        "done after refresh p50/p90 ms | fresh"
    )
    for loaded in (False, True):
        stop = threading.Event()
        worker = threading.Thread(target=_load, args=(None, stop), daemon=True) if loaded else None
        if worker is not None:
            worker.start()
            time.sleep(2.0)
        try:
            for margin_ms in (float(m) for m in args.margins_ms.split(",")):
                refresh_s = pin_refresh(handle, period_s)  # again: the phase drifts a little
                row = margin_run(handle, refresh_s, period_s, margin_ms / 1e3, args.refreshes)
                print(
                    f"{'bursts' if loaded else 'idle'} | {margin_ms:g} | "
                    f"{row['wall_p50_ms']:.2f}/{row['wall_max_ms']:.2f} | "
                    f"{row['cpu_p50_ms']:.2f} | "
                    f"{row['done_p50_ms']:.1f}/{row['done_p90_ms']:.1f} | {row['fresh']:.2f}"
                )
        finally:
            stop.set()
            if worker is not None:
                worker.join()
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()

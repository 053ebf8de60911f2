"""How true are the meter's window energies on short tasks? Bursts of GPU work from idle, each in
a window, against the truth read off the raw NVML counter around the whole series; Zeus's
ZeusMonitor measures the same bursts beside ours where it is installed.

Run on a machine with an NVIDIA GPU, torch and nvidia-ml-py:
`PYTHONPATH=src python3 benchmarks/power_truth.py --out truth.json` (add Zeus to the path to
compare). For each burst length (10 ms to 5 s of bf16 matmuls, each started from an idle GPU):
- truth: the counter at a refresh before the series and after it (the board back at idle),
  minus idle power (the counter over idle stretches before and after the series) times the
  time, divided by the number of bursts: the bursts' energy above idle, tails included;
- ours: each window's net energy (settled, tail included) and gross, and the sum of the
  series' windows against the counter over the series with the meter's own idle (conservation);
- Zeus: each window's energy minus the same idle power times its duration;
- what a window costs its caller (opening plus closing) and the sampler's CPU share.
Goals: net and gross within 3 % of the truth at every length, the sum within 1 %, the sampler
at most 2 % of a core, no window adding more than 1 ms to its caller.
"""

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from openjarvis.power import Meter
from openjarvis.power.nvml import discover_nvml

__all__ = ["main"]

# (burst seconds, bursts): more bursts where each carries few joules above idle.
SERIES = ((0.01, 100), (0.02, 80), (0.05, 60), (0.2, 30), (1.0, 10), (5.0, 4))
GAP_S = 0.5  # idle between bursts, as scoring leaves between tasks
SETTLE_S = 2.0  # before and after a series: the board back at idle
IDLE_S = 5.0  # idle stretches around each series, for the truth's idle power


@dataclass(slots=True)
class Row:
    burst_s: float
    bursts: int
    window_s: float  # mean window duration
    truth_net_j: float  # per burst, above idle, tail included
    truth_gross_j: float  # per burst: net plus idle over the window's duration
    meter_net_j: float | None  # mean over the series' windows
    meter_gross_j: float | None
    meter_tail_share: float | None  # the tails' part of the meter's net energy
    sum_vs_bracket: float | None  # the windows' net sum / the counter over the series (own idle)
    zeus_net_j: float | None
    caller_ms_median: float
    caller_ms_max: float
    sampler_core_share: float | None
    idle_w_before: float
    idle_w_after: float
    low_resolution_windows: int

    def ratio(self, value: float | None, truth: float) -> float | None:
        return None if value is None else value / truth


class Counter:
    """The raw NVML total-energy counter of one GPU, read at its refreshes."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle

    def read_j(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1000.0

    def at_refresh(self) -> tuple[float, float]:
        """(time, joules) right after the counter next steps: the value is then current."""
        first = self.read_j()
        while (value := self.read_j()) == first:
            pass
        return time.monotonic(), value

    def idle_w(self, seconds: float) -> float:
        start_s, start_j = self.at_refresh()
        time.sleep(seconds)
        end_s, end_j = self.at_refresh()
        return (end_j - start_j) / (end_s - start_s)


class Burster:
    """bf16 matmuls on one GPU, in bursts of a given length."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        for _ in range(50):
            self.a @ self.b
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            self.a @ self.b
        torch.cuda.synchronize()
        self.matmul_s = (time.perf_counter() - start) / 200

    def burst(self, seconds: float) -> None:
        for _ in range(max(1, round(seconds / self.matmul_s))):
            self.a @ self.b
        self.torch.cuda.synchronize()


def _thread_cpu_s(native_id: int) -> float:
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _zeus(gpu_index: int) -> Any:
    try:
        from zeus.monitor import ZeusMonitor
    except ImportError:
        return None
    return ZeusMonitor(gpu_indices=[gpu_index], approx_instant_energy=True)


def run_series(
    burst_s: float,
    bursts: int,
    meter: Meter,
    counter: Counter,
    burster: Burster,
    zeus: Any,
    sampler_cpu_s: Callable[[], float],
) -> Row:
    time.sleep(SETTLE_S)
    idle_before_w = counter.idle_w(IDLE_S)
    meter.measure_idle(IDLE_S)
    assert meter.idle is not None, "measure_idle sets the meter's idle"
    meter_idle_w = next(v for v in meter.idle.power_w.values() if v is not None)
    time.sleep(SETTLE_S)
    start_s, start_j = counter.at_refresh()
    cpu_start_s, wall_start_s = sampler_cpu_s(), time.monotonic()
    handles, caller_s, zeus_j = [], [], []
    for index in range(bursts):
        time.sleep(GAP_S)
        if zeus is not None:
            zeus.begin_window(f"burst{index}", sync_execution=False)
        opened = time.perf_counter()
        window = meter.window("burst")
        handle = window.__enter__()
        caller = time.perf_counter() - opened
        burster.burst(burst_s)
        closing = time.perf_counter()
        window.__exit__(None, None, None)
        caller_s.append(caller + time.perf_counter() - closing)
        handles.append(handle)
        if zeus is not None:
            measurement = zeus.end_window(f"burst{index}", sync_execution=False)
            zeus_j.append((measurement.total_energy, measurement.time))
    time.sleep(SETTLE_S)
    meter.settle()
    end_s, end_j = counter.at_refresh()
    cpu_share = (sampler_cpu_s() - cpu_start_s) / (time.monotonic() - wall_start_s)
    idle_after_w = counter.idle_w(IDLE_S)
    idle_w = 0.5 * (idle_before_w + idle_after_w)
    results = [handle.result for handle in handles]
    window_s = statistics.fmean(r.duration_s for r in results)
    truth_net_j = ((end_j - start_j) - idle_w * (end_s - start_s)) / bursts
    nets = [r.net_energy_j for r in results if r.net_energy_j is not None]
    grosses = [r.energy_j for r in results if r.energy_j is not None]
    tails = [r.tail_energy_j for r in results if r.tail_energy_j is not None]
    known = len(nets) == len(grosses) == len(results)
    net_j = sum(nets)
    bracket_j = (end_j - start_j) - meter_idle_w * (end_s - start_s)
    zeus_net = (
        statistics.fmean(energy - idle_w * seconds for energy, seconds in zeus_j)
        if zeus_j
        else None
    )
    return Row(
        burst_s=burst_s,
        bursts=bursts,
        window_s=window_s,
        truth_net_j=truth_net_j,
        truth_gross_j=truth_net_j + idle_w * window_s,
        meter_net_j=statistics.fmean(nets) if known else None,
        meter_gross_j=statistics.fmean(grosses) if known else None,
        meter_tail_share=(
            sum(tails) / net_j if known and len(tails) == len(results) and net_j else None
        ),
        sum_vs_bracket=net_j / bracket_j if known else None,
        zeus_net_j=zeus_net,
        caller_ms_median=1000 * statistics.median(caller_s),
        caller_ms_max=1000 * max(caller_s),
        sampler_core_share=cpu_share,
        idle_w_before=idle_before_w,
        idle_w_after=idle_after_w,
        low_resolution_windows=sum(r.low_resolution for r in results),
    )


def print_table(rows: Sequence[Row]) -> None:
    def fmt(value: float | None, spec: str = ".3f") -> str:
        return "—" if value is None else format(value, spec)

    print(
        "| burst | n | truth net J | ours net ÷ true | ours gross ÷ true | Zeus net ÷ true "
        "| sum ÷ bracket | tail share | caller ms (median / max) | sampler % core |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        share = None if row.sampler_core_share is None else 100 * row.sampler_core_share
        print(
            f"| {row.burst_s:g} s | {row.bursts} | {row.truth_net_j:.2f} "
            f"| {fmt(row.ratio(row.meter_net_j, row.truth_net_j))} "
            f"| {fmt(row.ratio(row.meter_gross_j, row.truth_gross_j))} "
            f"| {fmt(row.ratio(row.zeus_net_j, row.truth_net_j))} "
            f"| {fmt(row.sum_vs_bracket, '.4f')} | {fmt(row.meter_tail_share, '.2f')} "
            f"| {row.caller_ms_median:.3f} / {row.caller_ms_max:.3f} "
            f"| {fmt(share, '.2f')} |"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("power_truth.json"))
    parser.add_argument("--lengths", default="", help="comma-separated burst seconds (default all)")
    args = parser.parse_args(argv)
    import pynvml
    import torch

    chosen = {float(x) for x in args.lengths.split(",") if x}
    series = [s for s in SERIES if not chosen or s[0] in chosen]
    (gpu,) = discover_nvml(None, gpus=(0,)).sources
    pynvml.nvmlInit()
    counter = Counter(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
    burster = Burster(torch)
    zeus = _zeus(0)
    rows = []
    with Meter([gpu], "accelerator") as meter:
        thread = meter._thread
        assert thread is not None and thread.native_id is not None
        native_id = thread.native_id
        for burst_s, bursts in series:
            row = run_series(
                burst_s, bursts, meter, counter, burster, zeus, lambda: _thread_cpu_s(native_id)
            )
            rows.append(row)
            print(json.dumps(asdict(row)), flush=True)
        refresh = meter._tracks[0].refresh
        period_s = refresh.period_s if refresh is not None else None
    result = {
        "gpu": gpu.describe(),
        "refresh_period_s": period_s,
        "matmul_s": burster.matmul_s,
        "zeus": zeus is not None,
        "rows": [asdict(row) for row in rows],
    }
    args.out.write_text(json.dumps(result, indent=2))
    print(f"refresh period learned: {period_s}; zeus: {zeus is not None}")
    print_table(rows)


if __name__ == "__main__":
    main()

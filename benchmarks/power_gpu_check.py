"""GPU check of the energy meter: window energy vs the raw NVML counter and vs integrated power.

Run on a machine with NVIDIA GPUs, torch and nvidia-ml-py:
`PYTHONPATH=src python3 benchmarks/power_gpu_check.py --out gpu.json`.

What it measures, in one run (a bf16 8192^3 matmul loop is the load):
- idle power before CUDA starts, right after CUDA starts, and after a settle time;
- how often each NVML reading updates (energy counter, instantaneous power field, the
  nvmlDeviceGetPowerUsage reading) and what one call costs;
- on GPU 0 alone, then on all visible GPUs loaded at once: windows that open on an idle GPU and
  close when the load ends (a task's window) and windows inside a steady load. For each, the
  meter's window energy (counter) against the counter read directly around the window (goal:
  within 1 %) and against power integrated by the meter's sampler at its default rate, from
  the instantaneous field (goal: within 3 %) and, for comparison, from the 1-s average.
"""

import argparse
import itertools
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from openjarvis.power import Meter, PowerSample, WindowEnergy
from openjarvis.power.nvml import NvmlGpu, NvmlReading, discover_nvml, has_instant_power

__all__ = ["main"]

MATRIX_SIZE = 8192
MATMULS_PER_SYNC = 40  # ~55 ms of work per GPU between synchronisations


@dataclass(slots=True)
class GpuSet:
    """The sources of the GPUs in one scenario: per GPU, one source per NVML reading."""

    counters: list[NvmlGpu]
    instants: list[NvmlGpu]
    averages: list[NvmlGpu]
    torch_indices: list[int]

    def all_sources(self) -> list[NvmlGpu]:
        return self.counters + self.instants + self.averages


@dataclass(slots=True)
class WindowRow:
    """One measured window: joules by each way of reading, summed over the scenario's GPUs."""

    gpus: int
    kind: str  # "from-idle": opens on idle GPUs, closes when the load ends; "steady": in load
    duration_s: float
    meter_counter_j: float | None
    raw_counter_j: float
    instant_integrated_j: float | None
    average_integrated_j: float | None
    low_resolution: bool
    per_gpu: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def percent_off(self, other_j: float | None) -> float | None:
        """(other - meter) / meter in percent: how far another reading is from the meter's."""
        if other_j is None or not self.meter_counter_j:
            return None
        return 100.0 * (other_j - self.meter_counter_j) / self.meter_counter_j


class MatmulLoad:
    """Keeps the first `count` of its GPUs busy with bf16 matmuls from a thread until `stop()`."""

    def __init__(self, torch: Any, devices: Sequence[int]) -> None:
        self._torch = torch
        self._devices = list(devices)
        shape = (MATRIX_SIZE, MATRIX_SIZE)
        self._operands = [
            (
                torch.randn(shape, device=f"cuda:{index}", dtype=torch.bfloat16),
                torch.randn(shape, device=f"cuda:{index}", dtype=torch.bfloat16),
            )
            for index in self._devices
        ]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.matmuls = 0

    def synchronize(self) -> None:
        for index in self._devices:
            self._torch.cuda.synchronize(index)

    def start(self, count: int | None = None) -> None:
        self._stop.clear()
        operands = self._operands[:count]
        self._thread = threading.Thread(
            target=self._run, args=(operands,), name="matmul-load", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Returns once every queued matmul has finished, so the GPUs are idle again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.synchronize()

    def _run(self, operands: list[tuple[Any, Any]]) -> None:
        while not self._stop.is_set():
            # Queue work on every GPU before waiting, so all of them run at once.
            for a, b in operands:
                for _ in range(MATMULS_PER_SYNC):
                    a @ b
            self.matmuls += MATMULS_PER_SYNC * len(operands)
            self.synchronize()


def _counter_j(nvml: Any, sources: Sequence[NvmlGpu]) -> list[float]:
    """The energy counters read directly through pynvml, bypassing the meter."""
    return [nvml.nvmlDeviceGetTotalEnergyConsumption(gpu._handle) / 1000.0 for gpu in sources]


def _twin(nvml: Any, counter: NvmlGpu, reading: NvmlReading, suffix: str) -> NvmlGpu:
    """A second source on the same GPU that reads power instead of the counter."""
    twin = NvmlGpu(
        nvml,
        counter._handle,
        uuid=counter.uuid,
        gpu_name=counter.gpu_name,
        power_limit_w=counter.power_limit_w,
        reading=reading,
    )
    twin.name = f"{counter.name}/{suffix}"
    return twin


def _energy(result: WindowEnergy, names: Sequence[str]) -> tuple[float | None, dict[str, Any]]:
    by_name = {source.source: source for source in result.sources}
    values = {name: by_name[name].energy_j for name in names}
    known = [value for value in values.values() if value is not None]
    total = sum(known) if len(known) == len(values) else None
    return total, values


def measure_window(
    nvml: Any, meter: Meter, gpus: GpuSet, load: MatmulLoad, kind: str, load_s: float, warm_s: float
) -> WindowRow:
    """One window of `kind`; the load runs `load_s` inside it (plus `warm_s` before, if steady)."""
    count = len(gpus.counters)
    if kind == "steady":
        load.start(count)
        time.sleep(warm_s)
    raw_start = _counter_j(nvml, gpus.counters)
    with meter.window(kind) as window:
        if kind == "from-idle":
            load.start(count)
        time.sleep(load_s)
        if kind == "from-idle":
            load.stop()  # the task's work ends, then its window closes
    raw_end = _counter_j(nvml, gpus.counters)
    if kind == "steady":
        load.stop()
    result = window.result
    counter_j, counters = _energy(result, [gpu.name for gpu in gpus.counters])
    instant_j, instants = _energy(result, [gpu.name for gpu in gpus.instants])
    average_j, averages = _energy(result, [gpu.name for gpu in gpus.averages])
    per_gpu: dict[str, dict[str, float | None]] = {}
    for index, gpu in enumerate(gpus.counters):
        per_gpu[gpu.uuid] = {
            "meter_counter_j": counters[gpu.name],
            "raw_counter_j": raw_end[index] - raw_start[index],
            "instant_integrated_j": instants[gpus.instants[index].name],
            "average_integrated_j": averages[gpus.averages[index].name],
        }
    return WindowRow(
        gpus=len(gpus.counters),
        kind=kind,
        duration_s=result.duration_s,
        meter_counter_j=counter_j,
        raw_counter_j=sum(raw_end) - sum(raw_start),
        instant_integrated_j=instant_j,
        average_integrated_j=average_j,
        low_resolution=result.low_resolution,
        per_gpu=per_gpu,
    )


def update_period(read: Callable[[], float], seconds: float) -> dict[str, float | None]:
    """Poll a reading as fast as possible; the median gap between changes is its period."""
    changes: list[float] = []
    reads = 0
    last = read()
    deadline_s = time.monotonic() + seconds
    while (now_s := time.monotonic()) < deadline_s:
        value = read()
        reads += 1
        if value != last:
            changes.append(now_s)
            last = value
    gaps = [later - earlier for earlier, later in itertools.pairwise(changes)]
    return {
        "median_ms": 1000 * statistics.median(gaps) if gaps else None,
        "p10_ms": 1000 * statistics.quantiles(gaps, n=10)[0] if len(gaps) > 10 else None,
        "p90_ms": 1000 * statistics.quantiles(gaps, n=10)[-1] if len(gaps) > 10 else None,
        "changes": len(changes),
        "call_ms": 1000 * seconds / reads if reads else None,
    }


def settle_curve(samples: list[PowerSample], names: set[str], start_s: float) -> list[float]:
    """Mean power of the named sources, summed, in 1-s bins from `start_s`."""
    bins: dict[int, dict[str, list[float]]] = {}
    for sample in samples:
        if sample.source in names and sample.time_s >= start_s:
            second = int(sample.time_s - start_s)
            bins.setdefault(second, {}).setdefault(sample.source, []).append(sample.power_w)
    curve = []
    for second in sorted(bins):
        per_source = bins[second]
        if len(per_source) == len(names):
            curve.append(sum(statistics.fmean(values) for values in per_source.values()))
    return curve


def _idle_w(meter: Meter, seconds: float, names: Sequence[str]) -> float | None:
    baseline = meter.measure_idle(seconds)
    values = [baseline.power_w.get(name) for name in names]
    known = [value for value in values if value is not None]
    return sum(known) if len(known) == len(values) else None


def torch_indices(torch: Any, uuids: Sequence[str]) -> tuple[list[int], str]:
    """CUDA device index of each NVML GPU, matched by UUID; else NVML's order, and says so."""
    try:
        cuda_uuids = [
            f"GPU-{torch.cuda.get_device_properties(index).uuid}".lower()
            for index in range(torch.cuda.device_count())
        ]
        return [cuda_uuids.index(uuid.lower()) for uuid in uuids], "uuid"
    except (AttributeError, ValueError):
        # Same order on one-model machines, or with CUDA_DEVICE_ORDER=PCI_BUS_ID.
        return list(range(len(uuids))), "nvml-order"


def _summary(rows: list[WindowRow]) -> dict[str, Any]:
    def worst(values: list[float | None]) -> float | None:
        known = [abs(value) for value in values if value is not None]
        return max(known) if known else None

    return {
        "windows": len(rows),
        "max_abs_percent_raw_counter": worst([row.percent_off(row.raw_counter_j) for row in rows]),
        "max_abs_percent_instant": worst(
            [row.percent_off(row.instant_integrated_j) for row in rows]
        ),
        "max_abs_percent_average": worst(
            [row.percent_off(row.average_integrated_j) for row in rows]
        ),
    }


def _format(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def print_table(
    rows: list[WindowRow], idle: dict[str, Any], periods: Mapping[NvmlReading, Any]
) -> None:
    header = (
        f"{'GPUs':>4} {'window':<9} {'s':>5} {'meter J':>8} {'raw ctr':>7} "
        f"{'instant':>7} {'1-s avg':>7}"
    )
    print(header + "   (raw ctr, instant, 1-s avg: % off the meter's counter window)")
    for row in rows:
        print(
            f"{row.gpus:>4} {row.kind:<9} {row.duration_s:>5.2f} "
            f"{_format(row.meter_counter_j, '8.1f')} "
            f"{_format(row.percent_off(row.raw_counter_j), '+7.2f')} "
            f"{_format(row.percent_off(row.instant_integrated_j), '+7.2f')} "
            f"{_format(row.percent_off(row.average_integrated_j), '+7.2f')}"
        )
    for name, period in periods.items():
        print(
            f"update period {name}: median {_format(period['median_ms'], '.1f')} ms "
            f"(p10 {_format(period['p10_ms'], '.1f')}, p90 {_format(period['p90_ms'], '.1f')}), "
            f"one call {_format(period['call_ms'], '.2f')} ms"
        )
    print(
        "idle W (all GPUs): before CUDA "
        f"{_format(idle['before_cuda_w'], '.1f')}, right after CUDA starts "
        f"{_format(idle['after_cuda_w'], '.1f')}, after {idle['settle_s']:g} s "
        f"{_format(idle['settled_w'], '.1f')}; 1-s bins: "
        + " ".join(f"{value:.0f}" for value in idle["curve_w"])
    )


def run(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Fill `results` phase by phase, so a failure late in the run keeps what came before."""
    import pynvml

    found = discover_nvml(os.environ.get("CUDA_VISIBLE_DEVICES"))
    counters = [source for source in found.sources if isinstance(source, NvmlGpu)]
    if not counters or any(gpu.reading != "energy_counter" for gpu in counters):
        raise SystemExit(f"needs GPUs with NVML energy counters; found {found.statuses}")
    pynvml.nvmlInit()  # for the direct counter reads; the sources hold their own references
    instants = [_twin(pynvml, gpu, "instant_power", "instant") for gpu in counters]
    averages = [_twin(pynvml, gpu, "power_usage", "average") for gpu in counters]
    instant_ok = all(has_instant_power(pynvml, gpu._handle) for gpu in counters)
    everything = GpuSet(counters, instants, averages, torch_indices=[])
    counter_names = [gpu.name for gpu in counters]
    results["gpus"] = [gpu.describe() for gpu in counters]
    results["instant_field_supported"] = instant_ok
    results["driver"] = pynvml.nvmlSystemGetDriverVersion()

    # Idle before CUDA, right after it starts (what a runner that measures idle power just after
    # loading a model sees), and after a settle time; the sampler records the curve meanwhile.
    meter = Meter(everything.all_sources(), "accelerator")
    meter.start()
    before_cuda_w = _idle_w(meter, args.idle_s, counter_names)
    import torch

    everything.torch_indices, results["device_mapping"] = torch_indices(
        torch, [gpu.uuid for gpu in counters]
    )
    load = MatmulLoad(torch, everything.torch_indices)
    for a, b in load._operands:
        a @ b  # cuBLAS starts and picks its kernel, as a model's first step would
    load.synchronize()
    cuda_ready_s = time.monotonic()
    meter.drain_trace()
    after_cuda_w = _idle_w(meter, args.idle_s, counter_names)
    time.sleep(max(0.0, cuda_ready_s + args.settle_s - args.idle_s - time.monotonic()))
    settled_w = _idle_w(meter, args.idle_s, counter_names)
    curve = settle_curve(meter.drain_trace(), set(counter_names), cuda_ready_s)
    meter.stop()
    results["idle"] = {
        "before_cuda_w": before_cuda_w,
        "after_cuda_w": after_cuda_w,
        "settled_w": settled_w,
        "settle_s": args.settle_s,
        "idle_s": args.idle_s,
        "curve_w": curve,
    }

    # Update periods and call costs, on GPU 0 under load (values change at every update).
    load.start(1)
    time.sleep(1.0)
    periods = {
        source.reading: update_period(source.read, args.period_s)
        for source in (counters[0], instants[0], averages[0])
    }
    load.stop()
    results["update_periods"] = periods

    scenarios = [1] + ([len(counters)] if len(counters) > 1 else [])
    rows: list[WindowRow] = []
    for count in scenarios:
        gpus = GpuSet(
            counters[:count], instants[:count], averages[:count], everything.torch_indices[:count]
        )
        meter = Meter(gpus.all_sources(), "accelerator")
        meter.start()
        time.sleep(args.cooldown_s)
        for _ in range(args.repeats):
            rows.append(measure_window(pynvml, meter, gpus, load, "from-idle", args.load_s, 0))
            time.sleep(args.cooldown_s)
        rows.append(measure_window(pynvml, meter, gpus, load, "steady", args.load_s, args.warm_s))
        time.sleep(args.cooldown_s)
        meter.stop()
    results["windows"] = [
        asdict(row)
        | {
            "percent_raw_counter": row.percent_off(row.raw_counter_j),
            "percent_instant": row.percent_off(row.instant_integrated_j),
            "percent_average": row.percent_off(row.average_integrated_j),
        }
        for row in rows
    ]
    results["summary"] = {
        f"{count}_gpu": _summary([row for row in rows if row.gpus == count]) for count in scenarios
    }
    print_table(rows, results["idle"], periods)
    for gpu in everything.all_sources():
        gpu.close()
    pynvml.nvmlShutdown()


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the options, run the check, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write the results here (JSON)")
    parser.add_argument("--load-s", type=float, default=6.0, help="load inside each window")
    parser.add_argument("--warm-s", type=float, default=2.0, help="load before a steady window")
    parser.add_argument("--cooldown-s", type=float, default=2.5, help="idle between windows")
    parser.add_argument("--repeats", type=int, default=3, help="from-idle windows per GPU set")
    parser.add_argument("--idle-s", type=float, default=3.0, help="each idle measurement")
    parser.add_argument("--settle-s", type=float, default=20.0, help="idle after CUDA starts")
    parser.add_argument("--period-s", type=float, default=1.5, help="polling per reading")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"args": vars(args)}
    try:
        run(args, results)
    finally:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

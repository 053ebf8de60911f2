"""What the energy meter costs: its sampler's CPU time, and decode speed with the meter on vs off.

Run: `.venv/bin/python benchmarks/power_overhead.py --out overhead.json` (`--sampler-only` skips
the model, for machines without llama-cpp-python).

- Sampler CPU: CPU time of the meter's sampler thread (and of the whole process, whose main
  thread only sleeps) over `--seconds` at the default sampling rate, as a share of one core.
  Twice: with this machine's real sources, and with fake NVML GPUs (counter, instantaneous
  power, power usage) plus a fake RAPL tree (packages, DRAM, psys), so every kind is read.
- Decode: the embedded model, greedy, a fixed HumanEval-like prompt (its KV cache reused), 128
  tokens; pairs of requests with the meter on (sampler running, the request inside a window)
  and off, the order alternating from pair to pair so that drift hits both sides alike.
  Prints on/off ratios of decode tokens/s.
"""

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from openjarvis.power import Meter

# The fakes live in tests/fakes, importable from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["main"]

PROMPT = '''from typing import List


def running_maximum(values: List[int]) -> List[int]:
    """Return a list whose i-th item is the largest of values[0], ..., values[i].

    >>> running_maximum([1, 3, 2, 5, 4])
    [1, 3, 3, 5, 5]
    >>> running_maximum([])
    []
    """
'''


def _sampler_thread_cpu_s() -> float | None:
    """User + system CPU seconds of the running meter's sampler thread (found by its name)."""
    thread = next((t for t in threading.enumerate() if t.name == "power-sampler"), None)
    if thread is None or thread.native_id is None:
        return None
    for entry in psutil.Process().threads():
        if entry.id == thread.native_id:
            return entry.user_time + entry.system_time
    return None


def sampler_cpu(meter: Meter, seconds: float) -> dict[str, Any]:
    """Run the sampler for `seconds` while this thread sleeps; its CPU share of one core."""
    sources = [(source.name, source.sample_period_s) for source in meter.sources]
    quiet_start = time.process_time()
    time.sleep(min(5.0, seconds / 4))  # what the process costs without the sampler
    quiet_cpu_s = time.process_time() - quiet_start
    quiet_wall_s = min(5.0, seconds / 4)
    meter.start()
    thread_start_s = _sampler_thread_cpu_s()
    process_start_s, wall_start_s = time.process_time(), time.monotonic()
    time.sleep(seconds)
    process_cpu_s = time.process_time() - process_start_s
    wall_s = time.monotonic() - wall_start_s
    thread_end_s = _sampler_thread_cpu_s()
    meter.stop()
    samples = len(meter.drain_trace())
    thread_cpu_s = (
        None if thread_start_s is None or thread_end_s is None else thread_end_s - thread_start_s
    )
    process_share = process_cpu_s / wall_s - quiet_cpu_s / quiet_wall_s
    return {
        "sources": sources,
        "wall_s": wall_s,
        "trace_samples": samples,
        "thread_cpu_s": thread_cpu_s,
        "thread_percent_of_core": None if thread_cpu_s is None else 100 * thread_cpu_s / wall_s,
        "process_percent_of_core": 100 * process_share,
    }


@contextmanager
def fake_hardware() -> Iterator[Path]:
    """Fake pynvml (three GPUs, one per NVML reading) and a fake RAPL tree; yields its root."""
    from tests.fakes.nvml import FakeGpu, FakeNvml
    from tests.fakes.sysfs import two_sockets

    gpus = [
        FakeGpu("GPU-aaaa0000-0000-0000-0000-000000000000"),
        FakeGpu("GPU-bbbb0000-0000-0000-0000-000000000000", energy_mj=None),
        FakeGpu(
            "GPU-cccc0000-0000-0000-0000-000000000000", energy_mj=None, instant_power_field=False
        ),
    ]
    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = FakeNvml(gpus)
    try:
        with tempfile.TemporaryDirectory() as root:
            tree = two_sockets(Path(root))
            tree.add_zone("intel-rapl:2", "psys")
            yield Path(root)
    finally:
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved


def sampler_runs(seconds: float) -> dict[str, Any]:
    """The sampler's cost with the real sources, then with every kind of source faked."""
    runs: dict[str, Any] = {}
    meter = Meter.discover("system")
    try:
        runs["real"] = sampler_cpu(meter, seconds)
    finally:
        meter.close()
    with fake_hardware() as root:
        meter = Meter.discover("system", sysfs_root=root)
        try:
            runs["fakes"] = sampler_cpu(meter, seconds)
        finally:
            meter.close()
    return runs


def decode_rate(generate: Callable[[], Any]) -> tuple[float, int]:
    """Decode tokens/s of one request (METRICS.md: tokens after the first / their time)."""
    completion = generate()
    if completion.decode_s is None or completion.completion_tokens < 2:
        raise SystemExit("the model stopped before a second token: no decode rate to compare")
    return (completion.completion_tokens - 1) / completion.decode_s, completion.completion_tokens


def decode_pairs(pairs: int, max_tokens: int, threads: int | None) -> dict[str, Any]:
    """Meter on vs off around the same greedy request, interleaved, order alternating."""
    from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings
    from openjarvis.runtime.models import resolve_model
    from openjarvis.runtime.types import GenerationRequest

    model = resolve_model(None)
    # The prompt's KV cache is reused from request to request: only decode is compared, and
    # skipping the repeated prefill leaves time for more pairs.
    engine = LlamaCppEngine(
        model.path, LlamaCppSettings(n_threads=threads, reuse_prompt_cache=True)
    )
    request = GenerationRequest(prompt=PROMPT, max_tokens=max_tokens)
    meter = Meter.discover("system")

    def metered() -> Any:
        meter.start()
        try:
            with meter.window("decode"):
                return engine.generate(request)
        finally:
            meter.stop()

    try:
        decode_rate(lambda: engine.generate(request))  # warm-up: caches, page faults
        rows: list[dict[str, Any]] = []
        for index in range(pairs):
            order = ("on", "off") if index % 2 == 0 else ("off", "on")
            rates: dict[str, float] = {}
            tokens: dict[str, int] = {}
            for mode in order:
                run = metered if mode == "on" else (lambda: engine.generate(request))
                rates[mode], tokens[mode] = decode_rate(run)
            rows.append({"order": order, "rates": rates, "tokens": tokens})
            print(f"pair {index + 1}/{pairs}: on {rates['on']:.1f}, off {rates['off']:.1f} tok/s")
    finally:
        meter.close()
        engine.close()
    ratios = [row["rates"]["on"] / row["rates"]["off"] for row in rows]
    on = [row["rates"]["on"] for row in rows]
    off = [row["rates"]["off"] for row in rows]
    return {
        "model": model.name,
        "sources": [source.name for source in meter.sources],
        "threads": engine.settings.resolved_threads(),
        "pairs": rows,
        "ratio_median": statistics.median(ratios),
        "ratio_geometric_mean": statistics.geometric_mean(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_of_medians": statistics.median(on) / statistics.median(off),
        "on_median_tok_s": statistics.median(on),
        "off_median_tok_s": statistics.median(off),
        "load_average": psutil.getloadavg(),
    }


def _print(results: dict[str, Any]) -> None:
    for name, run in results["sampler"].items():
        thread = run["thread_percent_of_core"]
        print(
            f"sampler, {name} sources ({len(run['sources'])}): thread "
            f"{'—' if thread is None else f'{thread:.3f}'} % of a core, process "
            f"{run['process_percent_of_core']:.3f} %, {run['trace_samples']} samples "
            f"in {run['wall_s']:.1f} s"
        )
    decode = results.get("decode")
    if decode:
        print(
            f"decode tok/s, meter on vs off, {len(decode['pairs'])} pairs: on "
            f"{decode['on_median_tok_s']:.1f}, off {decode['off_median_tok_s']:.1f} (medians); "
            f"ratio median {decode['ratio_median']:.4f}, geometric mean "
            f"{decode['ratio_geometric_mean']:.4f}, range {decode['ratio_min']:.4f}-"
            f"{decode['ratio_max']:.4f}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the options, measure, print a summary, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write the results here (JSON)")
    parser.add_argument("--seconds", type=float, default=20.0, help="sampler run per setup")
    parser.add_argument("--pairs", type=int, default=12, help="on/off pairs of requests")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads")
    parser.add_argument("--sampler-only", action="store_true", help="skip the decode test")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"args": vars(args), "cpus": psutil.cpu_count()}
    try:
        results["sampler"] = sampler_runs(args.seconds)
        if not args.sampler_only:
            results["decode"] = decode_pairs(args.pairs, args.max_tokens, args.threads)
        _print(results)
    finally:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""What splitting the counter by a batching engine's step ledger costs the meter, per second of
load, with 1 to 64 requests in flight: the accountant's CPU time (the meter's own
`accounting_cpu_s`) over simulated time, as a share of one core.

A fake GPU counter (NVML's, refreshed every 100 ms) on a fake clock, and an engine that runs
decode steps of `--step-ms` back to back over the requests in flight, each request `--tokens`
steps long and replaced by a new one when it ends (requests staggered, as clients' are). The
sampler is driven by hand: it reads the counter when the delay its last poll returned has
passed, or at once when the meter wakes it (a window's end that moves a read earlier, a step
landing that a pass waited for), as its thread would. The clock is fake, so the CPU per
simulated second is what the same work would cost in real time; the script's own engine loop
is not counted. With `--readers`, each request's result is read as it ends, as a server reads
every reply's, waking the sampler as `Meter._wait_published` once did (one more pass each).

Run: `.venv/bin/python benchmarks/power_accounting.py [--seconds 10] [--step-ms 3]`; as the
H200's server loads it: `--step-ms 1.4 --first-token --prompt-tokens 150` (its meter's CPU
estimate too on a machine without RAPL: `--estimate-cpu`). Run it at two commits to compare
them, interleaved (docs/benchmarks.md).
"""

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from openjarvis.power import Meter, WindowHandle
from openjarvis.runtime.ledger import StepLedger, WorkPiece

# The fakes live in tests/fakes, importable from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fakes.clock import FakeClock
from tests.fakes.nvml import FakeGpu, SteppingCounter, install_fake_nvml

__all__ = ["main"]

UUID = "GPU-aaaa1111-0000-0000-0000-000000000000"


class DrivenMeter(Meter):
    """A meter whose sampler is this script's loop once `driven`: it then wakes the sampler as
    it would its thread (instead of splitting in the caller's thread, as a meter without a
    sampler does)."""

    driven = False

    @property
    def running(self) -> bool:
        return self.driven


def accounting_share(
    in_flight: int,
    seconds: float,
    step_s: float,
    tokens: int,
    estimate_cpu: bool = False,
    readers: bool = False,
    first_token: bool = False,
    prompt_tokens: int = 0,
) -> tuple[float, float]:
    """The accountant's CPU seconds per simulated second with `in_flight` requests, and its
    passes per simulated second; with `estimate_cpu`, the CPU estimate beside the GPU's counter
    (read at every window's edge, as on a machine without a readable RAPL counter); with
    `readers`, the sampler woken at each request's end while its result is not published; with
    `first_token`, each request's first token marked at its first step's end (as a server
    does), so its energy is split into prefill and decode at publication; with `prompt_tokens`,
    each request's first step carries its prompt as rows of a decode step (as the torch engine
    admits prompts), a piece of its own with that many tokens' share."""
    patch = pytest.MonkeyPatch()
    try:
        clock = FakeClock()
        fake = install_fake_nvml(patch, [FakeGpu(UUID)])
        SteppingCounter(clock, fake.gpus[0], lambda t: 300.0, phase_s=0.037, step_s=step_s)
        meter = DrivenMeter.discover(
            "accelerator", "/nonexistent", estimate_cpu=estimate_cpu, clock=clock, sleep=clock.sleep
        )
        due_s = clock.now_s
        passes = 0

        def spend(span_s: float) -> None:
            nonlocal due_s, passes
            end_s = clock.now_s + span_s
            while clock.now_s < end_s - 1e-12:
                if meter._wake.is_set():  # woken: the sampler's thread would poll now
                    meter._wake.clear()
                    due_s = clock.now_s
                if clock.now_s >= due_s:
                    due_s = clock.now_s + max(meter.poll(), 1e-4)
                    passes += 1
                clock.advance(min(due_s, end_s) - clock.now_s)

        spend(0.5)
        meter.measure_idle(1.0)  # read by the caller: the meter is not driven yet
        assert meter.idle is not None and all(meter.idle.power_w.values())
        ledger = StepLedger(clock)
        meter.follow(ledger)
        ledger.busy()
        running: list[tuple[Any, WindowHandle, list[WorkPiece], list[int]]] = []

        def start(done: int) -> None:
            context = meter.window("request")
            handle = context.__enter__()
            work: list[WorkPiece] = []
            ledger.attach(handle.key, work)
            running.append((context, handle, work, [done]))

        for i in range(in_flight):
            start(i * tokens // in_flight)
        before_s, passes = meter.accounting_cpu_s, 0
        for _ in range(round(seconds / step_s)):
            start_s = clock.now_s
            spend(step_s)
            batch = len(running)
            fresh = sum(done[0] == 0 for *_, done in running) if prompt_tokens else 0
            tokens_in_step = batch - fresh + prompt_tokens * fresh
            piece = WorkPiece(start_s, clock.now_s, 1.0 / tokens_in_step, batch)
            for _, handle, work, done in running:
                if fresh and done[0] == 0:  # its prompt, as rows of the step: a piece of its own
                    work.append(
                        WorkPiece(start_s, clock.now_s, prompt_tokens / tokens_in_step, batch)
                    )
                else:
                    work.append(piece)
                if first_token and done[0] == 0:
                    handle.mark_first_token(clock.now_s)  # its first step was its prefill
                done[0] += 1
            ledger.landed(start_s, clock.now_s, 1.0)  # every row followed
            for entry in [e for e in running if e[3][0] >= tokens]:
                context, handle = entry[0], entry[1]
                context.__exit__(None, None, None)
                if readers and not handle.resolved.is_set():
                    meter._wake.set()  # its reader waits: the sampler used to be woken
                running.remove(entry)
                start(0)
        return (meter.accounting_cpu_s - before_s) / seconds, passes / seconds
    finally:
        patch.undo()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="of simulated load")
    parser.add_argument("--step-ms", type=float, default=3.0, help="one decode step")
    parser.add_argument("--tokens", type=int, default=256, help="steps per request")
    parser.add_argument("--in-flight", default="1,8,32,64")
    parser.add_argument(
        "--estimate-cpu", action="store_true", help="the CPU estimate too (no RAPL, as a VM)"
    )
    parser.add_argument(
        "--readers",
        action="store_true",
        help="wake the sampler at each request's end, as a reader of its result once did",
    )
    parser.add_argument(
        "--first-token",
        action="store_true",
        help="mark each request's first token (a server's windows: prefill and decode energy)",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=0,
        help="each request's prompt joins its first step as rows (its own piece of the step)",
    )
    args = parser.parse_args()
    print("in flight | accounting, % of a core | passes/s")
    for in_flight in (int(n) for n in args.in_flight.split(",")):
        share, passes_per_s = accounting_share(
            in_flight,
            args.seconds,
            args.step_ms / 1e3,
            args.tokens,
            args.estimate_cpu,
            args.readers,
            args.first_token,
            args.prompt_tokens,
        )
        print(f"{in_flight:9d} | {100 * share:24.2f} | {passes_per_s:8.0f}")


if __name__ == "__main__":
    main()

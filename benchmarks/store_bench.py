"""Store and report speed: writing a 1,000,000-sample power trace, and `ipw report` over 200 runs.

Run from the repository root: `.venv/bin/python benchmarks/store_bench.py` (about two minutes,
most of it building the 200-run database). Prints each measurement beside its goal and, for the
trace, beside the one-row-per-sample layout it replaced (plain sqlite3 executemany), as ratios.
"""

import argparse
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.synthetic

from openjarvis.store import PowerSampleRecord, open_store
from tests.synthetic import add_run, make_host

__all__ = ["main"]

TRACE_SAMPLES = 1_000_000
TRACE_GOAL_S = 5.0
REPORT_RUNS = 200
REPORT_TASKS = 164
REPORT_GOAL_S = 3.0


def _trace(samples: int) -> list[PowerSampleRecord]:
    # Two sources at 100 Hz, as the meter writes them: one GPU and one CPU package.
    return [
        PowerSampleRecord(
            "nvml:GPU-0" if i % 2 else "rapl:package-0", (i // 2) * 0.01, 60.0 + i % 7
        )
        for i in range(samples)
    ]


class Timer:
    """Wall and CPU seconds of a block; CPU includes child processes waited for inside it."""

    def __enter__(self) -> "Timer":
        self._wall = time.perf_counter()
        self._cpu = self._cpu_now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = self._cpu_now() - self._cpu

    @staticmethod
    def _cpu_now() -> float:
        mine = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def time_store_trace(folder: Path, samples: list[PowerSampleRecord]) -> tuple[Timer, Timer]:
    """Writing the trace through Store.add_power_samples, and reading it back."""
    with open_store(str(folder / "trace.db")) as store:
        run_id = add_run(store, make_host("bench"), tasks=1)
        with Timer() as written:
            store.add_power_samples(run_id, samples)
        with Timer() as read:
            assert len(store.power_samples(run_id)) == len(samples)
        return written, read


def time_row_per_sample(folder: Path, samples: list[PowerSampleRecord]) -> Timer:
    """The replaced layout at its fastest: one row per sample, raw sqlite3, same pragmas."""
    connection = sqlite3.connect(folder / "rows.db")
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA foreign_keys = ON")
    connection.execute("CREATE TABLE run (id VARCHAR(32) PRIMARY KEY)")
    connection.execute(
        "CREATE TABLE power_sample (id INTEGER PRIMARY KEY, run_id VARCHAR(32) NOT NULL "
        "REFERENCES run (id) ON DELETE CASCADE, source VARCHAR(255) NOT NULL, "
        "time_s FLOAT NOT NULL, power_w FLOAT NOT NULL)"
    )
    connection.execute("CREATE INDEX ix_power_sample_run_id ON power_sample (run_id)")
    connection.execute("INSERT INTO run VALUES (?)", ("a" * 32,))
    connection.commit()
    with Timer() as timer, connection:
        connection.executemany(
            "INSERT INTO power_sample (run_id, source, time_s, power_w) VALUES (?, ?, ?, ?)",
            [("a" * 32, s.source, s.time_s, s.power_w) for s in samples],
        )
    connection.close()
    return timer


def build_runs_database(path: Path) -> None:
    """200 complete runs of 164 tasks on four hosts (one cloud), through the Store API."""
    hosts = [make_host(f"host-{i}", gpus=("NVIDIA H200 (GPU-a)",) * (i % 2)) for i in range(3)]
    with open_store(str(path)) as store:
        for i in range(REPORT_RUNS):
            cloud = i % 10 == 9
            add_run(
                store,
                None if cloud else hosts[i % 3],
                f"model-{i % 12}",
                engine="cloud" if cloud else "llamacpp",
                method="estimate" if cloud or i % 3 == 2 else "counter",
                tasks=REPORT_TASKS,
                accuracy=0.2 + 0.6 * ((i * 7) % 11) / 10,
                joules_per_task=20.0 * (1 + (i * 5) % 13),
                seed=i,
                trace_samples=20_000 if i >= REPORT_RUNS - 3 else 0,  # the newest: drawn
            )


def time_report(database: Path, out: Path, repeats: int) -> list[Timer]:
    """The whole `ipw report` command, process start included."""
    command = [sys.executable, "-m", "openjarvis", "report", "--db", str(database)]
    timers = []
    for _ in range(repeats):
        with Timer() as timer:
            subprocess.run([*command, "--out", str(out)], check=True, capture_output=True)
        timers.append(timer)
    return timers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions of each step")
    parser.add_argument("--runs-db", type=Path, help="reuse (or create) the 200-run database here")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="openjarvis-bench-") as scratch:
        folder = Path(scratch)
        samples = _trace(TRACE_SAMPLES)
        store_times, read_times, row_times = [], [], []
        for repeat in range(args.repeats):
            trial = folder / f"trace-{repeat}"
            trial.mkdir()
            written, read = time_store_trace(trial, samples)
            store_times.append(written)
            read_times.append(read)
            row_times.append(time_row_per_sample(trial, samples))
        database = args.runs_db or folder / "runs.db"
        if not database.exists():
            start = time.perf_counter()
            build_runs_database(database)
            print(
                f"built {REPORT_RUNS} runs x {REPORT_TASKS} tasks in "
                f"{time.perf_counter() - start:.0f} s (not timed below)"
            )
        report_times = time_report(database, folder / "report", args.repeats)

    print(f"\nmedian of {args.repeats}; load average {load_before} before, {os.getloadavg()} after")
    print(
        f"{'measurement':50} {'wall s':>7} {'cpu s':>6} {'goal':>5} {'wall/goal':>9} {'vs rows':>7}"
    )
    rows_wall = statistics.median(t.wall_s for t in row_times)
    for label, timers, goal in (
        ("add_power_samples, 1,000,000 samples (SQLite)", store_times, TRACE_GOAL_S),
        ("  baseline: one row per sample, raw executemany", row_times, None),
        ("power_samples, read back 1,000,000", read_times, None),
        ("ipw report, 200 runs x 164 tasks (whole command)", report_times, REPORT_GOAL_S),
    ):
        wall = statistics.median(t.wall_s for t in timers)
        cpu = statistics.median(t.cpu_s for t in timers)
        versus = f"{wall / goal:9.2f}" if goal else " " * 9
        rows = f"{wall / rows_wall:7.3f}" if timers is store_times else ""
        print(f"{label:50} {wall:7.2f} {cpu:6.2f} {goal or '':>5} {versus} {rows}")


if __name__ == "__main__":
    main()

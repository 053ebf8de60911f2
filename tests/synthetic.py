"""Synthetic runs written through the real Store API, for the report, CLI and merge tests.

Figures are computed by metrics from the synthetic tasks, as `ipw measure` would store them.
"""

import hashlib
import random
from datetime import datetime

from openjarvis.metrics import compute_figures, phase_energy, task_figures, window_flags
from openjarvis.store import (
    EnergyRecord,
    HostRecord,
    PowerSampleRecord,
    RequestLogRecord,
    RunRecord,
    Store,
    TaskResultRecord,
)

__all__ = ["add_run", "logged_request", "make_host"]


def make_host(hostname: str, gpus: tuple[str, ...] = ()) -> HostRecord:
    fingerprint = hashlib.sha256(f"{hostname}{gpus}".encode()).hexdigest()[:16]
    return HostRecord(
        fingerprint=fingerprint,
        hostname=hostname,
        cpu_model="AMD EPYC 9654" if gpus else "AMD EPYC 7B13",
        cpu_physical_cores=96 if gpus else 2,
        cpu_logical_cores=192 if gpus else 2,
        memory_bytes=(1_500 if gpus else 8) * 2**30,
        gpus=gpus,
        gpu_driver="560.35.03" if gpus else None,
        os="Linux-6.8.0-x86_64-with-glibc2.36",
    )


def _task(
    index: int, rng: random.Random, accuracy: float, joules: float, method: str, windows: bool
) -> TaskResultRecord:
    """HumanEval/index; with `windows`, the fields of a meter that keeps window edges: a tail
    of a tenth of the net energy (half for every 7th task from the 4th: a large tail), prefill a
    fifth of the energy, every 5th task overlapped, every 10th short (low resolution)."""
    passed = int(rng.random() < accuracy)
    energy_j = joules * rng.uniform(0.5, 1.5)
    latency_s = energy_j / 80.0
    tokens = rng.randint(50, 300)
    net_j = energy_j * 0.6
    reading = EnergyRecord(
        "gpu:0", "gpu", method, energy_j, net_j, 30.0, None, windows and index % 10 == 0
    )
    return TaskResultRecord(
        task_id=f"HumanEval/{index}",
        samples=1,
        passed=passed,
        latency_s=latency_s,
        ttft_s=0.05,
        decode_tokens_per_s=tokens / latency_s,
        prompt_tokens=120,
        completion_tokens=tokens,
        energy_j=energy_j,
        net_energy_j=net_j,
        energy_null_reason=None,
        completions=("def f():\n    return 1\n",),
        statuses=("passed",) if passed else ("failed: AssertionError",),
        energy=(reading,),
        tail_energy_j=net_j * (0.5 if index % 7 == 3 else 0.1) if windows else None,
        prefill_energy_j=energy_j * 0.2 if windows else None,
        decode_energy_j=energy_j * 0.8 if windows else None,
        overlapped=windows and index % 5 == 4,
    )


def add_run(
    store: Store,
    host: HostRecord | None,
    model: str = "gemma-3-270m",
    *,
    engine: str = "llamacpp",
    scope: str = "system",
    method: str = "counter",
    suite: str = "humaneval",
    tasks: int = 20,
    accuracy: float = 0.5,
    joules_per_task: float = 100.0,
    seed: int = 0,
    trace_samples: int = 0,
    state: str = "complete",
    coverage: dict[str, object] | None = None,  # energy_coverage; None: none recorded
    options: dict[str, object] | None = None,  # added to the run's options
    model_kind: tuple[str | None, str] | None = None,  # (kind, evidence); None: not read
    windows: bool = False,  # the meter's window fields, idle after and accounting in summary
) -> str:
    """A finished run with `tasks` synthetic tasks (HumanEval/0..n-1); returns its id.

    Without `windows` it is a run from before the meter kept tails, first-token splits, window
    flags, conservation and idle after the tasks; with it, each has a known value (see _task;
    idle drifts +1.5 W on gpu:0, and conservation is 0.996).
    """
    rng = random.Random(seed)
    if windows and coverage is None:
        coverage = {"in_scope": ["gpu:0"], "out_of_scope": [], "missing": {}}
    run_id = store.create_run(
        RunRecord(
            model_name=model,
            model_path=None if engine != "llamacpp" else f"/models/{model}.gguf",
            model_sha256=None
            if engine != "llamacpp"
            else hashlib.sha256(model.encode()).hexdigest(),
            engine=engine,
            engine_settings={"n_ctx": 4096} if engine == "llamacpp" else {"joules_per_token": 0.3},
            suite=suite,
            options={"limit": tasks, "samples": 1, **(options or {})},
            energy_scope=scope,
            energy_method=method,
            sandbox_isolation="bubblewrap",
            tool_version="0.1.0",
            host=host,
            model_quantisation="Q4_K_M" if engine == "llamacpp" else None,
            energy_coverage=coverage or {},
            model_kind=model_kind[0] if model_kind else None,
            model_kind_evidence=model_kind[1] if model_kind else None,
        )
    )
    records = [_task(i, rng, accuracy, joules_per_task, method, windows) for i in range(tasks)]
    if windows:  # a CPU package out of the scope drifts too: the report must leave it out
        store.set_idle_power(run_id, {"gpu:0": 30.0, "rapl:package-0": 12.0})
    for record in records:
        store.save_task_result(run_id, record)
    store.add_power_samples(
        run_id,
        [
            PowerSampleRecord("gpu:0", i * 0.1, 60.0 + 40.0 * rng.random())
            for i in range(trace_samples)
        ],
    )
    if state != "running":
        idle_error_w = 0.4 if windows and state == "complete" else None
        summary = compute_figures(
            [task_figures(r) for r in records], idle_error_w=idle_error_w
        ).to_dict()
        if windows and state == "complete":
            store.set_idle_power(run_id, {"gpu:0": 31.5, "rapl:package-0": 20.0}, after=True)
            net_j = sum(r.net_energy_j for r in records if r.net_energy_j is not None)
            summary |= {
                "idle_error_w": idle_error_w,
                "windows": window_flags(records),
                "conservation": {
                    "windows_net_j": net_j,
                    "bracket_net_j": net_j / 0.996,
                    "ratio": 0.996,
                },
                "phase_energy": phase_energy(records),
            }
        store.finish_run(run_id, state, summary if state == "complete" else None)
    return run_id


def logged_request(model: str, tokens: int, started_at: datetime) -> RequestLogRecord:
    """One `jarvis serve` request log row, its figures following from `tokens`."""
    return RequestLogRecord(
        endpoint="/v1/chat/completions",
        model_name=model,
        engine="llamacpp",
        stream=True,
        prompt_tokens=12,
        completion_tokens=tokens,
        finish_reason="stop",
        wall_s=0.5 + tokens / 100,
        ttft_s=0.1,
        decode_tokens_per_s=40.0,
        energy_j=3.0 * tokens,
        net_energy_j=2.0 * tokens,
        energy_method="counter",
        energy_scope="accelerator",
        energy_null_reason=None,
        shared=tokens % 2 == 0,
        mean_batch=2.0,
        started_at=started_at,
    )

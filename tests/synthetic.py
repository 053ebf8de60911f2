"""Synthetic runs written through the real Store API, for the report, CLI and merge tests.

Figures are computed by evals.metrics from the synthetic tasks, as `ipw measure` would store them.
"""

import hashlib
import random

from openjarvis.evals.metrics import compute_figures, task_figures
from openjarvis.store import (
    EnergyRecord,
    HostRecord,
    PowerSampleRecord,
    RunRecord,
    Store,
    TaskResultRecord,
)

__all__ = ["add_run", "make_host"]


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


def _task(task_id: str, rng: random.Random, accuracy: float, joules: float, method: str):
    passed = int(rng.random() < accuracy)
    energy_j = joules * rng.uniform(0.5, 1.5)
    latency_s = energy_j / 80.0
    tokens = rng.randint(50, 300)
    return TaskResultRecord(
        task_id=task_id,
        samples=1,
        passed=passed,
        latency_s=latency_s,
        ttft_s=0.05,
        decode_tokens_per_s=tokens / latency_s,
        prompt_tokens=120,
        completion_tokens=tokens,
        energy_j=energy_j,
        net_energy_j=energy_j * 0.6,
        energy_null_reason=None,
        completions=("def f():\n    return 1\n",),
        statuses=("passed",) if passed else ("failed: AssertionError",),
        energy=(EnergyRecord("gpu:0", "gpu", method, energy_j, energy_j * 0.6, 30.0, None, False),),
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
) -> str:
    """A finished run with `tasks` synthetic tasks (HumanEval/0..n-1); returns its id."""
    rng = random.Random(seed)
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
    records = [
        _task(f"HumanEval/{i}", rng, accuracy, joules_per_task, method) for i in range(tasks)
    ]
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
        summary = compute_figures([task_figures(r) for r in records]).to_dict()
        store.finish_run(run_id, state, summary if state == "complete" else None)
    return run_id

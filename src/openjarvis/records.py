"""The domain's records: a host, a run, its tasks, their energy and power samples.

Plain dataclasses that every room reads and the store saves and gives back (no SQL crosses this
border); a leaf, so the store, the evals and the report share them. Units are in the names; None
means unknown, with a reason.
"""

from dataclasses import dataclass, field
from datetime import datetime

__all__ = [
    "EnergyRecord",
    "HostRecord",
    "PowerSampleRecord",
    "RunRecord",
    "TaskResultRecord",
]


@dataclass(frozen=True, slots=True)
class HostRecord:
    """The machine a run was measured on. `fingerprint` is a stable hash of the rest."""

    fingerprint: str
    hostname: str
    cpu_model: str
    cpu_physical_cores: int | None  # None: the OS cannot tell
    cpu_logical_cores: int | None
    memory_bytes: int
    gpus: tuple[str, ...]  # "NVIDIA H200 (GPU-uuid)" per visible GPU
    gpu_driver: str | None
    os: str  # platform.platform()


@dataclass(slots=True)
class RunRecord:
    """One `ipw measure` run. `id` is assigned by the store (a uuid4 hex string)."""

    model_name: str
    model_path: str | None
    model_sha256: str | None
    engine: str  # "llamacpp"
    engine_settings: dict[str, object]
    suite: str  # "humaneval"
    options: dict[str, object]  # limit, samples, temperature, seed, idle_seconds, ...
    energy_scope: str  # "accelerator" | "system"
    energy_method: str | None  # weakest method over the run's sources
    sandbox_isolation: str  # "bubblewrap" | "namespaces" | "rlimits-only", see evals.sandbox
    tool_version: str
    state: str = "running"  # "running" | "complete" | "interrupted" | "failed"
    started_at: datetime | None = None
    finished_at: datetime | None = None
    idle_power_w: dict[str, float | None] = field(default_factory=dict)  # per source
    summary: dict[str, object] | None = None  # the figures of metrics, as JSON
    id: str | None = None
    host: HostRecord | None = None
    model_quantisation: str | None = None  # "Q4_K_M"; None when unknown or not quantised
    model_parameters: int | None = None  # parameter count, when known
    # "base" (pretrained) or "chat" (instruction-tuned), from the GGUF header; None: unknown
    # (cloud models, runs stored before it was read) with the evidence, when read, beside it.
    model_kind: str | None = None
    model_kind_evidence: str | None = None
    # Which energy sources the run covers: {"in_scope": [names], "out_of_scope": [names],
    # "missing": {name: reason}}; a missing source makes the run's scope partial.
    energy_coverage: dict[str, object] = field(default_factory=dict)
    idle_after_power_w: dict[str, float | None] = field(default_factory=dict)  # per source
    # The process measuring the run, and when it last said it is alive (None: unknown).
    process_host: str | None = None
    process_pid: int | None = None
    heartbeat_at: datetime | None = None
    concurrency: int = 1  # tasks in flight at once (`ipw measure --concurrency`)
    # The run's configuration (evals/config.py's RunConfig as JSON), which --resume reads back;
    # None for runs stored before it was.
    config: dict[str, object] | None = None
    # The suite's identity by content (evals/suites.py, content_sha256); None: stored before.
    suite_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class EnergyRecord:
    """One source's energy over one task's inference windows."""

    source: str
    domain: str  # "gpu" | "cpu" | "dram" | "platform"
    method: str  # "counter" | "integrated" | "estimate"
    energy_j: float | None
    net_energy_j: float | None
    idle_power_w: float | None
    null_reason: str | None
    low_resolution: bool


@dataclass(frozen=True, slots=True)
class TaskResultRecord:
    """One task of a run: its samples' outcome, timings, tokens and energy."""

    task_id: str
    samples: int  # n
    passed: int  # c, samples that passed
    latency_s: float  # tau_i: wall time of the inference windows, summed over samples
    ttft_s: float | None  # mean over samples
    decode_tokens_per_s: float | None  # mean over samples
    prompt_tokens: int  # summed over samples
    completion_tokens: int  # summed over samples
    energy_j: float | None  # E_i over the run's scope (None with energy_null_reason)
    net_energy_j: float | None
    energy_null_reason: str | None
    completions: tuple[str, ...]  # the text of each sample
    statuses: tuple[str, ...]  # sandbox status of each sample
    energy: tuple[EnergyRecord, ...] = ()
    # Above-idle energy after the task's windows until the next window opened (the device
    # winding down); already inside energy_j and net_energy_j.
    tail_energy_j: float | None = None
    prefill_energy_j: float | None = None  # window start to first token
    decode_energy_j: float | None = None  # first token to window end, with the tail
    overlapped: bool = False  # a window of the task overlapped another's
    # Its energy was split with tasks that ran at once, by the work each did (docs/energy.md),
    # and the time-weighted batch size of the engine steps it took part in (None: not reported).
    shared: bool = False
    mean_batch: float | None = None


@dataclass(frozen=True, slots=True)
class PowerSampleRecord:
    source: str
    time_s: float  # seconds since the run started
    power_w: float

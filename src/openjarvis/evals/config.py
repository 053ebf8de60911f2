"""The one configuration of an `ipw measure` run: what runs (engine, model, suite with its own
options, judge), how it is metered and how many tasks at once.

The CLI builds it once; `prepare` checks it against each engine's fixed capabilities and against
the suite's tasks before anything is opened or written; the run stores it as JSON and `--resume`
reads it back. After nano-vllm's `Config`: a slotted, frozen dataclass that checks itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from openjarvis.engine_kinds import ENGINE_KINDS, LOCAL_ENGINE_KINDS
from openjarvis.errors import UserError
from openjarvis.evals.harness import HarnessOptions, check_harness_tasks
from openjarvis.evals.judge import JudgeSpec, check_judge
from openjarvis.evals.suites import LoadedSuite, SuiteConfig, load_suite_config
from openjarvis.power.types import Scope
from openjarvis.runtime.cloud import check_meter_choice
from openjarvis.runtime.engines import CAPABILITIES, EngineSpec, resolve_engine_model
from openjarvis.runtime.models import ModelFile

__all__ = ["SEED_MAX", "PreparedRun", "RunConfig", "prepare"]

SEED_MAX = 2**32 - 1  # llama.cpp takes 32-bit seeds, and wraps larger ones silently


@dataclass(frozen=True, slots=True)
class RunConfig:
    engine: str = "llamacpp"  # or torch, or a cloud engine: openai, anthropic
    model: str | None = None  # local: GGUF path or catalog name (None: embedded); cloud: name
    suite: SuiteConfig = field(default_factory=SuiteConfig)
    judge: JudgeSpec | None = None  # scores the suite's open_ended tasks
    samples: int = 1
    temperature: float = 0.0
    seed: int = 0  # sample i uses seed + i
    # Tasks in flight at once (at most the engine's capability); above 1 their windows overlap
    # and share the energy by the work each did (docs/energy.md, "Shared energy").
    concurrency: int = 1
    timeout_s: float = 10.0  # each program's tests
    n_ctx: int = 4096
    threads: int | None = None  # None: one per physical core
    tp: int = 1  # torch only: tensor-parallel GPUs
    n_gpu_layers: int = 0  # llamacpp only: layers offloaded to the GPU (-1: every layer)
    base_url: str | None = None  # cloud engines only
    api_key_env: str | None = None  # cloud engines only: the variable's name, never the key
    # openai engine: meter a server on this machine (local), estimate per token, or auto (local
    # when --base-url is this machine).
    meter: str = "auto"
    # The meter: its scope, the GPUs whose energy counts (the engine's, or every visible one),
    # the idle power measured first, and whether to measure beside another measurement of the
    # same sources (the run is then marked shared-machine: both claim the same joules).
    scope: Scope = "system"
    gpus: Literal["engine", "all"] = "engine"
    idle_seconds: float = 10.0
    allow_shared: bool = False

    def validate(self) -> None:
        """Every check that needs nothing but the options; `prepare` runs it first."""
        self.suite.check()
        if self.engine not in ENGINE_KINDS:
            raise UserError(f"unknown engine {self.engine!r}; use one of {', '.join(ENGINE_KINDS)}")
        if self.samples < 1:
            raise UserError(f"--samples must be at least 1 (got {self.samples})")
        if not self.temperature >= 0:  # NaN too
            raise UserError(
                f"--temperature must be 0 or more, 0 being greedy (got {self.temperature})"
            )
        if self.samples > 1 and self.temperature == 0:
            raise UserError("--samples above 1 needs --temperature above 0 (greedy repeats itself)")
        highest_seed = SEED_MAX - (self.samples - 1)
        if not 0 <= self.seed <= highest_seed:
            raise UserError(
                f"--seed must be 0 to {highest_seed} (sample i uses seed + i, a 32-bit number; "
                f"got {self.seed})"
            )
        if self.n_ctx < 1:
            raise UserError(f"--n-ctx must be at least 1 token (got {self.n_ctx})")
        if self.threads is not None and self.threads < 1:
            raise UserError(
                f"--threads must be at least 1 (got {self.threads}); leave it out for one per core"
            )
        if self.tp < 1:
            raise UserError(f"--tp must be at least 1 GPU (got {self.tp})")
        if self.n_gpu_layers < -1:
            raise UserError(
                f"--n-gpu-layers must be -1 (every layer), 0 (none) or more (got "
                f"{self.n_gpu_layers})"
            )
        if self.n_gpu_layers != 0 and self.engine != "llamacpp":
            raise UserError("--n-gpu-layers is for --engine llamacpp; drop it")
        if not 0 <= self.idle_seconds < math.inf:
            raise UserError(f"--idle-seconds must be 0 or more, finite (got {self.idle_seconds})")
        if not 0 < self.timeout_s < math.inf:
            raise UserError(f"--timeout must be above 0 seconds, finite (got {self.timeout_s})")
        if self.scope not in ("system", "accelerator"):
            raise UserError(
                f"unknown energy scope {self.scope!r}; use --scope system or --scope accelerator"
            )
        if self.gpus not in ("engine", "all"):
            raise UserError(f"--gpus takes engine or all (got {self.gpus!r})")
        check_meter_choice(self.engine, self.meter)
        self._check_concurrency()

    def _check_concurrency(self) -> None:
        if self.concurrency < 1:
            raise UserError(f"--concurrency must be at least 1 task (got {self.concurrency})")
        most = CAPABILITIES[self.engine].concurrency
        if self.concurrency > most:
            raise UserError(
                f"--concurrency {self.concurrency} is more than the {self.engine} engine runs "
                f"at once ({most}); use --concurrency {most} or less"
            )
        judge = self.judge
        if judge is not None and judge.engine in LOCAL_ENGINE_KINDS and self.concurrency > 1:
            # Its windows would overlap the judged model's, which then share their joules by work.
            raise UserError(
                f"a local judge ({judge.text()}) keeps its joules apart only between the judged "
                f"model's tasks; measure with --concurrency 1, or judge with a cloud engine"
            )

    def engine_spec(self) -> EngineSpec:
        # Every request starts from a cold cache so that each sample pays for its own prefill.
        return EngineSpec(
            kind=self.engine,
            model=self.model,
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            n_ctx=self.n_ctx,
            threads=self.threads,
            tp=self.tp,
            n_gpu_layers=self.n_gpu_layers,
            # The torch engine holds KV cache and start-up graphs for this many, not 64.
            concurrency=self.concurrency,
            reuse_prompt_cache=False,
            meter=self.meter,
        )

    def to_dict(self) -> dict[str, object]:
        """The configuration as JSON-ready data, as the run stores it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, stored: dict[str, Any]) -> RunConfig:
        """A stored configuration; options it lacks (added since) take their defaults."""
        unknown = set(stored) - {f.name for f in fields(cls)}
        if unknown:
            raise UserError(
                f"the run's configuration has options this ipw does not know "
                f"({', '.join(sorted(unknown))}); resume it with the version that started it"
            )
        values = dict(stored)
        suite = dict(values.pop("suite", {}))
        lm_eval = suite.pop("lm_eval", None)
        judge = values.pop("judge", None)
        options = None if lm_eval is None else HarnessOptions(**lm_eval)
        return cls(
            **values,
            suite=SuiteConfig(**suite, lm_eval=options),
            judge=None if judge is None else JudgeSpec(**judge),
        )


@dataclass(frozen=True, slots=True)
class PreparedRun:
    """A configuration that passed every check, with what the checks loaded: the suite (its
    tasks to run and its identity by content) and the model file (None for cloud engines)."""

    config: RunConfig
    suite: LoadedSuite
    model: ModelFile | None
    judge_model: ModelFile | None = None  # a local judge's model file (None: cloud, no judge)


def prepare(config: RunConfig) -> PreparedRun:
    """Check a run's configuration, all of it, before anything is opened or written: the
    options, the engine's fixed capabilities, the suite's tasks against the engine and the
    judge, and the model files (the judge's too). Any refusal is one UserError."""
    config.validate()
    config = _absolute_paths(config)
    suite = load_suite_config(config.suite, config.judge)
    check_harness_tasks(suite.tasks, config.engine)
    check_judge(config.judge, suite.name, suite.tasks)
    model = resolve_engine_model(config.engine_spec())
    judge = config.judge
    judge_model = None if judge is None else resolve_engine_model(judge.engine_spec())
    # Paths as provenance, absolute, so that --resume from another folder finds them.
    config = replace(config, suite=replace(config.suite, name=suite.location))
    if _is_path(config.model) and model is not None:
        config = replace(config, model=str(model.path))
    if judge is not None and _is_path(judge.model) and judge_model is not None:
        config = replace(config, judge=replace(judge, model=str(judge_model.path)))
    return PreparedRun(config, suite, model, judge_model)


def _is_path(model: str | None) -> bool:
    """A model given as a file (not the embedded default, a catalog name or a cloud name)."""
    return model is not None and Path(model).expanduser().exists()


def _absolute_paths(config: RunConfig) -> RunConfig:
    """The lm-eval task folder as an absolute path (a run's provenance; its content is what
    identifies the suite)."""
    options = config.suite.lm_eval
    if options is None or options.include is None:
        return config
    include = str(Path(options.include).expanduser().resolve())
    suite = replace(config.suite, lm_eval=replace(options, include=include))
    return replace(config, suite=suite)

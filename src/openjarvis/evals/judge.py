"""A judge model scores open-ended answers (open_ended tasks of a suite file, docs/suites.md).

Any engine may judge. Its prompt is stored with its version, and its verdicts, energy and cost
go to a run of their own (suite `judge-of:<run id>`): never into the judged model's figures.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openjarvis import __version__
from openjarvis.engine_kinds import ENGINE_KINDS
from openjarvis.errors import UserError
from openjarvis.evals.types import ExecutionResult, ExecutionStatus, Task
from openjarvis.runtime.cloud import measured_here
from openjarvis.runtime.engines import EngineSpec, open_engine
from openjarvis.runtime.model_kind import read_model_kind
from openjarvis.runtime.models import ModelFile
from openjarvis.runtime.types import (
    ChatMessage,
    ChatRequest,
    Completion,
    Engine,
    GenerationRequest,
    Request,
)

if TYPE_CHECKING:  # the store pulls in SQLAlchemy: `ipw suites` reads suite names through here
    from openjarvis.power import Meter, WindowHandle
    from openjarvis.power.types import WindowEnergy
    from openjarvis.records import RunRecord
    from openjarvis.store import Store

__all__ = [
    "JUDGE_PROMPT",
    "JUDGE_PROMPT_VERSION",
    "JUDGE_SUITE_PREFIX",
    "Judge",
    "JudgeSpec",
    "OpenJudge",
    "check_judge",
    "judge_run_id",
    "judging",
    "opened_judge",
    "parse_verdict",
]

# Bump the version with any change to the prompt: verdicts of two versions do not compare.
JUDGE_PROMPT_VERSION = "1"
JUDGE_PROMPT = """\
You are grading an answer to a question. Judge whether the answer is correct and answers
the question; a reference answer, when given, shows what a correct answer says.

Question:
{prompt}
{reference}
Answer to grade:
{answer}

Think briefly if you need to, then end with one line that is exactly VERDICT: PASS or
VERDICT: FAIL."""
_REFERENCE = "\nReference answer:\n{reference}\n"
_VERDICT = re.compile(r"VERDICT:\s*\**\s*(PASS|FAIL)\b", re.IGNORECASE)
_JUDGE_MAX_TOKENS = 256
JUDGE_SUITE_PREFIX = "judge-of:"  # the judge run's suite: judge-of:<judged run id>


@dataclass(frozen=True, slots=True)
class JudgeSpec:
    """`--judge ENGINE[:MODEL]`: llamacpp (the embedded model), llamacpp:/path.gguf, torch:...,
    openai:gpt-4o-mini, anthropic:claude-...; cloud engines take a base URL and key variable."""

    engine: str
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None

    @classmethod
    def parse(cls, text: str, base_url: str | None, api_key_env: str | None) -> JudgeSpec:
        engine, _, model = text.strip().partition(":")
        if engine not in ENGINE_KINDS:
            raise UserError(
                f"--judge {text!r}: unknown engine {engine!r}; write ENGINE[:MODEL] with an "
                f"engine of {', '.join(ENGINE_KINDS)}, e.g. --judge openai:gpt-4o-mini"
            )
        return cls(engine, model or None, base_url, api_key_env)

    def text(self) -> str:
        return self.engine + (f":{self.model}" if self.model else "")

    def engine_spec(self) -> EngineSpec:
        return EngineSpec(
            kind=self.engine,
            model=self.model,
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            reuse_prompt_cache=False,  # each verdict pays for its own prefill
        )


def judge_run_id(store: Store, run_id: str) -> str | None:
    """The run that holds the judge's verdicts (and energy) of run `run_id`; None: none."""
    found = store.list_runs(limit=1, suite=f"{JUDGE_SUITE_PREFIX}{run_id}")
    return found[0].id if found else None


def parse_verdict(reply: str) -> ExecutionStatus:
    """The last `VERDICT: PASS|FAIL` line of a judge's reply; "error" when it gave none."""
    found = _VERDICT.findall(reply)
    if not found:
        return "error"
    return "passed" if found[-1].upper() == "PASS" else "failed"


def judge_prompt(task: Task, answer: str) -> str:
    reference = _REFERENCE.format(reference=task.answer) if task.answer else ""
    return JUDGE_PROMPT.format(prompt=task.prompt.strip(), reference=reference, answer=answer)


# ---- the judge over a run ---------------------------------------------------------------------


@dataclass(slots=True)
class _Verdict:
    """One verdict whose energy window may still be settling (local judges)."""

    task_id: str
    status: ExecutionStatus
    completion: Completion
    window: WindowHandle | None  # None: a cloud judge, its energy an estimate


class Judge:
    """Gives verdicts with `engine` and saves each to the judge's own run in `store`.

    A local judge's requests run in windows of the judged run's meter, so the joules it draws
    stop the judged model's tails and are charged to the judge; a cloud judge's energy is its
    token estimate, and its cost what the API charged.
    """

    def __init__(self, engine: Engine, meter: Meter, store: Store, run_id: str, chat: bool):
        self.engine = engine
        self.run_id = run_id
        self._meter = meter
        self._store = store
        self._chat = chat  # put the prompt as a user turn (chat models, cloud APIs)
        self._pending: list[_Verdict] = []
        self._costs: list[float | None] = []
        # Verdict ids are the judged window's label, task#sample; a task judged again after a
        # resume (its verdict saved, the judged task not) keeps both, the later one marked "+".
        self._ids = {record.task_id for record in store.task_results(run_id)}
        self._samples: dict[str, int] = {}
        # Tasks in flight at once (--concurrency) ask a cloud judge from several threads.
        self._lock = threading.Lock()

    def bind(self, tasks: list[Task]) -> list[Task]:
        """The tasks, open_ended ones scored by this judge."""
        return [
            dataclasses.replace(task, procedure=_Judged(self, task))
            if task.kind == "open_ended"
            else task
            for task in tasks
        ]

    def verdict(self, task: Task, answer: str) -> ExecutionResult:
        started_s = time.perf_counter()
        prompt = judge_prompt(task, answer)
        request: Request = (
            ChatRequest((ChatMessage("user", prompt),), _JUDGE_MAX_TOKENS)
            if self._chat
            else GenerationRequest(prompt, _JUDGE_MAX_TOKENS)
        )
        local = measured_here(self.engine)  # a local engine, or a server on this machine
        window: WindowHandle | None = None
        if local:
            with self._meter.window(f"judge:{task.task_id}") as window:
                completion = self.engine.generate(request)
        else:
            completion = self.engine.generate(request)
        status = parse_verdict(completion.text)
        with self._lock:
            sample = self._samples[task.task_id] = self._samples.get(task.task_id, -1) + 1
            verdict_id = f"{task.task_id}#{sample}"
            while verdict_id in self._ids:
                verdict_id += "+"
            self._ids.add(verdict_id)
            self._pending.append(_Verdict(verdict_id, status, completion, window))
            self._costs.append(completion.cost_usd)
            self._save_settled()
        detail = "" if status == "passed" else f"judge: {completion.text.strip()[-200:]}"
        return ExecutionResult(status, detail, time.perf_counter() - started_s)

    def _save_settled(self) -> None:
        while self._pending:
            verdict = self._pending[0]
            energy = verdict.window.settled() if verdict.window is not None else None
            if verdict.window is not None and energy is None:
                return
            self._save(self._pending.pop(0), energy)

    def finish(self, state: str) -> None:
        """Save the verdicts still settling and close the judge's run with its figures."""
        from openjarvis.metrics import compute_figures, task_figures

        if self._pending:
            self._meter.settle()
            while self._pending:
                verdict = self._pending.pop(0)
                window = verdict.window.result if verdict.window is not None else None
                self._save(verdict, window)
        results = self._store.task_results(self.run_id)
        summary: dict[str, object] | None = None
        if state == "complete" and results:
            costs = self._costs
            summary = {
                **compute_figures([task_figures(r) for r in results]).to_dict(),
                "cost_usd": sum(c for c in costs if c is not None) if None not in costs else None,
            }
        self._store.finish_run(self.run_id, state, summary)

    def _save(self, verdict: _Verdict, window: WindowEnergy | None) -> None:
        from openjarvis.records import EnergyRecord, TaskResultRecord

        completion = verdict.completion
        estimate = completion.energy_estimate
        if window is not None:
            energy_j, net_j, reason = window.energy_j, window.net_energy_j, window.null_reason
            readings = tuple(
                EnergyRecord(
                    s.source,
                    s.domain,
                    s.method,
                    s.energy_j,
                    s.net_energy_j,
                    s.idle_power_w,
                    s.null_reason,
                    s.low_resolution,
                )
                for s in window.sources
            )
        elif estimate is not None:
            energy_j, net_j, reason = estimate.energy_j, None, None
            readings = (
                EnergyRecord(
                    estimate.source, "cloud", "estimate", estimate.energy_j, None, None, None, False
                ),
            )
        else:
            energy_j, net_j, reason, readings = None, None, "no-estimate", ()
        record = TaskResultRecord(
            task_id=verdict.task_id,
            samples=1,
            passed=int(verdict.status == "passed"),
            latency_s=window.duration_s if window is not None else completion.wall_s,
            ttft_s=completion.ttft_s,
            decode_tokens_per_s=completion.decode_tokens_per_s,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            energy_j=energy_j,
            net_energy_j=net_j,
            energy_null_reason=reason,
            completions=(completion.text,),
            statuses=(verdict.status,),
            energy=readings,
            tail_energy_j=window.tail_energy_j if window is not None else None,
            overlapped=window.overlapped if window is not None else False,
        )
        self._store.save_task_result(self.run_id, record)


@dataclass(frozen=True, eq=False)
class _Judged:
    """An open_ended task's procedure: the judged model answers as for any task (inside its
    window); the judge scores the answer afterwards (outside it)."""

    judge: Judge
    task: Task

    def answer(self, engine: Engine, request: Request) -> Completion:
        return engine.generate(request)

    def score(self, completion: str) -> ExecutionResult:
        return self.judge.verdict(self.task, completion)


@dataclass(frozen=True, slots=True)
class OpenJudge:
    """A judge's engine, opened beside the judged model's before anything is written."""

    spec: JudgeSpec
    model: ModelFile | None  # None: a cloud judge
    engine: Engine


@contextmanager
def opened_judge(spec: JudgeSpec | None, model: ModelFile | None) -> Iterator[OpenJudge | None]:
    """The judge's engine for the block (None: the run has no judge); `model` is what the
    run's preparation resolved (evals/config.py)."""
    if spec is None:
        yield None
        return
    engine = open_engine(spec.engine_spec(), model)
    try:
        yield OpenJudge(spec, model, engine)
    finally:
        engine.close()


@contextmanager
def judging(
    judge: OpenJudge | None, tasks: list[Task], meter: Meter, store: Store, run: RunRecord
) -> Iterator[list[Task]]:
    """The run's tasks with a judge bound to its open_ended ones (`run` is the judged run,
    already stored, its configuration checked: evals/config.py); the judge's run is created
    here, resumed with the judged run, and closed when the block ends."""
    if judge is None:
        yield tasks
        return
    from openjarvis.records import RunRecord

    spec, model, engine = judge.spec, judge.model, judge.engine
    kind = read_model_kind(model.path) if model is not None else None
    chat = model is None or (kind is not None and kind.kind == "chat")
    judge_suite = f"{JUDGE_SUITE_PREFIX}{run.id}"
    existing = judge_run_id(store, run.id or "")
    if existing is not None:
        run_id = existing
        store.resume_run(run_id)
    else:
        run_id = store.create_run(
            RunRecord(
                model_name=model.name if model is not None else engine.model_name,
                model_path=str(model.path) if model is not None else None,
                model_sha256=model.sha256 if model is not None else None,
                engine=engine.kind,
                engine_settings=engine.settings_dict(),
                suite=judge_suite,
                options={
                    "judges_run": run.id,
                    "judges_suite": run.suite,
                    "judge": spec.text(),
                    "judge_prompt": JUDGE_PROMPT,
                    "judge_prompt_version": JUDGE_PROMPT_VERSION,
                    "prompting": "chat-template" if chat else "completion",
                },
                energy_scope=run.energy_scope,
                energy_method=meter.method if measured_here(engine) else "estimate",
                sandbox_isolation="none: verdicts are text",
                tool_version=__version__,
                model_kind=kind.kind if kind is not None else None,
                idle_power_w=dict(run.idle_power_w),
                host=run.host,
                energy_coverage=dict(run.energy_coverage),
            )
        )
    verdicts = Judge(engine, meter, store, run_id, chat)
    state = "failed"
    try:
        yield verdicts.bind(tasks)
        state = "complete"
    except KeyboardInterrupt:
        state = "interrupted"
        raise
    finally:
        verdicts.finish(state)


def check_judge(spec: JudgeSpec | None, suite: str, tasks: Sequence[Task]) -> None:
    """open_ended tasks need a judge, and a judge needs open_ended tasks to judge."""
    open_ended = sum(task.kind == "open_ended" for task in tasks)
    if open_ended and spec is None:
        raise UserError(
            f"suite {suite} has {open_ended} open_ended task(s), which a judge model scores; "
            "give one with --judge ENGINE[:MODEL] (e.g. --judge openai:gpt-4o-mini)"
        )
    if spec is not None and not open_ended:
        raise UserError(
            f"--judge scores open_ended tasks and suite {suite} has none; leave --judge out"
        )

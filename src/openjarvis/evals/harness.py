"""EleutherAI's lm-evaluation-harness tasks as suites: `lm-eval:TASK[,TASK...]` (docs/harness.md).

Each document of a harness task becomes one Task: its procedure sends the harness's requests
(generation, and log-likelihood where the engine gives log-probabilities) inside the task's
energy window, and scores them with the harness's own filters and process_results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from openjarvis.errors import UserError
from openjarvis.evals.types import ExecutionResult, Task
from openjarvis.runtime.chat_template import ChatTemplate
from openjarvis.runtime.engines import CAPABILITIES
from openjarvis.runtime.types import (
    ChatMessage,
    ChatRequest,
    Completion,
    EnergyEstimate,
    Engine,
    GenerationRequest,
    Request,
    WorkPiece,
)

__all__ = [
    "FEWSHOT_SEED",
    "LOGPROB_ENGINE_KINDS",
    "SUITE_PREFIX",
    "ChatContext",
    "HarnessDocument",
    "HarnessOptions",
    "HarnessSuite",
    "check_harness_tasks",
    "harness_tasks",
    "is_harness_suite",
    "load_harness_suite",
]

SUITE_PREFIX = "lm-eval:"
# Engines that can score a continuation by log-likelihood: llama.cpp (evaluating the context,
# then the continuation token by token) and torch (logits at every position). Cloud APIs
# return no log-probabilities of a given prompt, so only generate_until tasks run on them.
LOGPROB_ENGINE_KINDS = tuple(kind for kind, can in CAPABILITIES.items() if can.logprobs)
# APIs with chat messages only: a generation's context goes as one user message.
_CHAT_ONLY_ENGINE_KINDS = ("anthropic",)
_DEFAULT_MAX_GEN_TOKENS = 256  # lm-eval's own default for generate_until
FEWSHOT_SEED = 1234  # lm-eval's default --seed for few-shot sampling


@dataclass(frozen=True, slots=True)
class HarnessOptions:
    """lm-eval's options that change a task's prompts (`ipw measure`'s flags of the same names):
    part of what a run of the suite means, stored with its configuration."""

    num_fewshot: int | None = None  # None: each task's own default (lm-eval's)
    include: str | None = None  # a folder of the user's own task YAML files (absolute)
    fewshot_seed: int = FEWSHOT_SEED
    # The prompt as chat messages, which the engine renders with the model's own template
    # (generation tasks); few-shot examples as turns of their own.
    apply_chat_template: bool = False
    fewshot_as_multiturn: bool = False
    system_instruction: str | None = None

    def check(self) -> None:
        """Values lm-eval would take badly; a UserError naming the flag."""
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise UserError(f"--num-fewshot must be 0 or more (got {self.num_fewshot})")
        if self.fewshot_seed < 0:
            raise UserError(f"--fewshot-seed must be 0 or more (got {self.fewshot_seed})")
        if self.fewshot_as_multiturn and not self.apply_chat_template:
            raise UserError("--fewshot-as-multiturn needs --apply-chat-template")


@dataclass(frozen=True, slots=True)
class HarnessSuite:
    """What an `lm-eval:` suite runs: the harness's tasks, documents per task, and the options
    that change their prompts."""

    tasks: tuple[str, ...]
    limit: int | None = None  # documents per task (lm-eval's --limit); None: all
    options: HarnessOptions = HarnessOptions()


def is_harness_suite(name: str) -> bool:
    return name.strip().lower().startswith(SUITE_PREFIX)


def harness_tasks(name: str) -> tuple[str, ...]:
    """The task names of an `lm-eval:TASK[,TASK...]` suite name; a bad one is a UserError."""
    body = name.strip()[len(SUITE_PREFIX) :]
    if "?" in body:
        raise UserError(
            f"suite {name!r}: lm-eval options are flags of ipw measure now (--num-fewshot, "
            "--lm-eval-include, --apply-chat-template, ...); write the suite as lm-eval:TASK"
        )
    tasks = tuple(t.strip() for t in body.split(",") if t.strip())
    if not tasks:
        raise UserError(
            f"suite {name!r} names no lm-eval task; write --suite lm-eval:TASK[,TASK...], "
            "e.g. lm-eval:arc_easy"
        )
    return tasks


def load_harness_suite(suite: HarnessSuite) -> list[Task]:
    """One Task per document of each named harness task, in the harness's order."""
    return list(_load(suite))


@functools.cache
def _load(suite: HarnessSuite) -> tuple[Task, ...]:
    lm_eval_tasks = _import_lm_eval()
    if suite.options.include is not None:
        _check_include(Path(suite.options.include))
    with _quiet():
        manager = _task_manager(lm_eval_tasks, suite)
        try:
            loaded = manager.load(list(suite.tasks))
        except KeyError as error:  # lm-eval's word for an unknown name
            raise UserError(
                f"lm-eval knows no task {_unknown(error, suite.tasks)!r}"
                + (f" (nor does {suite.options.include})" if suite.options.include else "")
                + "; check the name (`lm-eval ls tasks` lists them) or add its folder with "
                "--lm-eval-include DIR"
            ) from None
        except Exception as error:  # the harness or datasets failing to read a task
            raise UserError(
                f"lm-eval could not load {', '.join(suite.tasks)}: {_why(error)}"
            ) from error
        tasks: list[Task] = []
        for task_name, harness_task in loaded["tasks"].items():
            tasks += _documents(str(task_name), harness_task, suite)
    if not tasks:
        raise UserError(f"lm-eval tasks {', '.join(suite.tasks)} have no documents to run")
    return tuple(tasks)


def _import_lm_eval() -> Any:
    try:
        import lm_eval.tasks
    except ImportError as error:
        raise UserError(
            f"lm-eval suites need lm-evaluation-harness ({error}): "
            "pip install 'openjarvis[lm-eval]'"
        ) from None
    return lm_eval.tasks


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """lm-eval and datasets log and draw progress bars while loading; the CLI prints one line
    per task and errors on one line, so their chatter is kept off the terminal."""
    loggers = [logging.getLogger(name) for name in ("lm-eval", "lm_eval", "datasets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _task_manager(lm_eval_tasks: Any, suite: HarnessSuite) -> Any:
    """Indexing lm-eval's own thousands of task files takes half a minute: a suite whose tasks
    are all in the user's folder is looked up there alone."""
    include = suite.options.include
    if include is not None:
        own = _manager(lm_eval_tasks, include, include_defaults=False)
        if all(name in own.all_tasks or name.endswith(".yaml") for name in suite.tasks):
            return own
    return _manager(lm_eval_tasks, include, include_defaults=True)


@functools.cache
def _manager(lm_eval_tasks: Any, include: str | None, include_defaults: bool) -> Any:
    return lm_eval_tasks.TaskManager(include_path=include, include_defaults=include_defaults)


def _check_include(folder: Path) -> None:
    """The harness skips a task file it cannot parse without a word, and then calls its task
    unknown: every YAML file of the folder is read here first, so a broken one is named."""
    # The harness's own reader (private, stable in the pinned version): same tags, same errors.
    from lm_eval.tasks._yaml_loader import load_yaml

    if not folder.is_dir():
        raise UserError(f"--lm-eval-include {folder} is not a folder of lm-eval task YAML files")
    for path in sorted(folder.rglob("*.yaml")):
        try:
            load_yaml(path, resolve_func=False, recursive=False)
        except Exception as error:  # yaml's errors, or the harness's "not a mapping"
            mark = getattr(error, "problem_mark", None)
            where = f", line {mark.line + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise UserError(
                f"lm-eval task file {path}{where}: not a valid task file ({problem}); fix it or "
                "move it out of the --lm-eval-include folder"
            ) from error


def _unknown(error: KeyError, names: tuple[str, ...]) -> str:
    message = str(error.args[0]) if error.args else ""
    return next((name for name in names if f"'{name}'" in message), ", ".join(names))


def _why(error: BaseException) -> str:
    """The innermost cause's first line: datasets wraps the JSON error that says what is wrong."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__  # type: ignore[assignment]  # not None here
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _documents(name: str, harness_task: Any, suite: HarnessSuite) -> list[Task]:
    """Build the harness's requests for one task and group them by document."""
    if getattr(harness_task, "UNSAFE_CODE", False):
        raise UserError(
            f"lm-eval task {name} runs the model's code unsandboxed; run code suites such as "
            "humaneval with OpenJarvis's own sandbox (--suite humaneval)"
        )
    output_type = harness_task.OUTPUT_TYPE
    if output_type == "loglikelihood_rolling":
        raise UserError(
            f"lm-eval task {name} measures perplexity (loglikelihood_rolling), which has no "
            "accuracy per document; pick a multiple_choice or generate_until task"
        )
    metric, filter_name = _primary_metric(name, harness_task)
    options = suite.options
    if options.num_fewshot is not None and harness_task.get_config("num_fewshot") != 0:
        harness_task.set_config(key="num_fewshot", value=options.num_fewshot)
    elif harness_task.get_config("num_fewshot") is None:
        harness_task.set_config(key="num_fewshot", value=0)
    harness_task.set_fewshot_seed(seed=options.fewshot_seed)
    try:
        harness_task.build_all_requests(
            limit=suite.limit,
            rank=0,
            world_size=1,
            system_instruction=options.system_instruction,
            apply_chat_template=options.apply_chat_template,
            fewshot_as_multiturn=options.fewshot_as_multiturn,
            chat_template=_chat_messages if options.apply_chat_template else None,
            tokenizer_name="openjarvis-engine" if options.apply_chat_template else "",
        )
    except UserError:
        raise
    except Exception as error:  # a template or a dataset the harness cannot read
        raise UserError(
            f"lm-eval could not build the requests of task {name}: {_why(error)}"
        ) from error
    by_document: dict[int, list[Any]] = {}
    for instance in harness_task.instances:
        by_document.setdefault(instance.doc_id, []).append(instance)
    version = harness_task.VERSION
    tasks = []
    for doc_id, instances in by_document.items():
        instances.sort(key=lambda instance: instance.idx)
        document = HarnessDocument(
            harness_task=harness_task,
            task_name=name,
            version=None if version is None else str(version),
            metric=metric,
            filter_name=filter_name,
            num_fewshot=int(harness_task.get_config("num_fewshot") or 0),
            doc=instances[0].doc,
            instances=tuple(instances),
        )
        tasks.append(
            Task(
                task_id=f"{name}/{doc_id}",
                prompt=instances[0].args[0],  # a ChatContext under apply_chat_template
                kind="harness",
                procedure=document,
            )
        )
    return tasks


class ChatContext(str):
    """A prompt that lm-eval built as chat messages (apply_chat_template): their JSON, as its
    API models carry them, sent as a ChatRequest that the engine renders with its own template."""

    def messages(self) -> tuple[ChatMessage, ...]:
        return tuple(ChatMessage(m["role"], m["content"]) for m in json.loads(self))


def _chat_messages(chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """lm-eval's chat_template callable: the messages kept as JSON until an engine renders them."""
    if not add_generation_prompt:  # a gen_prefix: the answer's start written into the turn
        raise UserError(
            "this lm-eval task starts the model's answer itself (gen_prefix), which OpenJarvis "
            "does not send under a chat template; leave apply_chat_template out for it"
        )
    return ChatContext(json.dumps(chat_history, ensure_ascii=False))


def _primary_metric(name: str, harness_task: Any) -> tuple[str, str]:
    """The task's first metric and first filter: what lm-eval reports first for it. It must be
    averaged over documents (a per-document score), not computed over the corpus (BLEU)."""
    from lm_eval.api.metrics import mean

    aggregation = harness_task.aggregation()
    if not aggregation:
        raise UserError(f"lm-eval task {name} defines no metric")
    metric = next(iter(aggregation))
    if aggregation[metric] is not mean:
        raise UserError(
            f"lm-eval task {name}'s metric {metric} is computed over the whole corpus, not per "
            "document, so it has no accuracy per joule; pick a task scored per document "
            "(acc, exact_match, ...)"
        )
    filters = getattr(harness_task, "_filters", None) or []
    return metric, (filters[0].name if filters else "none")


# ---- the procedure of one document --------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HarnessDocument:
    """One document of a harness task: its requests, and the harness's scorer for them.

    The completion it produces is JSON: the task, its version, the metric, and the responses
    to each request (a [log-probability, greedy] pair or a generated text, per repeat); the
    store keeps it as the task's completion.
    """

    harness_task: Any  # lm_eval.api.task.ConfigurableTask
    task_name: str
    version: str | None
    metric: str
    filter_name: str
    num_fewshot: int
    doc: dict[str, Any]
    instances: tuple[Any, ...]  # lm_eval.api.instance.Instance, in request order

    def content(self) -> str:
        """What the document is, as text for the suite's content hash: the task's version and
        scoring, the document, and every request the harness built from its YAML and data."""
        requests = [[i.request_type, list(i.args), i.repeats] for i in self.instances]
        what = [self.task_name, self.version, self.metric, self.filter_name, self.num_fewshot]
        return json.dumps([*what, self.doc, requests], sort_keys=True, default=str)

    def answer(self, engine: Engine, request: Request) -> Completion:
        started_s = time.monotonic()
        parts: list[Completion] = []
        first_token_s: float | None = None
        responses: list[list[object]] = []
        for instance in self.instances:
            repeats: list[object] = []
            for _ in range(instance.repeats or 1):
                asked_s = time.monotonic()
                response, part = self._request(engine, instance, request)
                if first_token_s is None and part.ttft_s is not None:
                    first_token_s = asked_s + part.ttft_s
                repeats.append(response)
                parts.append(part)
            responses.append(repeats)
        text = json.dumps(
            {
                "lm_eval_task": self.task_name,
                "version": self.version,
                "metric": self.metric,
                "filter": self.filter_name,
                "num_fewshot": self.num_fewshot,
                "responses": responses,
            }
        )
        return _fold(text, parts, started_s, first_token_s)

    def _request(
        self, engine: Engine, instance: Any, request: Request
    ) -> tuple[object, Completion]:
        kind = instance.request_type
        if kind == "loglikelihood":
            context, continuation = instance.args
            return _loglikelihood(engine, self.task_name, context, continuation)
        if kind == "generate_until":
            context, options = instance.args
            until = options.get("until") or ()
            max_tokens = int(options.get("max_gen_toks", _DEFAULT_MAX_GEN_TOKENS))
            stop = tuple([until] if isinstance(until, str) else until)
            sampling = (max_tokens, stop, request.temperature, request.seed)
            generation: Request = GenerationRequest(context, *sampling)
            if isinstance(context, ChatContext):  # apply_chat_template: the engine renders it
                generation = ChatRequest(context.messages(), *sampling)
            elif engine.kind in _CHAT_ONLY_ENGINE_KINDS:  # as lm-eval's anthropic-chat sends it
                generation = ChatRequest((ChatMessage("user", context),), *sampling)
            completion = engine.generate(generation)
            return completion.text, completion
        raise UserError(f"lm-eval task {self.task_name} sends {kind} requests, not supported")

    def score(self, completion: str) -> ExecutionResult:
        started_s = time.perf_counter()
        try:
            responses = json.loads(completion)["responses"]
            if not isinstance(responses, list) or len(responses) != len(self.instances):
                raise ValueError(f"{len(self.instances)} lists of responses expected")
        except (ValueError, KeyError, TypeError) as error:  # JSONDecodeError is a ValueError
            raise UserError(
                f"a completion of lm-eval task {self.task_name} is not its responses ({error}); "
                'it is JSON {"responses": [[one per repeat] per request]}, as ipw measure stores'
            ) from None
        instances = [
            dataclasses.replace(
                instance,
                resps=[tuple(r) if isinstance(r, list) else r for r in response],
                filtered_resps={},
            )
            for instance, response in zip(self.instances, responses, strict=True)
        ]
        for ensemble in self.harness_task._filters:
            ensemble.apply(instances)
        results = [instance.filtered_resps[self.filter_name] for instance in instances]
        value = self.harness_task.process_results(self.doc, results)[self.metric]
        if value not in (0, 1):  # True and False too
            raise UserError(
                f"lm-eval task {self.task_name}'s metric {self.metric} gave {value!r} for one "
                "document; accuracy per joule counts documents as passed or failed, so it takes "
                "tasks whose metric is 0 or 1 per document (acc, acc_norm, exact_match, ...)"
            )
        detail = f"{self.metric} = {float(value):g}"
        duration_s = time.perf_counter() - started_s
        return ExecutionResult("passed" if value == 1 else "failed", detail, duration_s)


def _fold(
    text: str, parts: list[Completion], started_s: float, first_token_s: float | None
) -> Completion:
    """The document's requests as one completion: tokens, cost, estimates and engine steps
    summed; TTFT is the first generated token's time since the document began (None when
    nothing was generated)."""
    costs = [part.cost_usd for part in parts]
    estimates = [part.energy_estimate for part in parts]
    estimate = None
    if estimates and all(e is not None for e in estimates):
        known = [e for e in estimates if e is not None]
        estimate = EnergyEstimate(known[0].source, sum(e.energy_j for e in known), known[0].basis)
    decode = [part.decode_s for part in parts if part.decode_s is not None]
    return Completion(
        text=text,
        prompt_tokens=sum(part.prompt_tokens for part in parts),
        completion_tokens=sum(part.completion_tokens for part in parts),
        finish_reason="stop",
        wall_s=time.monotonic() - started_s,
        ttft_s=None if first_token_s is None else first_token_s - started_s,
        decode_s=sum(decode) if decode else None,
        cost_usd=None if None in costs else sum(c for c in costs if c is not None),
        energy_estimate=estimate,
        work=tuple(piece for part in parts for piece in part.work),
    )


# ---- log-likelihood -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _LogprobAccess:
    """What scoring a continuation needs of an engine: its tokenizer (text, add BOS, parse
    special tokens), its logits after positions from `first` on, its context size and chat
    template."""

    encode: Callable[[str, bool, bool], list[int]]
    logits: Callable[[list[int], int], np.ndarray]
    n_ctx: int
    chat_template: ChatTemplate


def _logprob_access(engine: Engine, task_name: str) -> _LogprobAccess:
    """The engine's log-likelihood surface, or a UserError saying which engines have one."""
    if engine.kind == "llamacpp":
        llama: Any = engine
        return _LogprobAccess(llama.encode, llama.logits, int(llama.n_ctx), llama.chat_template)
    if engine.kind == "torch":
        torch_engine: Any = engine
        tokenizer = torch_engine.tokenizer
        if tokenizer is None:
            raise UserError("the torch engine needs a GGUF model to tokenize lm-eval requests")

        def rows(prompt: list[int], first: int) -> np.ndarray:
            return np.asarray(torch_engine.logits(prompt)[first:].numpy())

        n_ctx = int(torch_engine.config.max_seq_len)
        return _LogprobAccess(tokenizer.encode, rows, n_ctx, tokenizer.chat_template)
    raise UserError(_no_logprobs(task_name, engine.kind))


def _loglikelihood(
    engine: Engine, task_name: str, context: str, continuation: str
) -> tuple[tuple[float, bool], Completion]:
    """(log P(continuation | context), whether greedy decoding gives it), as lm-eval's own
    HuggingFace model computes it: the continuation's tokens are those of context +
    continuation after the context's, and a context too long loses its oldest tokens. A chat
    context (apply_chat_template) is rendered with the model's template first, its special
    tokens parsed as the engine parses a chat prompt."""
    access = _logprob_access(engine, task_name)
    started_s = time.monotonic()
    add_bos, special = True, False
    if isinstance(context, ChatContext):
        context = access.chat_template.render(context.messages())
        add_bos, special = not access.chat_template.prompt_has_bos(context), True
    spaces = len(context) - len(context.rstrip(" "))
    if spaces:  # lm-eval moves the context's trailing spaces into the continuation
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = access.encode(context + continuation, add_bos, special)
    context_tokens = max(len(access.encode(context, add_bos, special)), 1)  # at least BOS
    continuation_tokens = whole[context_tokens:]
    if not continuation_tokens:
        raise UserError(f"lm-eval task {task_name} asked to score an empty continuation")
    n_ctx = access.n_ctx
    prompt = whole[:-1][-(n_ctx):]  # the last token is only predicted, never fed
    first = len(prompt) - len(continuation_tokens)
    if first < 0:
        raise UserError(
            f"an lm-eval continuation of task {task_name} ({len(continuation_tokens)} tokens) "
            f"does not fit the context of {n_ctx} tokens; raise --n-ctx"
        )
    rows = access.logits(prompt, first).astype(np.float64)
    peak = rows.max(axis=1, keepdims=True)
    log_norm = peak[:, 0] + np.log(np.exp(rows - peak).sum(axis=1))
    picked = rows[np.arange(len(continuation_tokens)), continuation_tokens]
    logprob = float((picked - log_norm).sum())
    greedy = bool((rows.argmax(axis=1) == np.asarray(continuation_tokens)).all())
    ended_s = time.monotonic()
    part = Completion(
        text="",
        prompt_tokens=len(prompt),
        completion_tokens=0,
        finish_reason="stop",
        wall_s=ended_s - started_s,
        ttft_s=None,
        decode_s=None,
        # One step of the engine's alone, for sharing energy with tasks in flight beside it.
        work=(WorkPiece(started_s, ended_s, share=1.0, batch=1),),
    )
    return (logprob, greedy), part


def check_harness_tasks(tasks: Sequence[Task], engine_kind: str) -> None:
    """Refuse an engine that cannot score the log-likelihood requests of these lm-eval tasks
    (called with the tasks loaded, before any model or row)."""
    if engine_kind in LOGPROB_ENGINE_KINDS:
        return
    for task in tasks:
        document = task.procedure
        if isinstance(document, HarnessDocument) and any(
            i.request_type == "loglikelihood" for i in document.instances
        ):
            raise UserError(_no_logprobs(document.task_name, engine_kind))


def _no_logprobs(task_name: str, engine_kind: str) -> str:
    return (
        f"lm-eval task {task_name} scores answers by log-likelihood, which the {engine_kind} "
        "engine cannot give (an API returns no log-probabilities of a given text); run it with "
        f"--engine {' or '.join(LOGPROB_ENGINE_KINDS)}, or pick a generate_until task"
    )

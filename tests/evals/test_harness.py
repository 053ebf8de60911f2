"""lm-eval suites: names, offline task folders, the harness's own scoring, log-likelihood math,
and what engines without log-probabilities are told. Nothing is downloaded: the tasks are YAML
files written here, over a JSONL data file."""

import json
import os
import tempfile
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from openjarvis.errors import UserError
from openjarvis.evals.harness import (
    HarnessDocument,
    HarnessOptions,
    HarnessSuite,
    check_harness_tasks,
    harness_tasks,
    load_harness_suite,
)
from openjarvis.evals.prompting import answer_task, run_prompting, task_request
from openjarvis.evals.scoring import score_completions
from openjarvis.evals.suites import content_sha256
from openjarvis.evals.types import Task
from openjarvis.runtime.chat_template import ChatTemplate
from openjarvis.runtime.types import (
    ChatMessage,
    ChatRequest,
    Completion,
    EnergyEstimate,
    Request,
    StreamChunk,
    WorkPiece,
)

# Never reach the Hub; the JSON builder reads local files. Set before datasets is imported.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="openjarvis-hf-datasets-"))

pytest.importorskip("lm_eval")

QUESTIONS = [
    {"question": "What is 2 + 2?", "choices": ["3", "4", "5"], "answer": 1},
    {
        "question": "What colour is the sky on a clear day?",
        "choices": ["green", "blue"],
        "answer": 1,
    },
    {"question": "How many legs does a cat have?", "choices": ["four", "two", "six"], "answer": 0},
]

MULTIPLE_CHOICE_YAML = """\
task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

GENERATION_YAML = """\
task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
filter_list:
  - name: first-word
    filter:
      - function: regex
        regex_pattern: "(\\\\w+)"
      - function: take_first
metadata:
  version: 2.0
"""


def write_tasks(folder: Path) -> Path:
    """The two offline tasks of these tests in `folder`: tiny_mc and tiny_gen."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    (folder / "tiny_mc.yaml").write_text(MULTIPLE_CHOICE_YAML.format(data=data))
    (folder / "tiny_gen.yaml").write_text(GENERATION_YAML.format(data=data))
    return folder


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tasks(tmp_path_factory.mktemp("lm-eval-tasks"))


def document(task: Task) -> HarnessDocument:
    assert isinstance(task.procedure, HarnessDocument)
    return task.procedure


def harness(
    names: str, include: Path | None, limit: int | None = None, **options: Any
) -> list[Task]:
    """The tasks of `lm-eval:NAMES` with the task folder `include` and lm-eval's options."""
    folder = None if include is None else str(include)
    chosen = HarnessOptions(include=folder, **options)
    return load_harness_suite(HarnessSuite(harness_tasks(f"lm-eval:{names}"), limit, chosen))


# ---- suite names ------------------------------------------------------------------------------


def test_a_suite_name_is_its_tasks_and_nothing_else() -> None:
    assert harness_tasks("lm-eval:arc_easy, hellaswag") == ("arc_easy", "hellaswag")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("lm-eval:", "names no lm-eval task"),
        ("lm-eval:arc_easy?num_fewshot=5", "lm-eval options are flags of ipw measure now"),
    ],
)
def test_a_bad_suite_name_says_what_is_wrong(name: str, problem: str) -> None:
    with pytest.raises(UserError, match=problem):
        harness_tasks(name)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (HarnessOptions(num_fewshot=-1), r"--num-fewshot must be 0 or more \(got -1\)"),
        (HarnessOptions(fewshot_as_multiturn=True), "--fewshot-as-multiturn needs --apply-chat"),
    ],
)
def test_bad_options_name_their_flag(options: HarnessOptions, problem: str) -> None:
    with pytest.raises(UserError, match=problem):
        options.check()


# ---- loading offline tasks ---------------------------------------------------------------------


def test_each_document_of_each_task_becomes_a_task(tasks_dir: Path) -> None:
    tasks = harness("tiny_mc,tiny_gen", tasks_dir, limit=2)
    assert [t.task_id for t in tasks] == ["tiny_mc/0", "tiny_mc/1", "tiny_gen/0", "tiny_gen/1"]
    assert {t.kind for t in tasks} == {"harness"}
    assert tasks[0].prompt == "Question: What is 2 + 2?\nAnswer:"
    mc, gen = document(tasks[0]), document(tasks[2])
    assert (mc.task_name, mc.version, mc.metric, mc.filter_name) == (
        "tiny_mc",
        "1.0",
        "acc",
        "none",
    )
    assert [i.args for i in mc.instances] == [
        ("Question: What is 2 + 2?\nAnswer:", f" {choice}") for choice in ("3", "4", "5")
    ]
    assert (gen.version, gen.metric, gen.filter_name) == ("2.0", "exact_match", "first-word")
    assert [i.request_type for i in gen.instances] == ["generate_until"]


def test_few_shot_examples_come_from_the_task(tasks_dir: Path) -> None:
    tasks = harness("tiny_mc", tasks_dir, limit=1, num_fewshot=2)
    assert document(tasks[0]).num_fewshot == 2
    # Two solved examples before the question (sampled from the task's own documents).
    assert tasks[0].prompt.count("Answer:") == 3


def test_an_unknown_task_is_named_in_one_line(tasks_dir: Path) -> None:
    with pytest.raises(UserError, match=r"^lm-eval knows no task 'nope' \(nor does .*\); check"):
        harness("tiny_mc,nope", tasks_dir)


def test_a_broken_task_file_is_named_with_its_line(tmp_path: Path) -> None:
    folder = write_tasks(tmp_path / "tasks")
    (folder / "broken.yaml").write_text("task: broken\noutput_type: [generate_until\n")
    with pytest.raises(UserError, match=r"broken\.yaml, line 3: not a valid task file"):
        harness("tiny_mc", folder)


def test_a_missing_data_file_is_one_line(tmp_path: Path) -> None:
    folder = write_tasks(tmp_path / "tasks")
    (folder / "questions.jsonl").unlink()
    with pytest.raises(UserError, match=r"^lm-eval could not (load|build).*tiny_mc"):
        harness("tiny_mc", folder)


def test_a_missing_include_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a folder of lm-eval task YAML files"):
        harness("tiny_mc", tmp_path / "absent")


# ---- scoring with the harness's own metric --------------------------------------------------


def response_text(responses: list[list[object]]) -> str:
    return json.dumps({"responses": responses})


def test_multiple_choice_passes_when_the_answer_is_the_most_likely(tasks_dir: Path) -> None:
    task = harness("tiny_mc", tasks_dir, limit=1)[0]  # answer: " 4"
    right = response_text([[[-3.0, False]], [[-1.0, True]], [[-4.0, False]]])
    wrong = response_text([[[-0.5, True]], [[-1.0, False]], [[-4.0, False]]])
    results = score_completions([(task, right), (task, wrong)], sandbox=None)
    assert [r.status for r in results] == ["passed", "failed"]
    assert results[0].detail == "acc = 1"


def test_generation_is_filtered_and_matched_as_the_harness_does(tasks_dir: Path) -> None:
    task = harness("tiny_gen", tasks_dir, limit=1)[0]  # target "4"
    outcomes = [
        document(task).score(response_text([[text]])).status
        for text in (" 4 apples", "4", " 5", "")
    ]
    assert outcomes == ["passed", "passed", "failed", "failed"]


# ---- engines ----------------------------------------------------------------------------------


@dataclass
class ScriptedEngine:
    """An engine at the network edge: replies with a fixed text and the cost an API reports."""

    kind: str
    reply: str
    requests: list[Request]

    model_name = "scripted"
    devices: tuple[int, ...] = ()
    ledger = None  # one reply at a time: no step ledger
    concurrency = 1

    def settings_dict(self) -> dict[str, object]:
        return {}

    def generate(self, request: Request) -> Completion:
        self.requests.append(request)
        estimate = EnergyEstimate("estimate:cloud:test", 2.5, "test constants")
        step = WorkPiece(1.0, 1.1, 0.5, 2)  # a batching engine's step, shared with another
        return Completion(self.reply, 10, 3, "stop", 0.2, 0.05, 0.1, cost_usd=0.01,
                          energy_estimate=estimate, work=(step,))  # fmt: skip

    def stream(self, request: Request) -> Generator[StreamChunk]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_a_generation_document_runs_on_any_engine_and_folds_its_cost(tasks_dir: Path) -> None:
    task = harness("tiny_gen", tasks_dir, limit=1)[0]
    engine = ScriptedEngine("openai", " 4", [])
    completion = answer_task(engine, task, task_request(task, "completion", 0.0, 7))
    (request,) = engine.requests
    assert request.stop == ("\n",) and request.max_tokens == 8 and request.seed == 7
    stored = json.loads(completion.text)
    assert stored["lm_eval_task"] == "tiny_gen" and stored["version"] == "2.0"
    assert stored["metric"] == "exact_match" and stored["responses"] == [[" 4"]]
    assert (completion.prompt_tokens, completion.completion_tokens) == (10, 3)
    assert completion.cost_usd == 0.01
    assert completion.work == (WorkPiece(1.0, 1.1, 0.5, 2),)  # how shared energy splits
    assert completion.energy_estimate is not None and completion.energy_estimate.energy_j == 2.5
    assert completion.ttft_s is not None and completion.ttft_s >= 0.05
    assert document(task).score(completion.text).passed


def test_log_likelihood_is_refused_where_the_engine_has_no_log_probabilities(
    tasks_dir: Path,
) -> None:
    tasks = harness("tiny_mc", tasks_dir, limit=1)
    with pytest.raises(
        UserError, match=r"the openai engine cannot give.*--engine llamacpp or torch"
    ):
        check_harness_tasks(tasks, "openai")
    task = tasks[0]
    with pytest.raises(UserError, match="the anthropic engine cannot give"):
        answer_task(
            ScriptedEngine("anthropic", "", []), task, task_request(task, "completion", 0, 0)
        )
    check_harness_tasks(tasks, "llamacpp")  # no error
    check_harness_tasks(harness("tiny_gen", tasks_dir, limit=1), "openai")


class LogitsEngine:
    """The llama.cpp engine's log-likelihood surface over a toy vocabulary: one token per
    character, and fixed logits so the expected log-probabilities are known."""

    kind = "llamacpp"
    n_ctx = 64
    BOS = 0

    # A template that marks turns with one character each: "user: ab" renders "^ab>".
    chat_template = ChatTemplate("toy", lambda messages: "^" + messages[-1].content + ">", "")

    def __init__(self, logits: np.ndarray) -> None:
        self._logits = logits  # [vocab]: the same distribution after every position
        self.calls: list[tuple[list[int], int]] = []
        self.special: list[bool] = []

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        self.special.append(special)
        return [self.BOS] * add_bos + [ord(c) - ord("a") + 1 for c in text]

    def logits(self, prompt: list[int], first: int = 0) -> np.ndarray:
        self.calls.append((prompt, first))
        return np.tile(self._logits, (len(prompt) - first, 1))


def test_log_likelihood_sums_the_continuations_log_softmax() -> None:
    from openjarvis.evals.harness import _loglikelihood

    logits = np.array([0.0, 1.0, 3.0, 0.5], dtype=np.float32)  # tokens BOS, a, b, c
    log_softmax = logits - np.log(np.exp(logits).sum())
    engine = LogitsEngine(logits)
    (logprob, greedy), part = _loglikelihood(engine, "t", "ab", "bc")  # type: ignore[arg-type]  # a fake with the log-likelihood surface only
    assert logprob == pytest.approx(log_softmax[2] + log_softmax[3])
    assert greedy is False  # "c" is not the most likely token; "b" is
    # Context BOS a b, continuation b c: fed BOS a b b, scored from the last context token on.
    assert engine.calls == [([0, 1, 2, 2], 2)]
    assert part.prompt_tokens == 4 and part.completion_tokens == 0
    (step,) = part.work  # the scoring is one step of its own, should tasks run at once
    assert (step.share, step.batch) == (1.0, 1) and step.end_s - step.start_s == part.wall_s
    (logprob, greedy), _ = _loglikelihood(engine, "t", "", "bb")  # type: ignore[arg-type]  # a fake with the log-likelihood surface only
    assert logprob == pytest.approx(2 * log_softmax[2]) and greedy is True


def test_a_context_too_long_loses_its_oldest_tokens() -> None:
    from openjarvis.evals.harness import _loglikelihood

    engine = LogitsEngine(np.zeros(4, dtype=np.float32))
    _loglikelihood(engine, "t", "a" * 100, "b")  # type: ignore[arg-type]  # a fake with the log-likelihood surface only
    prompt, first = engine.calls[0]
    assert len(prompt) == engine.n_ctx and first == engine.n_ctx - 1


@pytest.mark.e2e
def test_llama_cpp_and_torch_give_the_same_log_likelihoods_of_the_embedded_model() -> None:
    """Both engines score continuations of the same GGUF: the answers agree to within what
    llama.cpp's quantised kernels and torch's dequantised weights part by, and rank alike."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from openjarvis.evals.harness import ChatContext, _loglikelihood
    from openjarvis.runtime.engines import EngineSpec, open_engine, resolve_engine_model

    context = "Question: What is the capital of France?\nAnswer:"
    choices = (" Paris", " Berlin", " a small fish")
    scores = {}
    for kind in ("llamacpp", "torch"):
        spec = EngineSpec(kind=kind, reuse_prompt_cache=False, n_ctx=256)
        engine = open_engine(spec, resolve_engine_model(spec))
        try:
            scores[kind] = [_loglikelihood(engine, "t", context, c)[0] for c in choices]
            # The same under the model's chat template, which both engines render alike.
            chat = ChatContext('[{"role": "user", "content": "The capital of France?"}]')
            scores[kind].append(_loglikelihood(engine, "t", chat, "Paris")[0])
        finally:
            engine.close()
    for (llama_lp, llama_greedy), (torch_lp, torch_greedy) in zip(
        scores["llamacpp"], scores["torch"], strict=True
    ):
        assert llama_lp == pytest.approx(torch_lp, rel=0.05, abs=0.3)
        assert llama_greedy == torch_greedy
    ranked = {kind: np.argsort([lp for lp, _ in s[:3]]).tolist() for kind, s in scores.items()}
    assert ranked["llamacpp"] == ranked["torch"]
    assert np.argmax([lp for lp, _ in scores["llamacpp"]]) == 0  # Paris, even for 270M


def test_a_chat_only_api_gets_the_harness_prompt_as_one_user_message(tasks_dir: Path) -> None:
    task = harness("tiny_gen", tasks_dir, limit=1)[0]
    engine = ScriptedEngine("anthropic", "4", [])
    answer_task(engine, task, task_request(task, "completion", 0.0, 3))
    (request,) = engine.requests
    assert isinstance(request, ChatRequest)
    assert request.messages == (ChatMessage("user", task.prompt),)
    assert (request.stop, request.max_tokens, request.seed) == (("\n",), 8, 3)


def test_under_a_chat_template_a_generation_goes_as_chat_messages(tasks_dir: Path) -> None:
    task = harness(
        "tiny_gen",
        tasks_dir,
        limit=1,
        num_fewshot=1,
        apply_chat_template=True,
        fewshot_as_multiturn=True,
        system_instruction="Answer in one word.",
    )[0]
    engine = ScriptedEngine("llamacpp", "4", [])
    completion = answer_task(engine, task, task_request(task, "completion", 0.0, 0))
    (request,) = engine.requests
    assert isinstance(request, ChatRequest)
    roles = [m.role for m in request.messages]
    assert roles == ["system", "user", "assistant", "user"]  # the shot is a turn of its own
    assert request.messages[0].content == "Answer in one word."
    assert request.messages[-1].content == "Question: What is 2 + 2?\nAnswer:"
    assert document(task).score(completion.text).passed
    # The run records how its documents went to the model, whatever the model's kind.
    plain = harness("tiny_gen", tasks_dir, limit=1)[0]
    assert run_prompting([task], "base") == {"harness": "chat-template"}
    assert run_prompting([plain], "chat") == {"harness": "completion"}


def test_log_likelihood_under_a_chat_template_scores_the_rendered_prompt(
    tasks_dir: Path,
) -> None:
    from openjarvis.evals.harness import ChatContext, _loglikelihood

    task = harness("tiny_mc", tasks_dir, limit=1, apply_chat_template=True)[0]
    context, continuation = document(task).instances[1].args
    # Under a chat template lm-eval drops the space before the answer: it starts the model's turn.
    assert isinstance(context, ChatContext) and continuation == "4"
    assert context.messages() == (ChatMessage("user", "Question: What is 2 + 2?\nAnswer:"),)
    engine = LogitsEngine(np.zeros(4, dtype=np.float32))
    chat = ChatContext('[{"role": "user", "content": "ab"}]')
    _loglikelihood(engine, "t", chat, "b")  # type: ignore[arg-type]  # a fake with the log-likelihood surface only
    # Rendered "^ab>", its marks parsed as special tokens; then the continuation "b".
    assert engine.calls == [([0, *engine.encode("^ab>", False), 2][:-1], 4)]
    assert engine.special[:2] == [True, True]


def test_a_completion_that_is_not_the_responses_is_one_line(tasks_dir: Path) -> None:
    task = harness("tiny_gen", tasks_dir, limit=1)[0]
    for text in ("4", '{"answer": "4"}', '{"responses": []}'):
        with pytest.raises(UserError, match="a completion of lm-eval task tiny_gen is not its"):
            document(task).score(text)


def test_a_suites_identity_is_its_documents_and_requests_not_its_folder(tmp_path: Path) -> None:
    """The same tasks read from two folders (two machines) are one suite; an edited document,
    or another number of shots, is another."""

    def identity(folder: Path, **options: object) -> str:
        return content_sha256(harness("tiny_mc,tiny_gen", folder, limit=2, **options))

    here = identity(write_tasks(tmp_path / "here"))
    assert identity(write_tasks(tmp_path / "there")) == here
    assert identity(tmp_path / "here", num_fewshot=1) != here
    edited = write_tasks(tmp_path / "edited")
    data = edited / "questions.jsonl"
    data.write_text(data.read_text().replace("2 + 2", "2 + 3"), encoding="utf-8")
    assert identity(edited) != here

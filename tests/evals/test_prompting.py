"""How tasks are put to a model: base models by plain completion always, chat models through
their template for question suites, code by completion for every model."""

from openjarvis.evals.prompting import describe_prompting, run_prompting, task_request
from openjarvis.evals.runner import _prompting_of
from openjarvis.evals.suites import load_suite
from openjarvis.records import RunRecord
from openjarvis.runtime.types import ChatMessage, ChatRequest, GenerationRequest


def test_a_base_model_is_prompted_by_completion_for_every_kind() -> None:
    tasks = [*load_suite("python-basics"), *load_suite("basics-choice"), *load_suite("arithmetic")]
    expected = {"code": "completion", "multiple_choice": "completion", "exact_match": "completion"}
    assert run_prompting(tasks, "base") == expected
    assert run_prompting(tasks, None) == expected  # unknown: every model can complete text


def test_a_chat_model_answers_questions_through_its_template_and_continues_code() -> None:
    tasks = [*load_suite("python-basics"), *load_suite("basics-choice")]
    prompting = run_prompting(tasks, "chat")
    assert prompting == {"code": "completion", "multiple_choice": "chat-template"}
    assert describe_prompting(prompting) == "completion (code), chat-template (multiple_choice)"
    question = load_suite("basics-choice")[0]
    request = task_request(question, prompting[question.kind], temperature=0.0, seed=3)
    assert request == ChatRequest(
        messages=(ChatMessage("user", question.prompt),),
        max_tokens=question.max_tokens,
        stop=question.stop,
        temperature=0.0,
        seed=3,
    )
    code = load_suite("python-basics")[0]
    assert isinstance(task_request(code, prompting[code.kind], 0.0, 0), GenerationRequest)


def test_humaneval_is_a_completion_for_every_model() -> None:
    tasks = load_suite("humaneval")[:3]
    for model_kind in ("base", "chat", None):
        assert run_prompting(tasks, model_kind) == {"code": "completion"}
    assert describe_prompting({"code": "completion"}) == "completion"


def test_a_resumed_run_prompts_as_it_started() -> None:
    def run(options: dict[str, object]) -> RunRecord:
        return RunRecord(
            "m", "/m.gguf", "ab" * 32, "llamacpp", {}, "basics-choice", options, "system",
            "counter", "namespaces", "0", model_kind="chat",
        )  # fmt: skip

    tasks = load_suite("basics-choice")
    # Stored before prompting was recorded: every task was a completion, and stays one.
    assert _prompting_of(run({}), tasks) == {"multiple_choice": "completion"}
    stored = {"multiple_choice": "chat-template"}
    assert _prompting_of(run({"prompting": stored}), tasks) == stored

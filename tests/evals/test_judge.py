"""Judge suites: the judge's name in the suite, its prompt and verdicts, and its energy and cost
stored as a run of its own. The judge engine is faked at the network edge (a scripted reply);
the meter, the store and the runner are real, and the judged model is the embedded one."""

import io
import os
import time
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console

from openjarvis.cli.summary import print_summary, summary_dict
from openjarvis.errors import UserError
from openjarvis.evals import judge as judge_module
from openjarvis.evals.config import RunConfig, prepare
from openjarvis.evals.judge import (
    JUDGE_PROMPT_VERSION,
    Judge,
    JudgeSpec,
    check_judge,
    judge_prompt,
    judge_run_id,
    parse_verdict,
)
from openjarvis.evals.runner import MeasureResult, run_measure
from openjarvis.evals.scoring import score_completions
from openjarvis.evals.suites import SuiteConfig, content_sha256, load_suite
from openjarvis.evals.types import Task
from openjarvis.power import Meter
from openjarvis.power.sources import EnergySource
from openjarvis.records import RunRecord
from openjarvis.runtime.types import (
    ChatRequest,
    Completion,
    EnergyEstimate,
    Request,
    StreamChunk,
)
from openjarvis.store import open_store
from tests.cli.test_measure_e2e import run_ipw

OPEN_SUITE = """\
{"task_id": "capital", "kind": "open_ended", "prompt": "What is the capital of France?", \
"reference": "Paris", "max_tokens": 24}
{"task_id": "why-sky", "kind": "open_ended", "prompt": "Why is the sky blue?", "max_tokens": 24}
"""


@dataclass
class ScriptedJudge:
    """A judge engine at the network edge: each reply is the next scripted text."""

    kind: str
    replies: list[str]
    seconds: float = 0.01  # how long each reply takes
    prompts: list[Request] = field(default_factory=list)

    model_name = "scripted-judge"
    devices: tuple[int, ...] = ()
    ledger = None  # one reply at a time: no step ledger
    concurrency = 1

    def settings_dict(self) -> dict[str, object]:
        return {"scripted": True}

    def generate(self, request: Request) -> Completion:
        self.prompts.append(request)
        time.sleep(self.seconds)
        estimate = None
        if self.kind == "openai":
            estimate = EnergyEstimate("estimate:cloud:test", 3.0, "test constants")
        cost = 0.002 if self.kind == "openai" else None
        return Completion(self.replies.pop(0), 120, 8, "stop", self.seconds, 0.01, 0.02,
                          cost_usd=cost, energy_estimate=estimate)  # fmt: skip

    def stream(self, request: Request) -> Generator[StreamChunk]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class HundredWatts(EnergySource):
    """A counter that draws 100 W at all times."""

    name, domain, method, reads = "fake:gpu", "gpu", "counter", "energy_j"
    update_period_s = sample_period_s = 0.0001

    def read(self) -> float:
        return 100.0 * time.monotonic()


def suite_file(tmp_path: Path) -> Path:
    path = tmp_path / "open.jsonl"
    path.write_text(OPEN_SUITE, encoding="utf-8")
    return path


# ---- names, prompt and verdicts ---------------------------------------------------------------


def test_the_judge_is_part_of_the_suites_identity_but_not_its_url_or_key(
    tmp_path: Path,
) -> None:
    tasks = load_suite(str(suite_file(tmp_path)))
    here = content_sha256(tasks, JudgeSpec.parse("openai:gpt-4o-mini", "http://h:1/v1", "KEY"))
    elsewhere = content_sha256(tasks, JudgeSpec("openai", "gpt-4o-mini", "https://api/v1"))
    assert here == elsewhere  # the same judge reached at another address
    assert here != content_sha256(tasks, JudgeSpec("openai", "gpt-4o"))  # another judge
    assert here != content_sha256(tasks)  # no judge


def test_a_bad_judge_is_refused_in_one_line() -> None:
    with pytest.raises(UserError, match="unknown engine 'gpt'; write ENGINE"):
        JudgeSpec.parse("gpt:4", None, None)


def test_open_ended_tasks_need_a_judge_and_a_judge_needs_them(tmp_path: Path) -> None:
    tasks = load_suite(str(suite_file(tmp_path)))
    assert [t.kind for t in tasks] == ["open_ended", "open_ended"]
    assert (tasks[0].answer, tasks[1].max_tokens, tasks[1].stop) == ("Paris", 24, ())
    with pytest.raises(UserError, match="has 2 open_ended task"):
        check_judge(None, "open.jsonl", tasks)
    with pytest.raises(UserError, match="suite humaneval has none; leave --judge out"):
        check_judge(JudgeSpec("openai", "m"), "humaneval", load_suite("humaneval")[:1])
    check_judge(JudgeSpec("openai", "m"), "open.jsonl", tasks)  # no error


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        ("The answer names Paris.\nVERDICT: PASS", "passed"),
        ("verdict: fail", "failed"),
        ("VERDICT: PASS would be wrong here.\nVERDICT: **FAIL**", "failed"),
        ("It is right.", "error"),
    ],
)
def test_the_last_verdict_line_decides(reply: str, status: str) -> None:
    assert parse_verdict(reply) == status


def test_the_prompt_shows_the_reference_only_when_there_is_one() -> None:
    with_reference = Task("t", "Capital of France?", "open_ended", answer="Paris")
    assert "Reference answer:\nParis" in judge_prompt(with_reference, "Lyon")
    assert "Reference" not in judge_prompt(Task("t", "Why?", "open_ended"), "Because")
    assert judge_prompt(with_reference, "Lyon").endswith("VERDICT: PASS or\nVERDICT: FAIL.")


# ---- the judge's own run ----------------------------------------------------------------------


def judged_run(store_url: str) -> tuple[RunRecord, str]:
    run = RunRecord("judged", None, None, "llamacpp", {}, "open.jsonl", {}, "system", "counter",
                    "none", "test")  # fmt: skip
    with open_store(store_url) as store:
        run.id = store.create_run(run)
    return run, f"judge-of:{run.id}"


def test_a_cloud_judges_cost_and_estimate_are_stored_in_its_own_run(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    _, judge_suite = judged_run(db)
    engine = ScriptedJudge("openai", ["VERDICT: PASS", "no verdict"])
    tasks = load_suite(str(suite_file(tmp_path)))
    with open_store(db) as store, Meter([HundredWatts()], "accelerator") as meter:
        run_id = store.create_run(RunRecord("j", None, None, "openai", {}, judge_suite, {},
                                            "system", "estimate", "none", "test"))  # fmt: skip
        judge = Judge(engine, meter, store, run_id, chat=True)
        bound = judge.bind(tasks)
        results = score_completions([(bound[0], "Paris."), (bound[1], "Rayleigh")], None)
        judge.finish("complete")
        saved = store.task_results(run_id)
        judge_run = store.get_run(run_id)
    assert [r.status for r in results] == ["passed", "error"]
    assert [r.task_id for r in saved] == ["capital#0", "why-sky#0"]
    assert [r.statuses for r in saved] == [("passed",), ("error",)]
    assert [r.energy_j for r in saved] == [3.0, 3.0]
    assert all(r.energy[0].method == "estimate" for r in saved)
    assert saved[0].completions == ("VERDICT: PASS",)
    assert judge_run.state == "complete" and judge_run.summary is not None
    assert judge_run.summary["cost_usd"] == pytest.approx(0.004)
    assert not meter.total().windows  # a cloud judge opens no window on the judged run's meter
    # The judge saw the question, the reference and the answer, as a user turn.
    request = engine.prompts[0]
    assert isinstance(request, ChatRequest)
    (message,) = request.messages
    assert "What is the capital of France?" in message.content and "Paris." in message.content


def test_a_local_judges_joules_are_its_own_window_not_the_judged_tail(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    _, judge_suite = judged_run(db)
    engine = ScriptedJudge("llamacpp", ["VERDICT: FAIL"], seconds=0.05)
    task = load_suite(str(suite_file(tmp_path)))[0]
    with open_store(db) as store, Meter([HundredWatts()], "accelerator") as meter:
        run_id = store.create_run(RunRecord("j", None, None, "llamacpp", {}, judge_suite, {},
                                            "system", "counter", "none", "test"))  # fmt: skip
        judge = Judge(engine, meter, store, run_id, chat=False)
        with meter.window("capital#0") as answered:
            time.sleep(0.02)
        time.sleep(0.01)  # scoring between the two
        (verdict,) = score_completions([(judge.bind([task])[0], "Lyon")], None)
        judge.finish("complete")
        (saved,) = store.task_results(run_id)
        model = answered.result
    assert verdict.status == "failed" and saved.statuses == ("failed",)
    # The judged window's tail ends where the judge's window opens: ~10 ms, not the judge's 50.
    assert answered.tail_end_s is not None and answered.end_s is not None
    assert 0.01 <= answered.tail_end_s - answered.end_s < 0.04
    span_s = answered.end_s - answered.start_s
    assert model.energy_j == pytest.approx(100.0 * span_s, rel=0.2)  # none of the judge's
    assert saved.energy_j == pytest.approx(100.0 * saved.latency_s, rel=0.2)
    assert saved.latency_s >= 0.05
    assert saved.energy[0].source == "fake:gpu"


def measure_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, judge: ScriptedJudge
) -> tuple[MeasureResult, str]:
    """`ipw measure --suite open.jsonl --judge openai:scripted` on the embedded model, the
    judge's engine scripted; the result and the database."""
    monkeypatch.setattr(judge_module, "open_engine", lambda spec, model: judge)
    db = str(tmp_path / "runs.db")
    suite = SuiteConfig(str(suite_file(tmp_path)), limit=None)
    # allow_shared: another measurement on this machine (a `jarvis serve`, another test) must not
    # fail the test; what it checks does not depend on the claim.
    config = RunConfig(
        suite=suite, judge=JudgeSpec("openai", "scripted"), idle_seconds=0, allow_shared=True
    )
    return run_measure(prepare(config), db), db


@pytest.mark.e2e
def test_a_judged_suite_runs_with_the_judges_energy_and_cost_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded model answers; a scripted cloud judge passes the first answer only."""
    engine = ScriptedJudge("openai", ["VERDICT: PASS", "VERDICT: FAIL"])
    result, db = measure_judged(tmp_path, monkeypatch, engine)
    with open_store(db) as store:
        judged = store.get_run(result.run_id)
        answers = store.task_results(result.run_id)
        (judge_run,) = store.list_runs(suite=f"judge-of:{result.run_id}")
        verdicts = store.task_results(judge_run.id or "")
    assert judged.suite == "open.jsonl" and judged.state == "complete"
    assert judged.config is not None and judged.config["judge"] == {
        "engine": "openai",
        "model": "scripted",
        "base_url": None,
        "api_key_env": None,
    }
    assert [a.statuses for a in answers] == [("passed",), ("failed",)]
    assert result.figures.accuracy.value == pytest.approx(0.5)
    # The judged model's figures hold its own joules and no API cost; the judge's are apart.
    assert judged.summary is not None and judged.summary["cost_usd"] is None
    assert all(a.energy_j is None or a.energy_j > 0 for a in answers)
    assert (judge_run.state, judge_run.engine, judge_run.model_name) == (
        "complete",
        "openai",
        "scripted-judge",
    )
    assert judge_run.options["judge_prompt_version"] == JUDGE_PROMPT_VERSION
    assert judge_run.options["judges_run"] == result.run_id
    assert "VERDICT: PASS or" in str(judge_run.options["judge_prompt"])
    assert [v.task_id for v in verdicts] == ["capital#0", "why-sky#0"]
    assert [v.energy_j for v in verdicts] == [3.0, 3.0]
    assert judge_run.summary is not None and judge_run.summary["cost_usd"] == pytest.approx(0.004)
    # The judged model's answer is what the judge read.
    request = engine.prompts[0]
    assert isinstance(request, ChatRequest)
    (message,) = request.messages
    assert answers[0].completions[0] in message.content


@pytest.mark.parametrize(
    ("judge_args", "message"),
    [
        ((), "has 2 open_ended task(s), which a judge model scores; give one with --judge"),
        (("--judge", "gpt:4"), "--judge 'gpt:4': unknown engine 'gpt'"),
        (("--judge-base-url", "http://h/v1"), "--judge-base-url and --judge-api-key-env go with"),
        (
            ("--judge", "llamacpp", "--concurrency", "2"),
            "a local judge (llamacpp) keeps its joules apart only between the judged model's",
        ),
        (("--judge", "llamacpp:/nonexistent/judge.gguf"), "model file not found"),
    ],
)
def test_the_cli_refuses_a_judged_suite_without_a_good_judge_in_one_line(
    tmp_path: Path, judge_args: tuple[str, ...], message: str
) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    done = run_ipw("measure", "--suite", str(suite_file(tmp_path)), *judge_args, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert message in line and line.startswith("error: ")
    assert not (tmp_path / "data").exists()  # refused before the database was created


def test_verdicts_from_tasks_in_flight_at_once_are_each_saved_once(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    _, judge_suite = judged_run(db)
    tasks = [Task(f"q{i}", f"Question {i}?", "open_ended") for i in range(8)]
    engine = ScriptedJudge("openai", ["VERDICT: PASS"] * 16, seconds=0.01)
    with open_store(db) as store, Meter([HundredWatts()], "accelerator") as meter:
        run_id = store.create_run(RunRecord("j", None, None, "openai", {}, judge_suite, {},
                                            "system", "estimate", "none", "test"))  # fmt: skip
        judge = Judge(engine, meter, store, run_id, chat=True)
        bound = judge.bind(tasks) * 2  # two samples of each task
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda task: score_completions([(task, "A")], None), bound))
        judge.finish("complete")
        saved = store.task_results(run_id)
    assert all(r[0].passed for r in results)
    assert sorted(r.task_id for r in saved) == sorted(
        f"q{i}#{sample}" for i in range(8) for sample in range(2)
    )


@pytest.mark.e2e
def test_a_verdict_the_judge_did_not_give_is_counted_and_said_not_hidden_as_a_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The judge passes the first answer and gives no verdict on the second: the summary names
    the judge's run and says that 1 of the 2 samples could not be scored."""
    engine = ScriptedJudge("openai", ["VERDICT: PASS", "I cannot tell."])
    result, db = measure_judged(tmp_path, monkeypatch, engine)
    with open_store(db) as store:
        judge_run = judge_run_id(store, result.run_id)
        answers = store.task_results(result.run_id)
    assert judge_run is not None
    assert [a.statuses for a in answers] == [("passed",), ("error",)]
    assert (result.window_flags["samples"], result.window_flags["scoring_errors"]) == (2, 1)
    out = io.StringIO()
    console = Console(file=out, width=300)
    print_summary(result, console, False, judge_run)
    printed = " ".join(out.getvalue().split())
    assert f"judged by run {judge_run[:8]} (`ipw show {judge_run[:8]}`)" in printed
    assert "1 of 2 samples could not be scored (a judge gave no verdict" in printed
    assert summary_dict(result, judge_run)["judge_run"] == judge_run

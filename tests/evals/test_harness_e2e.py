"""`ipw measure --suite lm-eval:...` end to end: an offline harness task (YAML + JSONL written
here) through the CLI with the real embedded model, stored with per-task energy and the
harness's own metric; and bad input refused in one line before any model loads."""

import json
import os
import tempfile
from pathlib import Path

import pytest

from openjarvis.errors import RunInterrupted
from openjarvis.evals.config import RunConfig, prepare
from openjarvis.evals.harness import HarnessDocument, HarnessOptions
from openjarvis.evals.runner import resume_measure, run_measure
from openjarvis.evals.suites import SuiteConfig
from openjarvis.runtime.types import Completion, Engine, Request
from openjarvis.store import open_store
from tests.cli.test_measure_e2e import run_ipw
from tests.evals.test_harness import write_tasks

pytest.importorskip("lm_eval")


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "COLUMNS": "120",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": tempfile.mkdtemp(prefix="openjarvis-hf-datasets-"),
    }


@pytest.mark.e2e
def test_a_harness_task_runs_with_per_task_energy_and_its_own_metric(
    tmp_path: Path, env: dict[str, str]
) -> None:
    folder = write_tasks(tmp_path / "tasks")
    db = tmp_path / "runs.db"
    done = run_ipw(
        "measure",
        "--suite",
        "lm-eval:tiny_mc,tiny_gen",
        "--lm-eval-include",
        str(folder),
        "--limit",
        "2",
        "--idle-seconds",
        "1",
        "--allow-shared",  # another measurement on this machine must not fail the test
        "--db",
        str(db),
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "accuracy per joule" in done.stdout
    with open_store(str(db)) as store:
        (run,) = store.list_runs()
        results = store.task_results(run.id or "")
    assert run.state == "complete"
    # The suite by its name; its options are data of the run's configuration, and its identity
    # is its content (the folder's path is provenance only).
    assert run.suite == "lm-eval:tiny_mc,tiny_gen"
    assert run.config is not None
    assert run.config["suite"] == {
        "name": "lm-eval:tiny_mc,tiny_gen",
        "limit": 2,
        "lm_eval": {
            "num_fewshot": None,
            "include": str(folder.resolve()),
            "fewshot_seed": 1234,
            "apply_chat_template": False,
            "fewshot_as_multiturn": False,
            "system_instruction": None,
        },
    }
    assert run.suite_sha256 is not None and len(run.suite_sha256) == 64
    assert run.options["prompting"] == {"harness": "completion"}
    assert [r.task_id for r in results] == ["tiny_mc/0", "tiny_mc/1", "tiny_gen/0", "tiny_gen/1"]
    for result in results:
        stored = json.loads(result.completions[0])
        name = result.task_id.split("/")[0]
        assert stored["lm_eval_task"] == name
        assert (stored["version"], stored["metric"]) == (
            ("1.0", "acc") if name == "tiny_mc" else ("2.0", "exact_match")
        )
        assert result.statuses[0] in ("passed", "failed")
        assert result.passed == (result.statuses[0] == "passed")
        assert result.prompt_tokens > 0 and result.latency_s > 0
        if result.energy_j is None:  # measured or estimated, never a silent 0
            assert result.energy_null_reason
        else:
            assert result.energy_j > 0
    choices = [json.loads(r.completions[0])["responses"] for r in results[:2]]
    for responses, result in zip(choices, results[:2], strict=True):
        # One log-likelihood per choice; the document passes when the answer's is the highest.
        logprobs = [repeats[0][0] for repeats in responses]
        assert all(lp < 0 for lp in logprobs)
        answer = 1  # both first documents' answer is the second choice
        assert result.passed == (max(range(len(logprobs)), key=logprobs.__getitem__) == answer)
    for result in results[2:]:
        assert result.completion_tokens > 0 and result.ttft_s is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--suite", "lm-eval:nope"), "error: lm-eval knows no task 'nope' (nor does"),
        (
            ("--suite", "lm-eval:tiny_mc", "--engine", "openai", "--model", "m"),
            "error: lm-eval task tiny_mc scores answers by log-likelihood, which the openai",
        ),
        (("--suite", "lm-eval:broken"), "error: lm-eval task file "),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    folder = write_tasks(tmp_path / "tasks")
    if "lm-eval:broken" in args:
        (folder / "broken.yaml").write_text("task: broken\noutput_type: [oops\n")
    done = run_ipw("measure", *args, "--lm-eval-include", str(folder), env=env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(message), line
    assert not (tmp_path / "data").exists()  # refused before the database was created
    if "lm-eval:broken" in args:
        assert "broken.yaml, line 3: not a valid task file (did not find expected" in line


def test_harness_options_are_refused_for_other_suites(env: dict[str, str]) -> None:
    done = run_ipw("measure", "--suite", "humaneval", "--num-fewshot", "2", env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --num-fewshot, --lm-eval-include and the other lm-eval options are for lm-eval "
        "suites; use --suite lm-eval:TASK[,TASK...]"
    )


@pytest.mark.e2e
def test_an_interrupted_harness_run_resumes_with_the_same_documents(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during the second document; --resume rebuilds the suite from its stored
    configuration and runs only that document."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_CACHE"):
        monkeypatch.setenv(name, env[name])
    folder = write_tasks(tmp_path / "tasks")
    db = str(tmp_path / "runs.db")
    suite = SuiteConfig("lm-eval:tiny_gen", limit=2, lm_eval=HarnessOptions(include=str(folder)))
    answer = HarnessDocument.answer
    calls: list[str] = []

    def interrupted_at_the_second(
        self: HarnessDocument, engine: Engine, request: Request
    ) -> Completion:
        calls.append(self.task_name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return answer(self, engine, request)

    monkeypatch.setattr(HarnessDocument, "answer", interrupted_at_the_second)
    config = RunConfig(suite=suite, idle_seconds=0, allow_shared=True)
    with pytest.raises(RunInterrupted) as stopped:
        run_measure(prepare(config), db)
    assert stopped.value.tasks_saved == 1
    monkeypatch.setattr(HarnessDocument, "answer", answer)
    result = resume_measure(stopped.value.run_id, db, allow_shared=True)
    assert result.resumed_tasks == 1
    with open_store(db) as store:
        run = store.get_run(result.run_id)
        results = store.task_results(result.run_id)
    assert run.state == "complete" and run.suite == "lm-eval:tiny_gen"
    assert [r.task_id for r in results] == ["tiny_gen/0", "tiny_gen/1"]

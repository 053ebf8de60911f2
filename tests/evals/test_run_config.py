"""The run configuration: checked in full before anything is opened, stored as JSON and read back
whole; a suite's identity is its content (the same file through two paths is one suite; an
edited file is another), and the judge's engine and model are part of it, its URL not."""

from dataclasses import replace
from pathlib import Path

import pytest

from openjarvis.engine_kinds import ENGINE_KINDS
from openjarvis.errors import UserError
from openjarvis.evals.config import RunConfig, prepare
from openjarvis.evals.harness import HarnessOptions
from openjarvis.evals.judge import JudgeSpec
from openjarvis.evals.runner import prepare_resume
from openjarvis.evals.suites import SuiteConfig, load_suite_config
from openjarvis.records import RunRecord
from openjarvis.runtime.cloud import CloudEngine
from openjarvis.runtime.engines import CAPABILITIES
from openjarvis.runtime.llamacpp import LlamaCppSettings
from openjarvis.runtime.models import embedded_default

__all__: list[str] = []

TASKS = [
    '{"task_id": "add", "kind": "exact_match", "prompt": "1 + 1 =", "answer": "2"}',
    '{"task_id": "sub", "kind": "exact_match", "prompt": "3 - 1 =", "answer": "2"}',
]


def write_suite(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "good.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_configuration_reads_back_as_it_was_stored() -> None:
    config = RunConfig(
        engine="openai",
        model="gpt-4o-mini",
        suite=SuiteConfig(
            "lm-eval:arc_easy",
            limit=5,
            lm_eval=HarnessOptions(num_fewshot=3, apply_chat_template=True),
        ),
        judge=JudgeSpec("anthropic", "claude", "http://judge/v1", "JUDGE_KEY"),
        samples=2,
        temperature=0.7,
        concurrency=8,
        scope="accelerator",
        gpus="all",
    )
    assert RunConfig.from_dict(config.to_dict()) == config
    stored = config.to_dict()
    assert stored["suite"] == {
        "name": "lm-eval:arc_easy",
        "limit": 5,
        "lm_eval": {
            "num_fewshot": 3,
            "include": None,
            "fewshot_seed": 1234,
            "apply_chat_template": True,
            "fewshot_as_multiturn": False,
            "system_instruction": None,
        },
    }
    # A stored configuration without an option added since takes the option's default.
    older = {key: value for key, value in stored.items() if key != "meter"}
    assert RunConfig.from_dict(older) == config


def test_a_configuration_with_options_this_version_lacks_is_refused() -> None:
    stored = {**RunConfig().to_dict(), "warp_drive": True}
    with pytest.raises(UserError, match=r"options this ipw does not know \(warp_drive\)"):
        RunConfig.from_dict(stored)


def test_the_capability_table_is_what_each_engine_says() -> None:
    """The table the configuration is checked against (without opening an engine) and the
    engines' own limits cannot drift apart."""
    assert set(CAPABILITIES) == set(ENGINE_KINDS)
    assert CAPABILITIES["llamacpp"].concurrency == LlamaCppSettings().concurrency
    assert CAPABILITIES["openai"].concurrency == CloudEngine.concurrency
    assert CAPABILITIES["anthropic"].concurrency == CloudEngine.concurrency
    torch_engine = pytest.importorskip("openjarvis.runtime.torch.engine")
    assert CAPABILITIES["torch"].concurrency == torch_engine.TorchSettings().concurrency


@pytest.mark.parametrize("engine", ENGINE_KINDS)
def test_each_engine_refuses_more_tasks_in_flight_than_it_runs_before_loading_anything(
    engine: str, tmp_path: Path
) -> None:
    most = CAPABILITIES[engine].concurrency
    suite = SuiteConfig(str(tmp_path / "absent.jsonl"))  # not read: the options come first
    config = RunConfig(engine=engine, model="m", suite=suite, concurrency=most + 1)
    with pytest.raises(UserError) as refused:
        prepare(config)
    assert str(refused.value) == (
        f"--concurrency {most + 1} is more than the {engine} engine runs at once ({most}); "
        f"use --concurrency {most} or less"
    )
    assert list(tmp_path.iterdir()) == []


def test_one_file_through_two_paths_is_one_suite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_suite(tmp_path / "suites", TASKS)
    monkeypatch.chdir(tmp_path)
    from_above = load_suite_config(SuiteConfig("suites/good.jsonl"))
    monkeypatch.chdir(tmp_path / "suites")
    from_inside = load_suite_config(SuiteConfig("./good.jsonl"))
    assert from_above.sha256 == from_inside.sha256
    assert from_above.name == from_inside.name == "good.jsonl"
    assert from_above.location == from_inside.location == str(tmp_path / "suites" / "good.jsonl")
    # A copy elsewhere is the same suite too; an edited task makes another.
    copy = load_suite_config(SuiteConfig(str(write_suite(tmp_path / "copy", TASKS))))
    assert copy.sha256 == from_above.sha256
    edited = [TASKS[0], TASKS[1].replace('"answer": "2"', '"answer": "3"')]
    changed = load_suite_config(SuiteConfig(str(write_suite(tmp_path / "edited", edited))))
    assert changed.sha256 != from_above.sha256


def test_the_identity_covers_the_whole_suite_whatever_the_limit(tmp_path: Path) -> None:
    """--limit picks the tasks to run; the suite is the file (so an edit past the limit is
    still an edit of the suite a run was started on)."""
    path = str(write_suite(tmp_path, TASKS))
    first = load_suite_config(SuiteConfig(path, limit=1))
    assert [task.task_id for task in first.tasks] == ["add"]
    assert first.sha256 == load_suite_config(SuiteConfig(path, limit=None)).sha256


def test_prepare_stores_paths_absolute_as_provenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_suite(tmp_path / "suites", TASKS)
    (tmp_path / "tasks").mkdir()
    monkeypatch.chdir(tmp_path)
    suite = SuiteConfig("suites/good.jsonl")
    prepared = prepare(RunConfig(engine="openai", model="m", suite=suite))
    assert prepared.config.suite.name == str(tmp_path / "suites" / "good.jsonl")
    assert prepared.suite.name == "good.jsonl" and prepared.model is None
    assert [task.task_id for task in prepared.suite.tasks] == ["add", "sub"]
    config = RunConfig(
        suite=SuiteConfig("lm-eval:x", lm_eval=HarnessOptions(include="tasks")), concurrency=99
    )
    with pytest.raises(UserError, match="--concurrency 99"):  # checked before lm-eval loads
        prepare(config)
    with pytest.raises(UserError, match=r"suite file .*absent\.jsonl not found"):
        prepare(replace(config, concurrency=1, suite=SuiteConfig("absent.jsonl")))


def test_gpu_layers_reach_the_llama_cpp_engine_and_nothing_else() -> None:
    config = RunConfig(n_gpu_layers=-1)
    config.validate()
    assert config.engine_spec().n_gpu_layers == -1
    assert RunConfig.from_dict(config.to_dict()) == config  # --resume offloads alike
    with pytest.raises(UserError, match=r"--n-gpu-layers must be -1 \(every layer\)"):
        RunConfig(n_gpu_layers=-2).validate()
    with pytest.raises(UserError, match="--n-gpu-layers is for --engine llamacpp"):
        RunConfig(engine="torch", n_gpu_layers=4).validate()


def test_a_run_stored_before_its_configuration_or_complete_is_not_resumed() -> None:
    older = RunRecord("m", None, None, "llamacpp", {}, "humaneval", {}, "system", None, "x", "1")
    older.id, older.state = "3f2a", "interrupted"
    with pytest.raises(UserError, match="run 3f2a was stored before ipw kept a run's config"):
        prepare_resume(older)
    older.state = "complete"
    with pytest.raises(UserError, match="run 3f2a is already complete; nothing to resume"):
        prepare_resume(older)


def test_model_files_are_stored_absolute_for_a_resume_from_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.gguf").symlink_to(embedded_default().path)
    open_suite = '{"task_id": "q", "kind": "open_ended", "prompt": "Why?"}'
    write_suite(tmp_path / "suites", [open_suite])
    monkeypatch.chdir(tmp_path)
    config = RunConfig(
        model="models/m.gguf",
        suite=SuiteConfig("suites/good.jsonl"),
        judge=JudgeSpec("llamacpp", "models/m.gguf"),
    )
    prepared = prepare(config)
    assert prepared.model is not None and prepared.judge_model is not None
    assert prepared.config.model == str(prepared.model.path)
    assert prepared.config.judge == JudgeSpec("llamacpp", str(prepared.judge_model.path))
    assert Path(prepared.config.model).is_absolute()

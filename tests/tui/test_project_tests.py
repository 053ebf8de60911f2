"""`/test`: the test command found from a project's files or set by the user, run for real in
the project with its joules; a failing run names its failures and, on `y`, hands them to the
model as the next message."""

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from openjarvis.tui import AssistantApp
from openjarvis.tui.project_tests import detect_test_command, failure_lines
from openjarvis.tui.widgets import FailuresPrompt, Notice, ToolView
from tests.tui.pilot import ask, run, settle
from tests.tui.scripted import ScriptedEngine

FAILING_TEST = "def test_adds():\n    assert 1 + 1 == 3\n\n\ndef test_holds():\n    assert True\n"


@pytest.mark.parametrize(
    ("files", "command"),
    [
        ({"package.json": json.dumps({"scripts": {"test": "jest"}})}, "npm test"),
        ({"Cargo.toml": "[package]\n"}, "cargo test"),
        ({"go.mod": "module x\n"}, "go test ./..."),
        ({"pyproject.toml": "[project]\n"}, "python3 -m pytest -q"),
        ({"tests/test_a.py": ""}, "python3 -m pytest -q"),
        ({"test_a.py": "", ".venv/bin/python": ""}, ".venv/bin/python -m pytest -q"),
    ],
)
def test_the_command_is_found_from_the_project_files(
    tmp_path: Path, files: dict[str, str], command: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert detect_test_command(tmp_path)[0] == command


def test_no_command_says_why(tmp_path: Path) -> None:
    (tmp_path / "package.json").write_text(json.dumps({"scripts": {"build": "tsc"}}))
    command, why = detect_test_command(tmp_path)
    assert command is None and "no package.json test script" in why


def test_failure_lines_pick_the_failures_of_each_runner() -> None:
    output = "\n".join(
        [
            "..F",
            "FAILED test_a.py::test_adds - assert 2 == 3",
            "1 failed, 2 passed in 0.02s",
            "--- FAIL: TestAdd (0.00s)",
            "thread 'adds' panicked at src/lib.rs:4:5:",
            "ok      example.com/x   0.002s",
        ]
    )
    assert failure_lines(output) == [
        "FAILED test_a.py::test_adds - assert 2 == 3",
        "--- FAIL: TestAdd (0.00s)",
        "thread 'adds' panicked at src/lib.rs:4:5:",
    ]


def test_a_failing_run_shows_its_failures_and_hands_them_to_the_model(
    make_app: Callable[..., AssistantApp], project: Path
) -> None:
    (project / "test_math.py").write_text(FAILING_TEST)
    engine = ScriptedEngine(["The test expects 3; 1 + 1 is 2."])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(140, 50)) as pilot:
            await settle(pilot)
            await ask(pilot, f"/test {sys.executable} -m pytest -q -p no:cacheprovider")
            await settle(pilot, until=lambda: bool(app.query(FailuresPrompt)))
            prompt = app.query_one(FailuresPrompt)
            shown = str(prompt.query("Static").first().render())
            assert "FAILED test_math.py::test_adds" in shown and "test_holds" not in shown
            panel = app.query(ToolView).last()
            assert "failed (exit 1)" in panel.title and " J" in panel.title
            notices = [str(n.source) for n in app.query(Notice)]
            assert any(n.startswith("Tests failed (exit 1) · ") for n in notices)
            await pilot.press("y")
            await settle(pilot)
            (request,) = engine.requests
            last = request.messages[-1]
            assert last.role == "user" and "FAILED test_math.py::test_adds" in last.content
            assert not app.query(FailuresPrompt)

    run(scenario())


def test_a_passing_run_says_so_and_offers_nothing(
    make_app: Callable[..., AssistantApp], project: Path
) -> None:
    (project / "test_ok.py").write_text("def test_holds():\n    assert True\n")
    engine = ScriptedEngine([])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(140, 50)) as pilot:
            await settle(pilot)
            await ask(pilot, f"/test {sys.executable} -m pytest -q -p no:cacheprovider")
            await settle(pilot)
            notices = [str(n.source) for n in app.query(Notice)]
            assert any(n.startswith("Tests passed · ") for n in notices), notices
            assert not app.query(FailuresPrompt) and not engine.requests

    run(scenario())

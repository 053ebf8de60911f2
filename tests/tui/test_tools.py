"""Tool calls through the app: read without asking, refusals, approvals, shell, undo, the
limit of calls in one turn."""

import subprocess
from collections.abc import Callable
from pathlib import Path

from openjarvis.tui import AssistantApp
from openjarvis.tui.tooling import MAX_TOOL_ROUNDS
from openjarvis.tui.tools import PendingEdit
from openjarvis.tui.widgets import ApprovalPrompt, Notice, ToolView
from tests.tui.pilot import ask, init_git, run, settle
from tests.tui.scripted import ScriptedEngine

EDIT = """I will change the greeting.
<tool edit_file>
hello.py
<<<<<<< SEARCH
print("hello")
=======
print("hello, world")
>>>>>>> REPLACE
</tool>"""


def last_user_turn(engine: ScriptedEngine) -> str:
    return engine.requests[-1].messages[-1].content


def awaiting_approval(app: AssistantApp) -> Callable[[], bool]:
    return lambda: bool(app.query(ApprovalPrompt))


def test_read_file_runs_at_once_and_its_result_goes_back(
    make_app: Callable[..., AssistantApp],
) -> None:
    engine = ScriptedEngine(["Let me look.\n<tool read_file>\nhello.py\n</tool>", "It greets."])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "what does hello.py do?")
            await settle(pilot)
            assert len(engine.requests) == 2
            result = last_user_turn(engine)
            assert result.startswith('<result tool="read_file">') and 'print("hello")' in result
            # The stop sequence cut the call; the history keeps it whole for the model.
            assert engine.requests[1].messages[-2].content.endswith("</tool>")
            assert "read_file hello.py" in str(app.query_one(ToolView).title)
            assert not app.query(ApprovalPrompt)

    run(scenario())


def test_paths_outside_the_working_directory_are_refused(
    make_app: Callable[..., AssistantApp], project: Path
) -> None:
    (project.parent / "secret.txt").write_text("the password")
    (project / "link").symlink_to(project.parent / "secret.txt")
    engine = ScriptedEngine(
        [
            "<tool read_file>\n../secret.txt\n</tool>",
            "<tool read_file>\nlink\n</tool>",
            f"<tool write_file>\n{project.parent / 'evil.py'}\nx = 1\n</tool>",
            "I cannot read it.",
        ]
    )
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "read ../secret.txt")
            await settle(pilot)
            results = [request.messages[-1].content for request in engine.requests[1:]]
            assert all("outside the working directory" in result for result in results)
            assert not any("the password" in result for result in results)
            assert not app.query(ApprovalPrompt)

    run(scenario())
    assert not (project.parent / "evil.py").exists()


def test_edit_is_shown_as_a_diff_and_applied_only_after_yes_then_undone(
    make_app: Callable[..., AssistantApp], project: Path
) -> None:
    init_git(project)
    engine = ScriptedEngine([EDIT, "Done."])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "greet the world")
            await settle(pilot, awaiting_approval(app))
            prompt = app.query_one(ApprovalPrompt)
            assert isinstance(prompt.pending, PendingEdit)
            assert '+print("hello, world")' in prompt.pending.plan.diff
            assert '-print("hello")' in prompt.pending.plan.diff
            assert (project / "hello.py").read_text() == 'print("hello")\n'
            assert len(engine.requests) == 1  # the model waits for the decision
            await pilot.press("y")
            await settle(pilot)
            assert (project / "hello.py").read_text() == 'print("hello, world")\n'
            assert "applied to hello.py" in last_user_turn(engine)
            await ask(pilot, "/undo")
            await settle(pilot)
            assert (project / "hello.py").read_text() == 'print("hello")\n'
            notices = [str(n.source) for n in app.query(".notice").results(Notice)]
            assert any("undone: hello.py" in n and "git:" in n for n in notices)
            # The model hears of the undo with the next message.
            assert "/undo" in app.chat.conversation.messages[-1].content

    run(scenario())
    done = subprocess.run(["git", "status", "--short"], cwd=project, capture_output=True, text=True)
    assert done.stdout == ""  # back to exactly what was committed


def test_a_declined_edit_changes_nothing_and_the_model_waits(
    make_app: Callable[..., AssistantApp], project: Path
) -> None:
    engine = ScriptedEngine([EDIT])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "greet the world")
            await settle(pilot, awaiting_approval(app))
            await pilot.press("n")
            await settle(pilot)
            assert not app.query(ApprovalPrompt)
            assert "declined" in app.chat.conversation.messages[-1].content
            assert len(engine.requests) == 1

    run(scenario())
    assert (project / "hello.py").read_text() == 'print("hello")\n'


def test_always_approves_later_edits_of_the_session(
    make_app: Callable[..., AssistantApp], project: Path
) -> None:
    second = "<tool write_file>\nnew.py\nx = 1\n</tool>"
    engine = ScriptedEngine([EDIT, second, "Both done."])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "change two files")
            await settle(pilot, awaiting_approval(app))
            await pilot.press("a")
            await settle(pilot)
            assert len(engine.requests) == 3
            assert not app.query(ApprovalPrompt)

    run(scenario())
    assert (project / "new.py").read_text() == "x = 1\n"
    assert (project / "hello.py").read_text() == 'print("hello, world")\n'


def test_a_shell_command_asks_first_then_runs_in_the_folder(
    make_app: Callable[..., AssistantApp], project: Path
) -> None:
    engine = ScriptedEngine(["<tool run>\necho ran > out.txt && pwd\n</tool>", "It ran."])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "run it")
            await settle(pilot, awaiting_approval(app))
            assert not (project / "out.txt").exists()
            await pilot.press("y")
            await settle(pilot)
            result = last_user_turn(engine)
            assert str(project) in result and "[exit code 0]" in result

    run(scenario())
    assert (project / "out.txt").read_text() == "ran\n"


def test_a_failed_search_block_goes_back_to_the_model_without_asking(
    make_app: Callable[..., AssistantApp], project: Path
) -> None:
    wrong = EDIT.replace('print("hello")\n=', 'print("bye")\n=')
    engine = ScriptedEngine([wrong, "Sorry."])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "change it")
            await settle(pilot)
            assert "does not occur in hello.py" in last_user_turn(engine)
            assert not app.query(ApprovalPrompt)

    run(scenario())


def test_a_turn_stops_after_the_most_tool_calls_it_may_make(
    make_app: Callable[..., AssistantApp],
) -> None:
    looping = ["<tool list_files>\n\n</tool>"] * (MAX_TOOL_ROUNDS + 1)
    engine = ScriptedEngine(looping)
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "list the files")
            await settle(pilot)
            assert len(engine.requests) == MAX_TOOL_ROUNDS + 1
            assert len(app.query(ToolView)) == MAX_TOOL_ROUNDS
            notices = [str(n.source) for n in app.query(".notice").results(Notice)]
            assert any(f"Stopped: {MAX_TOOL_ROUNDS} tool calls" in n for n in notices)

    run(scenario())


def test_an_identical_repeated_call_is_not_run_again_and_the_model_is_told(
    make_app: Callable[..., AssistantApp],
) -> None:
    """A base model repeating the system prompt's example call: the second identical call of the
    turn runs nothing, says so in its panel, and tells the model to use the first result."""
    call = "<tool read_file>\nhello.py\n</tool>"
    engine = ScriptedEngine([call, call, "It greets."])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "what does hello.py do?")
            await settle(pilot)
            first, second = app.query(ToolView)
            assert "repeated" not in str(first.title)
            assert str(second.title).endswith("· repeated, not run again")
            assert "the same call as call 1 of this turn" in last_user_turn(engine)
            assert 'print("hello")' not in last_user_turn(engine)

    run(scenario())

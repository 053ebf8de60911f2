"""The pieces under the app: protocol parsing, edits and undo, path checks, shell, context,
reply streams, the tool runner and the live status."""

from pathlib import Path
from typing import Any

import pytest

from openjarvis.errors import UserError
from openjarvis.runtime.engines import EngineSpec
from openjarvis.tui.conversation import Conversation
from openjarvis.tui.edits import UndoStack, apply_edit, plan_edit, plan_write
from openjarvis.tui.energy import LiveWatts, ReplyEnergy
from openjarvis.tui.engines import engine_spec
from openjarvis.tui.protocol import ToolCall, parse_reply
from openjarvis.tui.replies import FLUSH_S, ReplyStream
from openjarvis.tui.shell import MAX_OUTPUT_CHARS, run_command
from openjarvis.tui.status import LiveStatus, render_status
from openjarvis.tui.tooling import MAX_TOOL_ROUNDS, ToolOutcome, ToolRunner
from openjarvis.tui.tools import PendingCommand, PendingEdit
from openjarvis.tui.workspace import MAX_READ_CHARS, ToolRefused, Workspace
from tests.fakes.clock import FakeClock
from tests.tui.fixed_meter import FixedMeter
from tests.tui.scripted import ScriptedEngine


def test_parse_reply_splits_prose_from_the_call() -> None:
    prose, call = parse_reply("Looking.\n<tool read_file>\nsrc/a.py\n", stopped_at_close=True)
    assert prose == "Looking."
    assert call is not None and call.name == "read_file" and call.first_line == "src/a.py"
    assert call.complete
    _, cut = parse_reply("<tool write_file>\na.py\nx = ", stopped_at_close=False)
    assert cut is not None and not cut.complete and cut.rest == "x = "
    assert parse_reply("no tools here", stopped_at_close=True) == ("no tools here", None)
    echoed = "write <tool NAME> then the arguments"  # a small model echoing the prompt
    assert parse_reply(echoed, stopped_at_close=True) == (echoed, None)


def test_search_replace_blocks_apply_once_each(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    (tmp_path / "a.py").write_text("a = 1\nb = 2\nc = 3\n")
    blocks = (
        "<<<<<<< SEARCH\na = 1\n=======\na = 10\n>>>>>>> REPLACE\n"
        "<<<<<<< SEARCH\nc = 3\n=======\n>>>>>>> REPLACE\n"
    )
    plan = plan_edit(workspace, "a.py", blocks)
    assert plan.after == "a = 10\nb = 2\n"
    assert "-c = 3" in plan.diff and "+a = 10" in plan.diff
    (tmp_path / "b.py").write_text("x\nx\n")
    with pytest.raises(ToolRefused, match="occurs 2 times"):
        plan_edit(workspace, "b.py", "<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE")
    with pytest.raises(ToolRefused, match="no SEARCH/REPLACE block"):
        plan_edit(workspace, "a.py", "a = 1 -> a = 2")
    with pytest.raises(ToolRefused, match="write_file"):
        plan_edit(workspace, "missing.py", blocks)


def test_an_edit_refuses_a_file_changed_after_its_diff_and_undo_refuses_too(
    tmp_path: Path,
) -> None:
    workspace = Workspace(tmp_path)
    path = tmp_path / "a.py"
    path.write_text("old\n")
    plan = plan_write(workspace, "a.py", "new")
    path.write_text("changed meanwhile\n")
    with pytest.raises(ToolRefused, match="changed since the diff"):
        apply_edit(workspace, plan)
    path.write_text("old\n")
    undo = UndoStack(workspace)
    undo.push(apply_edit(workspace, plan))
    assert path.read_text() == "new\n"
    path.write_text("the user's own change\n")
    assert undo.undo().startswith("not undone")
    assert path.read_text() == "the user's own change\n"


def test_undo_of_a_new_file_removes_it_outside_git(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    undo = UndoStack(workspace)
    assert undo.undo().startswith("nothing to undo")
    undo.push(apply_edit(workspace, plan_write(workspace, "pkg/new.py", "x = 1\n")))
    assert (tmp_path / "pkg" / "new.py").exists()
    message = undo.undo()
    assert message.startswith("undone: pkg/new.py") and "git" not in message
    assert not (tmp_path / "pkg" / "new.py").exists()


def test_workspace_refuses_escapes_and_says_when_it_cuts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    workspace = Workspace(root)
    for outside in ("../x", "/etc/passwd", "a/../../x"):
        with pytest.raises(ToolRefused, match="outside the working directory"):
            workspace.resolve(outside)
    (root / "big.txt").write_text("y" * (MAX_READ_CHARS + 10))
    assert workspace.read_file("big.txt").endswith(f"of {MAX_READ_CHARS + 10:,} characters]")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("needle")
    (root / "src").mkdir()
    (root / "src" / "m.py").write_text("a\nneedle here\n")
    assert workspace.list_files("") == "big.txt\nsrc/m.py"
    assert workspace.search_files("needle", "") == "src/m.py:2: needle here"


def test_shell_commands_time_out_and_long_output_is_cut_visibly(tmp_path: Path) -> None:
    slow = run_command("echo started; sleep 30", tmp_path, timeout_s=0.5)
    assert slow.exit_code is None and "started" in slow.output
    assert "time limit" in slow.for_model()
    loud = run_command(f"head -c {MAX_OUTPUT_CHARS * 2} /dev/zero | tr '\\0' x", tmp_path, 10)
    assert loud.exit_code == 0
    assert f"[cut: the last {MAX_OUTPUT_CHARS:,} of {MAX_OUTPUT_CHARS * 2:,}" in loud.for_model()


def test_conversation_counts_become_exact_and_requests_alternate_roles() -> None:
    conversation = Conversation("system text")
    conversation.add("user", "hello there")
    assert not conversation.exact
    conversation.add_reply("<tool read_file>\na.py\n</tool>", prompt_tokens=50, completion_tokens=9)
    assert conversation.exact and conversation.used_tokens == 59
    conversation.add("tool", '<result tool="read_file">\nx\n</result>')
    conversation.add("user", "and then?")
    request = conversation.request(max_tokens=100)
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "user"]
    assert request.stop == ("</tool>",)
    conversation.add_reply("done", prompt_tokens=80, completion_tokens=1)
    assert conversation.used_tokens == 81
    check = conversation.check(context_tokens=100, reply_tokens=25)
    assert not check.fits and check.droppable_turns == 1


def test_model_specs_name_local_files_and_cloud_models() -> None:
    assert engine_spec(None) == engine_spec("default") == EngineSpec()
    assert engine_spec("models/x.gguf") == EngineSpec(model="models/x.gguf")
    assert engine_spec("openai:gpt-4o-mini") == EngineSpec(kind="openai", model="gpt-4o-mini")
    local_server = engine_spec("openai:qwen@http://127.0.0.1:8000/v1")
    assert local_server.kind == "openai" and local_server.base_url == "http://127.0.0.1:8000/v1"
    with pytest.raises(UserError, match="names no model"):
        engine_spec("anthropic:")


def stepping_engine(replies: list[str], **kwargs: Any) -> ScriptedEngine:
    clock = FakeClock()

    def stepping() -> float:
        clock.advance(0.05)
        return clock()

    return ScriptedEngine(replies, clock=stepping, **kwargs)


def test_a_reply_stream_relays_in_batches_and_stops_with_the_energy_spent() -> None:
    words = " ".join(f"w{index}" for index in range(40))
    request = Conversation("system").request(max_tokens=100)
    relayed: list[tuple[str, int]] = []
    whole = ReplyStream(FixedMeter(), stepping_engine([words]), request)
    outcome = whole.run(lambda text, pieces, time_s: relayed.append((text, pieces)))
    assert outcome.completion is not None and outcome.error is None
    assert "".join(text for text, _ in relayed) == words
    # A chunk every 50 ms, a relay every FLUSH_S at most: about five chunks a relay, not one.
    assert sum(pieces for _, pieces in relayed) == 40 and len(relayed) <= 40 * 0.05 / FLUSH_S + 1
    assert outcome.energy == ReplyEnergy(12.5, "counter", None)

    stopped = ReplyStream(FixedMeter(), stepping_engine([words]), request)
    seen: list[str] = []

    def stop_after_first(text: str, pieces: int, time_s: float) -> None:
        seen.append(text)
        stopped.stop()

    outcome = stopped.run(stop_after_first)
    assert outcome.completion is None and outcome.error == "stopped"
    assert 0 < len("".join(seen).split()) < 40
    assert outcome.energy == ReplyEnergy(12.5, "counter", None)  # spent, so still counted

    cloud = stepping_engine(["an answer"], cloud_joules_per_token=0.5)
    estimated = ReplyStream(FixedMeter(), cloud, request).run(lambda *_: None)
    assert estimated.energy is not None and estimated.energy.method == "estimate"


def test_the_tool_runner_counts_rounds_and_reports_each_outcome(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    runner = ToolRunner(Workspace(tmp_path), shell_timeout_s=10.0)
    assert all(runner.next_round() for _ in range(MAX_TOOL_ROUNDS))
    assert not runner.next_round()
    runner.new_turn()
    assert runner.next_round()
    read = runner.prepare(ToolCall("read_file", "a.py", complete=True))
    assert isinstance(read, ToolOutcome) and read.title == "read_file a.py · 1 lines"
    assert read.for_model == '<result tool="read_file">\nx = 1\n\n</result>'
    refused = runner.prepare(ToolCall("read_file", "../b.py", complete=True))
    assert isinstance(refused, ToolOutcome) and refused.result.startswith("refused: ")
    edit = runner.prepare(ToolCall("write_file", "a.py\nx = 2", complete=True))
    assert isinstance(edit, PendingEdit) and not runner.approved_already(edit)
    assert "declined this edit" in runner.decline(edit).result
    applied = runner.apply(edit)
    assert applied.result == "applied to a.py" and "+x = 2" in applied.shown
    assert len(runner.undo_stack) == 1
    runner.approve_always(edit)
    assert runner.approved_already(edit)
    command = runner.prepare(ToolCall("run", "echo hi", complete=True))
    assert isinstance(command, PendingCommand) and not runner.approved_already(command)
    ran = runner.run_command(command)
    assert ran.title == "$ echo hi · exit 0" and "hi\n" in ran.result


def test_live_status_integrates_the_watts_while_a_reply_streams() -> None:
    clock = FakeClock()
    live = LiveStatus(LiveWatts(FixedMeter(power_w=40.0)), clock=clock)
    live.tick()
    assert live.state.watts_now == 40.0 and live.state.reply_j is None
    live.reply_started()
    live.reply_streamed(pieces=1, time_s=clock())
    clock.advance(0.5)
    live.reply_streamed(pieces=10, time_s=clock())
    live.tick()
    assert live.state.reply_j == pytest.approx(20.0)  # 40 W for 0.5 s
    assert live.state.tokens_per_s == pytest.approx(20.0)  # 10 more chunks in 0.5 s
    assert "reply 20.0 J so far" in render_status(live.state)
    live.reply_ended(ReplyEnergy(12.5, "counter", None), None)
    assert live.state.reply_j == 12.5 and not live.state.reply_live
    assert "so far" not in render_status(live.state)

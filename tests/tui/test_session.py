"""Context honesty, cloud estimates and /cost, /model, /clear, /help, history and --resume."""

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from openjarvis.errors import UserError
from openjarvis.power import Meter
from openjarvis.store import Store, assistant_messages
from openjarvis.tui import AssistantApp
from openjarvis.tui.engines import LoadedModel
from openjarvis.tui.session import latest_session_id
from openjarvis.tui.status import render_status
from openjarvis.tui.widgets import ContextPrompt, HistoryInput, Notice, ReplyView
from tests.tui.pilot import ask, run, settle
from tests.tui.scripted import ScriptedEngine

LONG = " ".join(["word"] * 150)  # about 250 tokens by the app's estimate


def notices(app: AssistantApp) -> str:
    return "\n".join(str(notice.source) for notice in app.query(".notice").results(Notice))


def test_a_request_beyond_the_context_asks_before_dropping_old_turns(
    make_app: Callable[..., AssistantApp], store: Store
) -> None:
    engine = ScriptedEngine(["first answer", "second answer"])
    app = make_app(engine, context_tokens=1200)  # replies get a budget of 300 tokens

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, f"first {LONG} {LONG}")
            await settle(pilot)
            await ask(pilot, f"second {LONG} {LONG}")
            await settle(pilot, lambda: bool(app.query(ContextPrompt)))
            assert len(engine.requests) == 1  # nothing was sent, nothing was cut
            check = app.query_one(ContextPrompt).check
            assert check.needed_tokens > 1200 and check.droppable_turns == 1
            assert "context full" in render_status(app.status)
            await pilot.press("d")
            await settle(pilot)
            assert len(engine.requests) == 2
            sent = "\n".join(m.content for m in engine.requests[1].messages)
            assert "second" in sent and "first" not in sent
            assert "Dropped 2 old messages" in notices(app)

    run(scenario())
    stored = assistant_messages(store, app.chat.log.session_id or "")
    assert [m.in_context for m in stored] == [False, False, True, True]


def test_cancelling_keeps_the_message_out_of_the_context(
    make_app: Callable[..., AssistantApp],
) -> None:
    engine = ScriptedEngine(["never sent"])
    app = make_app(engine, context_tokens=400)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, f"{LONG} {LONG}")
            await settle(pilot, lambda: bool(app.query(ContextPrompt)))
            assert app.query_one(ContextPrompt).check.droppable_turns == 0
            await pilot.press("d")  # nothing to drop: ignored
            await pilot.press("c")
            await settle(pilot)
            assert engine.requests == []
            assert "Not sent" in notices(app)
            assert not app.chat.conversation.in_context
            assert not app.busy

    run(scenario())


def test_context_use_is_always_shown_and_marked_while_estimated(
    make_app: Callable[..., AssistantApp],
) -> None:
    engine = ScriptedEngine(["ok"])
    app = make_app(engine, context_tokens=4096)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            assert "ctx ~" in render_status(app.status)  # only the system prompt, estimated
            await ask(pilot, "hi")
            await settle(pilot)
            request = engine.requests[0]
            prompt_tokens = sum(len(m.content.split()) + 4 for m in request.messages)
            assert f"ctx {prompt_tokens + 1:,}/4,096" in render_status(app.status)

    run(scenario())


def test_cloud_replies_show_the_estimate_labelled_and_cost_by_model(
    make_app: Callable[..., AssistantApp],
) -> None:
    local = ScriptedEngine(["local answer"])
    cloud = ScriptedEngine(
        ["cloud answer here"],
        name="cloud-model",
        kind="openai",
        cloud_joules_per_token=0.5,
        cost_usd_per_token=0.001,
    )
    app = make_app(local, cloud)

    async def scenario() -> None:
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "question one")
            await settle(pilot)
            await ask(pilot, "/model cloud-model")
            await settle(pilot)
            assert local.closed and app.status.model == "cloud-model"
            await ask(pilot, "question two")
            await settle(pilot)
            footer = str(app.query(ReplyView).last().query_one(".reply-footer").render())
            assert "(estimate)" in footer and footer.startswith("≈") and "$0.0030" in footer
            await ask(pilot, "/cost")
            await settle(pilot)
            table = str(app.query(".notice").last(Notice).source)
            assert "| scripted-model | 1 |" in table and "| local |" in table
            assert "| cloud-model | 1 | 3 |" in table and "$0.0030" in table
            assert "(estimate)" in table

    run(scenario())


def test_help_clear_and_input_history(make_app: Callable[..., AssistantApp]) -> None:
    engine = ScriptedEngine(["one", "two"])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "/help")
            await settle(pilot)
            assert "/undo" in notices(app) and "/cost" in notices(app)
            await ask(pilot, "first question")
            await settle(pilot)
            first_session = app.chat.log.session_id
            await ask(pilot, "/clear")
            await settle(pilot)
            assert app.chat.conversation.messages == [] and app.chat.energy.energy_j == 0
            assert not app.query(ReplyView)
            await ask(pilot, "second question")
            await settle(pilot)
            assert app.chat.log.session_id not in (None, first_session)
            prompt = app.query_one(HistoryInput)
            prompt.focus()
            await pilot.press("up")
            assert prompt.value == "second question"
            await pilot.press("up", "up")
            assert prompt.value == "first question"
            await pilot.press("down", "down", "down")
            assert prompt.value == ""

    run(scenario())


def test_resume_continues_the_last_session_of_the_folder(
    make_app: Callable[..., AssistantApp], store: Store, project: Path
) -> None:
    first = ScriptedEngine(["The answer is 42."])
    app = make_app(first)

    async def chat_once(app: AssistantApp, text: str) -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, text)
            await settle(pilot)

    run(chat_once(app, "what is the answer?"))
    session_id = latest_session_id(store, project)
    assert session_id == app.chat.log.session_id
    second = ScriptedEngine(["You asked about the answer."])
    resumed = make_app(second, resume_session=session_id)
    run(chat_once(resumed, "what did I ask?"))
    sent = [m.content for m in second.requests[0].messages]
    assert "what is the answer?" in sent and "The answer is 42." in sent
    assert resumed.chat.energy.by_model["scripted-model"].replies == 2
    assert len(assistant_messages(store, session_id)) == 4
    with pytest.raises(UserError, match="no earlier jarvis session"):
        latest_session_id(store, project / "elsewhere")


def test_a_tool_call_cut_off_by_the_token_limit_is_not_run(
    make_app: Callable[..., AssistantApp],
) -> None:
    cut = "<tool write_file>\nbig.py\n" + "x = 1\n" * 400  # beyond the 1,024-token budget
    engine = ScriptedEngine([cut, "I will write less."])
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "write a big file")
            await settle(pilot)
            assert "cut off before </tool>" in engine.requests[-1].messages[-1].content
            footer = str(app.query(ReplyView).first().query_one(".reply-footer").render())
            assert "cut off at the reply's token limit" in footer

    run(scenario())


def test_escape_stops_a_streaming_reply(make_app: Callable[..., AssistantApp]) -> None:
    engine = ScriptedEngine([" ".join(["slow"] * 200)], delay_s=0.02)
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "talk")
            await settle(pilot, lambda: app.query(ReplyView) and app.query_one(ReplyView).text)
            await pilot.press("escape")
            await settle(pilot)
            reply = app.query_one(ReplyView)
            assert 0 < reply.text.count("slow") < 200
            assert "stopped" in str(reply.query_one(".reply-footer").render())
            assert app.chat.conversation.messages[-1].role == "user"  # a stopped reply is not kept

    run(scenario())


def test_jarvis_says_once_that_a_base_model_is_no_chat_model(
    project: Path, store: Store, meter: Meter
) -> None:
    note = "note: base-model is a base model (no chat template): chat replies will be poor"
    base = ScriptedEngine(["szpital"], name="base-model")
    chat = ScriptedEngine(["an answer"], name="chat-model")
    loaded = {
        None: LoadedModel(base, 4096, None, note),
        "chat-model": LoadedModel(chat, 4096, "chat-model"),
    }
    app = AssistantApp(
        opener=lambda spec: loaded[spec],
        model_spec=None,
        meter=meter,
        store=store,
        working_dir=project,
        resume_session=None,
    )

    async def scenario() -> None:
        async with app.run_test(size=(160, 40)) as pilot:
            await settle(pilot)
            assert notices(app).count(note) == 1
            await ask(pilot, "hello")
            await settle(pilot)
            assert notices(app).count(note) == 1  # not again with each reply
            await ask(pilot, "/model chat-model")
            await settle(pilot)
            assert app.status.model == "chat-model" and notices(app).count(note) == 1

    run(scenario())


def test_a_question_asked_while_the_model_fails_to_load_is_not_sent_later(
    project: Path, store: Store, meter: Meter
) -> None:
    asked = threading.Event()

    def failing_opener(spec: str | None) -> LoadedModel:
        asked.wait(10)
        raise UserError("no such model: missing.gguf")

    app = AssistantApp(
        opener=failing_opener,
        model_spec="missing.gguf",
        meter=meter,
        store=store,
        working_dir=project,
    )

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await ask(pilot, "hello")
            asked.set()
            await settle(pilot)
            assert "Could not load the model: no such model" in notices(app)
            assert "Your message was not sent." in notices(app)
            assert "no model: /model PATH.gguf" in render_status(app.status)

    run(scenario())
    stored = assistant_messages(store, app.chat.log.session_id or "")
    assert [(m.content, m.in_context) for m in stored] == [("hello", False)]


def test_cost_of_a_remote_model_without_a_price_is_no_price_not_local(
    make_app: Callable[..., AssistantApp],
) -> None:
    """A remote model whose price the table lacks is not free: /cost says `no price`."""
    unpriced = ScriptedEngine(
        ["cloud answer here"], name="unpriced-model", kind="openai", cloud_joules_per_token=0.5
    )
    app = make_app(unpriced)

    async def scenario() -> None:
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "question")
            await settle(pilot)
            await ask(pilot, "/cost")
            await settle(pilot)
            table = str(app.query(".notice").last(Notice).source)
            row = next(line for line in table.splitlines() if "unpriced-model" in line)
            assert row.rstrip().endswith("| no price |") and "local" not in row

    run(scenario())

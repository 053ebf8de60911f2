"""The chat: streamed Markdown replies, the status bar's energy and context, history, /help."""

import re
from collections.abc import Callable

from textual.widgets import Markdown

from openjarvis.store import assistant_messages
from openjarvis.tui import AssistantApp
from openjarvis.tui.status import render_status
from openjarvis.tui.widgets import ReplyView
from tests.tui.pilot import ask, run, settle
from tests.tui.scripted import ScriptedEngine


def test_reply_streams_as_markdown_and_status_shows_energy(
    make_app: Callable[..., AssistantApp],
) -> None:
    engine = ScriptedEngine(["Use **print**:\n\n```python\nprint('hi')\n```\n"], delay_s=0.01)
    app = make_app(engine)

    async def scenario() -> None:
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(pilot)
            await ask(pilot, "how do I print?")
            await settle(pilot)
            reply = app.query_one(ReplyView)
            assert "print('hi')" in reply.text
            body = reply.query_one(Markdown).source
            assert "```python" in body
            footer = str(reply.query_one(".reply-footer").render())
            # A measured figure ("0.42 J"), not the "— J" of an unknown one.
            assert re.search(r"\d J\b", footer) and "— J" not in footer and "tokens" in footer
            status = render_status(app.status)
            assert "scripted-model" in status and "ctx " in status and "tok/s" in status
            context = next(part for part in status.split(" │ ") if part.startswith("ctx"))
            assert "~" not in context  # the engine counted the context
            assert app.chat.energy.by_model["scripted-model"].replies == 1

    run(scenario())
    session_id = app.chat.log.session_id
    assert session_id is not None
    stored = assistant_messages(app.chat.log._store, session_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    reply = stored[1]
    assert reply.completion_tokens and reply.completion_tokens > 0
    # Energy is measured (positive) or unknown with a reason, never a silent 0.
    assert (reply.energy_j or 0) > 0 or reply.energy_null_reason

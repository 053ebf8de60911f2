"""The assistant's sessions and messages, on SQLite and PostgreSQL: order, context flags, the
latest session of a folder, and energy that is unknown staying null."""

import dataclasses
from typing import Any

import pytest

from openjarvis.store import (
    AssistantMessageRecord,
    Store,
    add_assistant_message,
    assistant_messages,
    create_assistant_session,
    latest_assistant_session,
    set_out_of_context,
)


def message(role: str, content: str, **changes: Any) -> AssistantMessageRecord:
    plain = AssistantMessageRecord(
        role=role, content=content, context_tokens=12, context_tokens_exact=False
    )
    return dataclasses.replace(plain, **changes)


def test_messages_come_back_in_order_with_their_energy_and_flags(store: Store) -> None:
    session_id = create_assistant_session(store, "/work/project", "gemma")
    first = add_assistant_message(store, session_id, message("user", "hi"))
    reply = message(
        "assistant",
        "hello",
        model_name="cloud-model",
        prompt_tokens=40,
        completion_tokens=2,
        energy_j=1.5,
        energy_method="estimate",
        cost_usd=0.002,
        context_tokens_exact=True,
    )
    add_assistant_message(store, session_id, reply)
    unknown = message("assistant", "?", model_name="gemma", energy_null_reason="no-device")
    add_assistant_message(store, session_id, unknown)
    set_out_of_context(store, session_id, [first])
    stored = assistant_messages(store, session_id)
    assert [m.content for m in stored] == ["hi", "hello", "?"]
    assert [m.in_context for m in stored] == [False, True, True]
    assert stored[1].energy_j == 1.5 and stored[1].energy_method == "estimate"
    assert stored[1].cost_usd == 0.002 and stored[1].context_tokens_exact
    assert stored[2].energy_j is None and stored[2].energy_null_reason == "no-device"
    latest = latest_assistant_session(store, "/work/project")
    assert latest is not None and latest.id == session_id
    assert latest.model_name == "gemma"  # the model of the last reply


def test_the_latest_session_is_per_folder(store: Store) -> None:
    older = create_assistant_session(store, "/a", "m")
    newer = create_assistant_session(store, "/a", "m")
    elsewhere = create_assistant_session(store, "/b", "m")
    add_assistant_message(store, older, message("user", "written last"))
    latest_a = latest_assistant_session(store, "/a")
    assert latest_a is not None and latest_a.id == older
    latest_b = latest_assistant_session(store, "/b")
    assert latest_b is not None and latest_b.id == elsewhere
    assert latest_assistant_session(store, "/c") is None
    assert newer != older


def test_unknown_roles_and_sessions_are_refused(store: Store) -> None:
    session_id = create_assistant_session(store, "/a", "m")
    with pytest.raises(ValueError, match="role must be one of"):
        add_assistant_message(store, session_id, message("system", "x"))
    with pytest.raises(ValueError, match="no assistant session"):
        add_assistant_message(store, "0" * 32, message("user", "x"))

"""Migration 0009: each logged request and assistant reply keeps how many prompt tokens came
from the engine's cache, its prefill energy and the prefill joules saved; rows stored before
read as unknown (NULL), never as 0."""

from pathlib import Path
from typing import Any

from openjarvis.store import Store, open_store
from openjarvis.store.assistant import (
    AssistantMessageRecord,
    add_assistant_message,
    assistant_messages,
    create_assistant_session,
)
from openjarvis.store.requests import log_request, request_logs
from tests.store.conftest import downgrade
from tests.store.test_store_concurrency import request

__all__: list[str] = []


def reply(**changes: Any) -> AssistantMessageRecord:
    return AssistantMessageRecord(
        role="assistant",
        content="done",
        context_tokens=3,
        context_tokens_exact=True,
        model_name="gemma",
        prompt_tokens=900,
        completion_tokens=3,
        energy_j=5.0,
        **changes,
    )


def test_reuse_figures_round_trip(store: Store) -> None:
    log_request(store, request(cached_tokens=960, prefill_energy_j=0.5, prefill_saved_j=11.25))
    log_request(store, request())
    stored = [(r.cached_tokens, r.prefill_energy_j, r.prefill_saved_j) for r in request_logs(store)]
    assert stored == [(960, 0.5, 11.25), (None, None, None)]

    session = create_assistant_session(store, "/work", "gemma")
    add_assistant_message(
        store, session, reply(cached_tokens=880, prefill_energy_j=0.25, prefill_saved_j=8.0)
    )
    (message,) = assistant_messages(store, session)
    assert (message.cached_tokens, message.prefill_energy_j, message.prefill_saved_j) == (
        880,
        0.25,
        8.0,
    )


def test_rows_stored_before_read_as_unknown(db_path: Path) -> None:
    with open_store(str(db_path)) as store:
        log_request(store, request(cached_tokens=5, prefill_saved_j=1.0))
        session = create_assistant_session(store, "/work", "gemma")
        add_assistant_message(store, session, reply(cached_tokens=4))
    downgrade(db_path, "0008_host_cores_unknown")
    with open_store(str(db_path)) as store:
        (logged,) = request_logs(store)
        assert (logged.cached_tokens, logged.prefill_saved_j) == (None, None)
        (message,) = assistant_messages(store, session)
        assert message.cached_tokens is None and message.prefill_saved_j is None

"""The results database: every run, task, energy reading and power trace, in one place.

Open it with `open_store()`; plain records from `records` go in and come back out.
"""

from openjarvis.records import (
    EnergyRecord,
    HostRecord,
    PowerSampleRecord,
    RunRecord,
    TaskResultRecord,
)
from openjarvis.store.assistant import (
    AssistantMessageRecord,
    AssistantSessionRecord,
    add_assistant_message,
    assistant_messages,
    create_assistant_session,
    latest_assistant_session,
    set_out_of_context,
)
from openjarvis.store.database import (
    DATABASE_ENV_VAR,
    default_database_url,
    open_merge_source,
    open_reader,
    open_store,
)
from openjarvis.store.liveness import ended_reason, refuse_if_live, shown_state
from openjarvis.store.merge import MergeCounts, merge_all, merge_into
from openjarvis.store.requests import RequestLogRecord, log_request, request_logs
from openjarvis.store.store import Store
from openjarvis.store.trace import PowerSeries

__all__ = [
    "DATABASE_ENV_VAR",
    "AssistantMessageRecord",
    "AssistantSessionRecord",
    "EnergyRecord",
    "HostRecord",
    "MergeCounts",
    "PowerSampleRecord",
    "PowerSeries",
    "RequestLogRecord",
    "RunRecord",
    "Store",
    "TaskResultRecord",
    "add_assistant_message",
    "assistant_messages",
    "create_assistant_session",
    "default_database_url",
    "ended_reason",
    "latest_assistant_session",
    "log_request",
    "merge_all",
    "merge_into",
    "open_merge_source",
    "open_reader",
    "open_store",
    "refuse_if_live",
    "request_logs",
    "set_out_of_context",
    "shown_state",
]

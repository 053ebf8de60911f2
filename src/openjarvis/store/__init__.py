"""The results database: every run, task, energy reading and power trace, in one place.

Open it with `open_store()`; plain records from `records` go in and come back out.
"""

from openjarvis.store.database import DATABASE_ENV_VAR, default_database_url, open_store
from openjarvis.store.records import (
    EnergyRecord,
    HostRecord,
    PowerSampleRecord,
    RunRecord,
    TaskResultRecord,
)
from openjarvis.store.store import Store

__all__ = [
    "DATABASE_ENV_VAR",
    "EnergyRecord",
    "HostRecord",
    "PowerSampleRecord",
    "RunRecord",
    "Store",
    "TaskResultRecord",
    "default_database_url",
    "open_store",
]

"""The hand-written migrations must build exactly the schema the models describe.

An empty database (SQLite and PostgreSQL) is migrated by open_store, then compared with the
models by Alembic.
"""

from datetime import UTC, datetime

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import column, create_engine, insert, inspect, table

from openjarvis.store import PowerSampleRecord, database, open_store
from openjarvis.store.models import Base, Model, Run

__all__: list[str] = []

TABLES = {"host", "model", "run", "task_result", "energy_reading", "power_trace_chunk"}
TABLES |= {"assistant_session", "assistant_message"}  # the coding assistant (tui)
TABLES |= {"request_log"}  # jarvis serve


def migrated_engine(database_url: str):
    open_store(database_url).close()
    return create_engine(database_url)


def test_migrated_schema_matches_models(database_url: str) -> None:
    engine = migrated_engine(database_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_migrated_database_is_at_head(database_url: str) -> None:
    engine = migrated_engine(database_url)
    config = Config()
    config.set_main_option("script_location", str(database.MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(config).get_current_head()
    # open_store's fast check reads the head from the scripts' text; it must agree with Alembic.
    assert database._head_revision() == head
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() == head
    engine.dispose()


def test_tables_and_nullability(database_url: str) -> None:
    engine = migrated_engine(database_url)
    inspector = inspect(engine)
    assert set(inspector.get_table_names()) == TABLES | {"alembic_version"}

    def nullable(table: str) -> dict[str, bool]:
        return {column["name"]: column["nullable"] for column in inspector.get_columns(table)}

    # Unknown energy is NULL, never 0: every energy column must accept NULL.
    task = nullable("task_result")
    assert task["energy_j"] and task["net_energy_j"] and task["energy_null_reason"]
    assert task["ttft_s"] and task["decode_tokens_per_s"]
    assert not task["latency_s"] and not task["passed"] and not task["samples"]
    reading = nullable("energy_reading")
    assert reading["energy_j"] and reading["net_energy_j"] and reading["idle_power_w"]
    assert not reading["source"] and not reading["method"] and not reading["low_resolution"]
    run = nullable("run")
    assert run["summary"] and run["finished_at"] and run["energy_method"]
    assert not run["started_at"] and not run["state"] and not run["model_id"]
    model = nullable("model")
    assert model["sha256"] and model["parameters"] and model["quantisation"]
    assert model["kind"] and model["kind_evidence"]  # unknown for cloud models and older runs

    uniques = {
        table: [tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)]
        for table in TABLES
    }
    assert uniques["host"] == [("fingerprint",)]
    assert uniques["task_result"] == [("run_id", "task_id")]
    assert uniques["model"] == [("name", "sha256")]
    chunk_indexes = inspector.get_indexes("power_trace_chunk")
    assert ["run_id"] in [index["column_names"] for index in chunk_indexes]
    engine.dispose()


def test_power_samples_survive_the_move_to_packed_chunks(database_url: str) -> None:
    """A database from before 0003 (one row per sample) keeps its power trace, in order."""
    config = Config()
    config.set_main_option("script_location", str(database.MIGRATIONS_DIR))
    engine = create_engine(database_url)
    old_samples = table(
        "power_sample", column("run_id"), column("source"), column("time_s"), column("power_w")
    )
    samples = [
        PowerSampleRecord(source=f"gpu:{i % 2}", time_s=0.5 * (i // 2), power_w=60.0 + i)
        for i in range(20_000)
    ]
    rows = [
        {"run_id": "a" * 32, "source": s.source, "time_s": s.time_s, "power_w": s.power_w}
        for s in samples
    ]
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0002_assistant_sessions")
        connection.execute(insert(Base.metadata.tables[Model.__tablename__]).values(id=1, name="m"))
        connection.execute(
            insert(Base.metadata.tables[Run.__tablename__]).values(
                id="a" * 32, model_id=1, engine="llamacpp", engine_settings={}, suite="s",
                options={}, state="complete", started_at=datetime.now(UTC), tool_version="0",
                energy_scope="system", sandbox_isolation="none", idle_power_w={},
            )
        )  # fmt: skip
        connection.execute(insert(old_samples), rows)
    engine.dispose()
    with open_store(database_url) as store:
        migrated = store.power_samples("a" * 32)
    assert migrated == samples

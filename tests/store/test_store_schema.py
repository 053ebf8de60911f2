"""The hand-written migrations must build exactly the schema the models describe.

An empty database is migrated by open_store, then compared with the models by Alembic.
"""

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from openjarvis.store import database, open_store
from openjarvis.store.models import Base

__all__: list[str] = []

TABLES = {"host", "model", "run", "task_result", "energy_reading", "power_sample"}


def migrated_engine(db_path: Path):
    open_store(str(db_path)).close()
    return create_engine(f"sqlite:///{db_path}")


def test_migrated_schema_matches_models(db_path: Path) -> None:
    engine = migrated_engine(db_path)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_migrated_database_is_at_head(db_path: Path) -> None:
    engine = migrated_engine(db_path)
    config = Config()
    config.set_main_option("script_location", str(database.MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(config).get_current_head()
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() == head
    engine.dispose()


def test_tables_and_nullability(db_path: Path) -> None:
    engine = migrated_engine(db_path)
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

    uniques = {
        table: [tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)]
        for table in TABLES
    }
    assert uniques["host"] == [("fingerprint",)]
    assert uniques["task_result"] == [("run_id", "task_id")]
    assert uniques["model"] == [("name", "sha256")]
    assert ["run_id"] in [index["column_names"] for index in inspector.get_indexes("power_sample")]
    engine.dispose()

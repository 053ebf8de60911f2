"""Alembic's entry point for the results database; `open_store` runs it on every open.

The caller passes its open connection in `config.attributes["connection"]`, so any URL works.
"""

from alembic import context

from openjarvis.store.models import Base

__all__: list[str] = []


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        # Without an ini file there is no URL to fall back on; opening a store is the one way in.
        raise RuntimeError("run migrations through openjarvis.store.open_store()")
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported")
run_migrations()

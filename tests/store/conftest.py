"""Fixtures for the store's tests: a private data directory, databases, and sample records.

`store` and `database_url` run each test twice: on a SQLite file under tmp_path and on a fresh
database of a real PostgreSQL server started for the session; nothing is faked.
"""

import dataclasses
import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine

from openjarvis.store import (
    EnergyRecord,
    HostRecord,
    RunRecord,
    Store,
    TaskResultRecord,
    database,
    open_store,
)
from tests.postgres import PostgresServer, find_postgres_binaries

__all__ = ["downgrade", "task_result"]


@pytest.fixture(autouse=True)
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point XDG_DATA_HOME at a temp dir so no test touches the real ~/.local/share."""
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    monkeypatch.delenv("OPENJARVIS_DB", raising=False)
    return home


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "ipw.db"


def _unavailable(reason: str) -> NoReturn:
    # Locally a missing server skips; in CI it must fail, or PostgreSQL would go untested.
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run the PostgreSQL tests", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    binaries = find_postgres_binaries()
    if binaries is None:
        _unavailable(
            "PostgreSQL server not installed (no /usr/lib/postgresql/*/bin/initdb); "
            "install it with `apt-get install postgresql`"
        )
    if importlib.util.find_spec("psycopg") is None:
        _unavailable("psycopg is not installed; install it with `pip install 'psycopg[binary]'`")
    try:
        server = PostgresServer(binaries)
    except KeyError:
        _unavailable("no 'postgres' user to run the server as (the postgresql package adds it)")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, db_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file, or a new database on the test PostgreSQL server."""
    if request.param == "sqlite":
        yield f"sqlite:///{db_path}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.create_database()
    yield url
    server.drop_database(url)


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    with open_store(database_url) as opened:
        yield opened


@pytest.fixture
def host() -> HostRecord:
    return HostRecord(
        fingerprint="0123456789abcdef",
        hostname="bench-1",
        cpu_model="AMD EPYC 9654",
        cpu_physical_cores=96,
        cpu_logical_cores=192,
        memory_bytes=1_500_000_000_000,  # beyond 32 bits on purpose
        gpus=("NVIDIA H200 (GPU-aaaa)", "NVIDIA H200 (GPU-bbbb)"),
        gpu_driver="560.35.03",
        os="Linux-6.8.0-x86_64-with-glibc2.39",
    )


@pytest.fixture
def make_run(host: HostRecord) -> Callable[..., RunRecord]:
    """A factory of RunRecords on `host`; keyword arguments replace fields."""

    def make(model_name: str = "gemma-3-270m", suite: str = "humaneval", **changes) -> RunRecord:
        run = RunRecord(
            model_name=model_name,
            model_path="/models/gemma-3-270m-q4_k_m.gguf",
            model_sha256="ab" * 32,
            engine="llamacpp",
            engine_settings={"n_ctx": 4096, "n_gpu_layers": -1},
            suite=suite,
            options={"limit": 10, "samples": 1, "temperature": 0.0, "seed": 0},
            energy_scope="accelerator",
            energy_method="counter",
            sandbox_isolation="bubblewrap",
            tool_version="0.1.0",
            idle_power_w={"nvml:GPU-aaaa": 71.5, "nvml:GPU-bbbb": None},
            host=host,
            model_quantisation="Q4_K_M",
            model_parameters=268_000_000,
        )
        return dataclasses.replace(run, **changes)

    return make


def task_result(task_id: str = "HumanEval/0", **changes) -> TaskResultRecord:
    """A task with one measured source and one that could not be read (None with a reason)."""
    task = TaskResultRecord(
        task_id=task_id,
        samples=2,
        passed=1,
        latency_s=1.25,
        ttft_s=0.05,
        decode_tokens_per_s=180.5,
        prompt_tokens=240,
        completion_tokens=310,
        energy_j=150.0,
        net_energy_j=60.6,
        energy_null_reason=None,
        completions=("def f():\n    return 1\n", "def f():\n    return 2\n"),
        statuses=("passed", "failed: AssertionError"),
        energy=(
            EnergyRecord(
                source="nvml:GPU-aaaa",
                domain="gpu",
                method="counter",
                energy_j=150.0,
                net_energy_j=60.6,
                idle_power_w=71.5,
                null_reason=None,
                low_resolution=False,
            ),
            EnergyRecord(
                source="rapl:package-0",
                domain="cpu",
                method="counter",
                energy_j=None,
                net_energy_j=None,
                idle_power_w=None,
                null_reason="permission",
                low_resolution=True,
            ),
        ),
    )
    return dataclasses.replace(task, **changes)


@pytest.fixture
def make_task() -> Callable[..., TaskResultRecord]:
    return task_result


def downgrade(path: Path, revision: str) -> None:
    """Take a SQLite database back to an older schema, as an older OpenJarvis left it."""
    config = Config()
    config.set_main_option("script_location", str(database.MIGRATIONS_DIR))
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
    engine.dispose()

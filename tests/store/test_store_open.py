"""Opening the results database: default location, overrides, SQLite settings, and errors.

Each error must be one UserError line that names the fix, and leave no half-made file behind.
"""

import importlib.util
import re
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.exc import DatabaseError, OperationalError

from openjarvis.errors import UserError
from openjarvis.store import (
    PowerSampleRecord,
    database,
    default_database_url,
    open_reader,
    open_store,
)
from tests.store.conftest import downgrade

__all__: list[str] = []


def test_default_database_is_under_xdg_data_home(data_home: Path) -> None:
    assert default_database_url() == f"sqlite:///{data_home}/openjarvis/ipw.db"


def test_default_without_xdg_data_home_is_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_database_url() == f"sqlite:///{tmp_path}/.local/share/openjarvis/ipw.db"


def test_relative_xdg_data_home_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_database_url() == f"sqlite:///{tmp_path}/.local/share/openjarvis/ipw.db"


def test_environment_variable_overrides_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENJARVIS_DB", str(tmp_path / "elsewhere.db"))
    assert default_database_url() == f"sqlite:///{tmp_path}/elsewhere.db"
    monkeypatch.setenv("OPENJARVIS_DB", "postgresql+psycopg://team@db.example/ipw")
    assert default_database_url() == "postgresql+psycopg://team@db.example/ipw"


def test_open_without_url_creates_the_default_file(data_home: Path) -> None:
    with open_store() as store:
        assert store.url == f"sqlite:///{data_home}/openjarvis/ipw.db"
    assert (data_home / "openjarvis" / "ipw.db").is_file()


def test_environment_variable_is_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENJARVIS_DB", str(tmp_path / "from-env.db"))
    open_store().close()
    assert (tmp_path / "from-env.db").is_file()


def test_explicit_url_overrides_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENJARVIS_DB", str(tmp_path / "from-env.db"))
    open_store(f"sqlite:///{tmp_path}/explicit.db").close()
    assert (tmp_path / "explicit.db").is_file()
    assert not (tmp_path / "from-env.db").exists()


def test_plain_relative_path_becomes_absolute_sqlite_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store("sub/dir/runs.db") as store:
        assert store.url == f"sqlite:///{tmp_path}/sub/dir/runs.db"
    assert (tmp_path / "sub" / "dir" / "runs.db").is_file()


def test_sqlite_runs_in_wal_mode_with_foreign_keys(db_path: Path) -> None:
    with open_store(str(db_path)) as store:
        # WAL is a property of the file, so a plain sqlite3 connection sees it too.
        with sqlite3.connect(db_path) as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        # Foreign keys are per connection: a sample for a run that does not exist is refused.
        with pytest.raises(ValueError, match="no run"):
            store.add_power_samples("f" * 32, [PowerSampleRecord("nvml:GPU-a", 0.0, 70.0)])
        with store._engine.connect() as connection:
            busy_timeout_ms = connection.exec_driver_sql("PRAGMA busy_timeout").scalar()
            assert busy_timeout_ms is not None and busy_timeout_ms > 0


def test_in_memory_database_works(make_run) -> None:
    with open_store("sqlite://") as store:
        run_id = store.create_run(make_run())
        assert store.get_run(run_id).state == "running"


def test_reopening_keeps_data_and_does_not_migrate_again(db_path: Path, make_run) -> None:
    with open_store(str(db_path)) as store:
        run_id = store.create_run(make_run())
    with open_store(str(db_path)) as store:
        assert store.get_run(run_id).id == run_id


def test_a_database_at_head_is_opened_without_alembic(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_store(str(db_path)).close()

    def migrate(*args: object) -> None:
        raise AssertionError("a database at head was migrated again")

    monkeypatch.setattr(database, "_migrate", migrate)
    open_store(str(db_path)).close()


def assert_one_line_with_fix(error: UserError) -> None:
    message = str(error)
    assert "\n" not in message
    assert "--db" in message or "pip install" in message


def test_path_below_a_regular_file_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    with pytest.raises(UserError, match=r"cannot create database at .*not a directory") as caught:
        open_store(str(blocker / "sub" / "ipw.db"))
    assert_one_line_with_fix(caught.value)
    assert "OPENJARVIS_DB" in str(caught.value)
    assert blocker.read_text() == "not a directory"


def test_path_that_cannot_be_created_is_a_user_error() -> None:
    # Root ignores file modes, but not /proc, which accepts no new files from anyone.
    expected = re.escape("cannot create database at /proc/ipw.db")
    with pytest.raises(UserError, match=expected) as caught:
        open_store("/proc/ipw.db")
    assert_one_line_with_fix(caught.value)


def test_directory_as_database_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="it is a directory"):
        open_store(str(tmp_path))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("://no-dialect", "cannot parse database URL"),
        ("nosuchdialect://host/db", "unknown database type 'nosuchdialect'"),
        ("postgresql+nosuchdriver://user@host/db", "unknown database type"),
        ("postgresql://user:secret@host:notaport/db", "cannot parse database URL"),
    ],
)
def test_bad_url_is_a_user_error(url: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        open_store(url)
    assert "\n" not in str(caught.value)
    assert "secret" not in str(caught.value)


def test_missing_driver_names_the_package_to_install() -> None:
    if importlib.util.find_spec("pymysql") is not None:
        pytest.skip("PyMySQL is installed here, so its absence cannot be shown")
    with pytest.raises(UserError, match=r"no module 'pymysql'.*pip install PyMySQL") as caught:
        open_store("mysql+pymysql://user:secret@db.example/ipw")
    assert_one_line_with_fix(caught.value)
    assert "secret" not in str(caught.value)


def test_file_that_is_not_a_database_is_a_user_error_and_kept(db_path: Path) -> None:
    garbage = b"this is a text file, not SQLite\n" * 200
    db_path.write_bytes(garbage)
    with pytest.raises(UserError, match="is not an OpenJarvis database") as caught:
        open_store(str(db_path))
    assert_one_line_with_fix(caught.value)
    assert db_path.read_bytes() == garbage  # someone's file: never deleted or changed


def test_database_from_a_newer_openjarvis_is_a_user_error(db_path: Path) -> None:
    open_store(str(db_path)).close()
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(UserError, match="does not know") as caught:
        open_store(str(db_path))
    assert_one_line_with_fix(caught.value)
    assert db_path.is_file()


@pytest.fixture
def broken_migrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migrations whose first revision creates one table and then fails, like a buggy release."""
    broken = tmp_path / "migrations"
    (broken / "versions").mkdir(parents=True)
    (broken / "env.py").write_text((database.MIGRATIONS_DIR / "env.py").read_text())
    (broken / "versions" / "0001_broken.py").write_text(
        "from alembic import op\n"
        "revision = '0001'\n"
        "down_revision = None\n"
        "def upgrade():\n"
        "    op.execute('CREATE TABLE half_done (x INTEGER)')\n"
        "    op.execute('CREATE TABLE broken (')\n"
    )
    monkeypatch.setattr(database, "MIGRATIONS_DIR", broken)


@pytest.mark.usefixtures("broken_migrations")
def test_failed_open_removes_what_it_created(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot open database"):
        open_store(str(tmp_path / "new" / "nested" / "ipw.db"))
    assert not (tmp_path / "new").exists()


@pytest.mark.usefixtures("broken_migrations")
def test_failed_migration_leaves_an_existing_file_as_it_was(db_path: Path) -> None:
    with sqlite3.connect(db_path) as raw:
        raw.execute("CREATE TABLE theirs (x INTEGER)")
    with pytest.raises(UserError, match="cannot open database"):
        open_store(str(db_path))
    with sqlite3.connect(db_path) as raw:
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
    assert tables == {"theirs"}  # the migration ran in one transaction and rolled back whole


def test_a_reader_never_creates_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "new" / "typo.db"
    with pytest.raises(UserError, match=f"no database at {missing}; `ipw measure` creates it"):
        open_reader(str(missing))
    assert not (tmp_path / "new").exists()


def test_the_default_database_is_not_created_by_a_reader(data_home: Path) -> None:
    with pytest.raises(UserError, match="no database at"):
        open_reader()
    assert not data_home.exists()


def test_a_reader_opens_read_only_without_migrating(
    db_path: Path, make_run, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(str(db_path)) as store:
        run_id = store.create_run(make_run())

    def migrate(*args: object) -> None:
        raise AssertionError("a reader migrated a database at head")

    monkeypatch.setattr(database, "_migrate", migrate)
    with open_reader(str(db_path)) as reader:
        assert reader.get_run(run_id).id == run_id
        with pytest.raises(OperationalError, match="readonly"):
            reader.finish_run(run_id, "failed", None)


def test_a_reader_upgrades_an_older_schema_it_may_write(db_path: Path, make_run) -> None:
    with open_store(str(db_path)) as store:
        run_id = store.create_run(make_run())
    downgrade(db_path, "0004_request_log")  # as an OpenJarvis of one revision back left it
    with open_reader(str(db_path)) as reader:
        assert reader.get_run(run_id).process_pid is None
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("SELECT version_num FROM alembic_version").fetchone()[0] == (
            database._head_revision()
        )


def test_a_reader_refuses_a_file_that_is_not_ours_and_leaves_it(db_path: Path) -> None:
    with sqlite3.connect(db_path) as raw:
        raw.execute("CREATE TABLE foo (x INTEGER)")
    before = db_path.read_bytes()
    with pytest.raises(UserError, match="not an OpenJarvis database") as caught:
        open_reader(str(db_path))
    assert_one_line_with_fix(caught.value)
    assert db_path.read_bytes() == before


def test_a_reader_reads_and_cannot_write_on_any_database(database_url: str, make_run) -> None:
    with open_store(database_url) as store:
        run_id = store.create_run(make_run())
    with open_reader(database_url) as reader:
        assert reader.get_run(run_id).id == run_id
        with pytest.raises(DatabaseError, match=r"read-only|readonly"):
            reader.finish_run(run_id, "failed", None)
    with open_store(database_url) as store:
        assert store.get_run(run_id).state == "running"

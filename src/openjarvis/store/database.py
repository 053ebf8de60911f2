"""Opening the results database: where it lives, checking the URL, SQLite settings, migrations.

Every failure a user can fix becomes a one-line UserError that names the fix.
"""

import os
import re
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from itertools import takewhile
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import ArgumentError, DatabaseError, NoSuchModuleError, OperationalError
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from openjarvis.errors import UserError
from openjarvis.store.store import Store

__all__ = [
    "DATABASE_ENV_VAR",
    "default_database_url",
    "open_merge_source",
    "open_reader",
    "open_store",
]

DATABASE_ENV_VAR = "OPENJARVIS_DB"
DATABASE_FILENAME = "ipw.db"
MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 10_000  # a second writer (a merge, the server) waits instead of failing
FIX = f"pass --db or set {DATABASE_ENV_VAR}"
DAMAGED_FIX = "restore it from a copy, or export it again where it was made"

# The pip package that provides each DBAPI module SQLAlchemy may ask for.
DRIVER_PACKAGES = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "psycopg[binary]",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "pymysql": "PyMySQL",
    "MySQLdb": "mysqlclient",
    "oracledb": "oracledb",
    "pyodbc": "pyodbc",
}


def default_database_url() -> str:
    """$OPENJARVIS_DB if set, else SQLite at $XDG_DATA_HOME/openjarvis/ipw.db."""
    override = os.environ.get(DATABASE_ENV_VAR)
    if override:
        return _as_url(override)
    data_home = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    if not os.path.isabs(data_home):
        data_home = str(Path.home() / ".local" / "share")
    return _as_url(str(Path(data_home) / "openjarvis" / DATABASE_FILENAME))


def open_store(url: str | None = None) -> Store:
    """Open (creating and migrating as needed) the database at `url`, a path, or the default."""
    location = _as_url(url) if url else default_database_url()
    parsed = _parse(location)
    shown = parsed.render_as_string(hide_password=True)
    database_file = _sqlite_file(parsed)
    created = _create_file(database_file) if database_file is not None else _Created()
    try:
        engine = _create_engine(parsed, shown)
        try:
            if not _at_head(engine):
                _migrate(engine, shown)
        except BaseException:
            engine.dispose()
            raise
    except BaseException:
        created.remove()
        raise
    return Store(engine)


def open_reader(url: str | None = None) -> Store:
    """Open an existing database for a reading command (`ipw runs`, `show`, ...); never create one.

    A SQLite file is opened read-only, so read-only files and folders can be read. A schema older
    than this OpenJarvis is migrated where the file may be written, and refused where it may not.
    """
    location = _as_url(url) if url else default_database_url()
    parsed = _parse(location)
    shown = _shown(parsed)
    engine = _reading_engine(parsed, shown, "`ipw measure` creates it")
    try:
        revision = _checked_revision(engine, shown, f"{FIX} to a database `ipw measure` wrote")
    except BaseException:
        engine.dispose()
        raise
    if revision == _head_revision():
        return Store(engine)
    engine.dispose()
    path = _sqlite_file(parsed)
    if path is not None and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
        raise UserError(
            f"database {path} has an older schema ({revision}) and is read-only; make it writable "
            f"once so OpenJarvis can upgrade it, or `ipw db merge {path}` into a writable database"
        )
    return open_store(location)


@contextmanager
def open_merge_source(url_or_path: str) -> Iterator[Store]:
    """A database to merge from, opened so that merging cannot change it (SQLite: read-only).

    It is checked first: a file that is not an OpenJarvis database, or is damaged, is refused
    with one line. An older schema is brought up to date in a temporary copy, never in place.
    """
    location = _as_url(url_or_path)
    parsed = _parse(location)
    shown = _shown(parsed)
    path = _sqlite_file(parsed)
    fix = "merge files that `ipw measure` or `ipw db export` wrote"
    with ExitStack() as cleanup:
        engine = _reading_engine(parsed, shown, "check the path")
        cleanup.callback(engine.dispose)
        revision = _checked_revision(engine, shown, fix)
        if path is not None:
            _check_integrity(engine, shown)
        if revision == _head_revision():
            yield Store(engine)
            return
        if path is None:
            raise UserError(
                f"{shown} has an older schema ({revision}); upgrade it first with "
                f"`ipw runs --db {shown}`, then merge it"
            )
        folder = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="ipw-merge-")))
        copy = folder / path.name
        reading = _read_only_connection(path)
        try:
            copied = sqlite3.connect(copy)
            reading.backup(copied)
            copied.close()
        finally:
            reading.close()
        with open_store(str(copy)) as migrated:
            yield migrated


def _as_url(url_or_path: str) -> str:
    if "://" in url_or_path:
        return url_or_path
    return f"sqlite:///{Path(url_or_path).expanduser().absolute()}"


def _parse(location: str) -> URL:
    try:
        return make_url(location)
    except (ArgumentError, ValueError) as error:
        raise UserError(
            f"cannot parse database URL '{_hide_password(location)}' ({error}); use a path or "
            "a SQLAlchemy URL such as sqlite:///path/ipw.db or postgresql+psycopg://user@host/db"
        ) from None


def _hide_password(location: str) -> str:
    """A URL SQLAlchemy cannot parse, fit for a message: 'user:secret@' becomes 'user:***@'."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", location)


def _sqlite_file(url: URL) -> Path | None:
    """The file behind a SQLite URL, or None for in-memory and non-SQLite databases."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    if url.query.get("uri") or url.database.startswith("file:"):
        return None  # SQLite URI filenames carry their own mode; SQLite alone interprets them
    return Path(url.database).absolute()


@dataclass
class _Created:
    """What opening created on disk, so that a failed open can take it away again."""

    file: Path | None = None
    directories: list[Path] = field(default_factory=list)

    def remove(self) -> None:
        if self.file is not None:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{self.file}{suffix}").unlink(missing_ok=True)
        for directory in reversed(self.directories):
            # A directory that something else put a file in meanwhile stays.
            with suppress(OSError):
                directory.rmdir()


def _create_file(path: Path) -> _Created:
    """Create the database file and its directories ourselves, for errors that name the cause."""
    created = _Created()
    if path.is_dir():
        raise UserError(f"cannot create database at {path}: it is a directory; {FIX}")
    if path.exists():
        if not os.access(path, os.R_OK | os.W_OK):
            raise UserError(f"cannot open database at {path}: permission denied; {FIX}")
        return created
    missing = list(takewhile(lambda parent: not parent.exists(), path.parents))
    ancestor = path.parents[len(missing)]
    if not ancestor.is_dir():
        raise UserError(f"cannot create database at {path}: {ancestor} is not a directory; {FIX}")
    try:
        for directory in reversed(missing):
            with suppress(FileExistsError):  # another process made it: theirs to keep
                directory.mkdir()
                created.directories.append(directory)
        # O_EXCL: a file another process created since the check above is theirs, not ours.
        with suppress(FileExistsError):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            created.file = path
    except OSError as error:
        created.remove()
        reason = (error.strerror or str(error)).lower()
        raise UserError(f"cannot create database at {path}: {reason}; {FIX}") from None
    return created


def _create_engine(url: URL, shown: str) -> Engine:
    options: dict[str, object] = {}
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        # One shared connection, or every connection would see its own empty in-memory database.
        options = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    try:
        engine = create_engine(url, **options)
    except NoSuchModuleError:
        raise UserError(
            f"unknown database type '{url.drivername}' in {shown}; use a path or a URL such as "
            "sqlite:///path/ipw.db or postgresql+psycopg://user@host/db"
        ) from None
    except ImportError as error:
        module = (error.name or "").split(".")[0]
        package = DRIVER_PACKAGES.get(module, module or "the database driver")
        if "[" in package:
            package = f"'{package}'"  # unquoted brackets are a glob to zsh
        raise UserError(
            f"the driver for {url.drivername} databases is not installed (no module "
            f"'{module}'); install it with `pip install {package}` or {FIX} to a SQLite path"
        ) from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _configure_sqlite_connection)
    return engine


def _configure_sqlite_connection(
    dbapi_connection: DBAPIConnection, connection_record: ConnectionPoolEntry
) -> None:
    # SQLite-only SQL stays here and in _lock_for_migration. These settings are per connection.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        # WAL lets readers (reports, the server) run while a measurement writes.
        cursor.execute("PRAGMA journal_mode = WAL")
        # In WAL mode NORMAL still survives a crash of the process (the case that matters during
        # a run); only a power cut may lose the last commits. FULL made every saved task an fsync.
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def _reading_engine(url: URL, shown: str, missing_fix: str) -> Engine:
    """An engine that reads and cannot write: SQLite files through a read-only (mode=ro) URI,
    server databases in read-only transactions. A missing SQLite file is a UserError."""
    path = _sqlite_file(url)
    if path is None:
        engine = _create_engine(url, shown)
        if engine.dialect.name == "postgresql":
            event.listen(engine, "connect", _configure_read_only_postgresql)
        return engine
    if path.is_dir():
        raise UserError(f"{path} is a directory, not a database; {FIX}")
    if not path.exists():
        raise UserError(f"no database at {path}; {missing_fix}")
    engine = create_engine(url, creator=lambda: _read_only_connection(path))
    event.listen(engine, "connect", _configure_read_only_sqlite)
    return engine


def _read_only_connection(path: Path) -> sqlite3.Connection:
    uri = f"file:{quote(str(path))}?mode=ro"
    connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchall()
    except sqlite3.OperationalError:
        connection.close()
        if Path(f"{path}-wal").exists():
            raise
        # A WAL file in a folder nobody may write (a read-only mount): SQLite cannot make its
        # -shm file there. Without a -wal file no writer has it open, so it reads as it stands.
        return sqlite3.connect(f"{uri}&immutable=1", uri=True, check_same_thread=False)
    return connection


def _configure_read_only_sqlite(
    dbapi_connection: DBAPIConnection, connection_record: ConnectionPoolEntry
) -> None:
    # No journal_mode here: changing it writes to the file. A WAL file opens as WAL anyway.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA query_only = ON")
    finally:
        cursor.close()


def _configure_read_only_postgresql(
    dbapi_connection: DBAPIConnection, connection_record: ConnectionPoolEntry
) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    finally:
        cursor.close()
    dbapi_connection.commit()


def _shown(url: URL) -> str:
    """A database as messages name it: a SQLite file by its path, others by URL (no password)."""
    path = _sqlite_file(url)
    return str(path) if path is not None else url.render_as_string(hide_password=True)


def _checked_revision(engine: Engine, shown: str, fix: str) -> str:
    """The database's schema revision, one this OpenJarvis knows; anything else is a UserError
    (not a database, not ours, damaged, or from a newer OpenJarvis)."""
    try:
        with engine.connect() as connection:
            if not inspect(connection).has_table("alembic_version"):
                raise UserError(
                    f"{shown} is not an OpenJarvis database (no OpenJarvis tables); {fix}"
                )
            rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    except DatabaseError as error:
        raise _unreadable(error, shown, fix) from None
    revisions = [row[0] for row in rows]
    if len(revisions) != 1 or revisions[0] not in _known_revisions():
        raise UserError(
            f"database {shown} has a schema this OpenJarvis does not know "
            f"({', '.join(revisions) or 'no revision'}); upgrade openjarvis or {FIX}"
        )
    return revisions[0]


def _check_integrity(engine: Engine, shown: str) -> None:
    """Read a SQLite file whole (PRAGMA quick_check), so a damaged one is refused up front."""
    try:
        with engine.connect() as connection:
            problems = [row[0] for row in connection.exec_driver_sql("PRAGMA quick_check")]
    except DatabaseError as error:
        raise _unreadable(error, shown, DAMAGED_FIX) from None
    if problems != ["ok"]:
        # quick_check frames its findings with "*** in database main ***" lines; keep the first.
        first = next((line for line in "\n".join(problems).splitlines() if "***" not in line), "")
        raise UserError(f"{shown} is damaged ({first}); {DAMAGED_FIX}")


def _unreadable(error: DatabaseError, shown: str, fix: str) -> UserError:
    code = getattr(error.orig, "sqlite_errorname", "")
    if code == "SQLITE_NOTADB":
        return UserError(f"{shown} is not an OpenJarvis database (not SQLite); {fix}")
    if code == "SQLITE_CORRUPT":
        return UserError(f"{shown} is damaged ({_first_line(error)}); {DAMAGED_FIX}")
    return UserError(f"cannot read database {shown}: {_first_line(error)}; {fix}")


def _lock_for_migration(connection: Connection) -> None:
    # Two processes opening a new SQLite file at once would both create the tables; taking the
    # write lock first makes the second wait (busy_timeout), then find the schema at head.
    # It also makes the migration one transaction, so a failure leaves no half-built schema.
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")


REVISION_LINE = re.compile(r"""^(down_)?revision\b[^=\n]*=\s*["']([^"']+)["']""", re.MULTILINE)


def _head_revision() -> str | None:
    """The newest migration's id, read from the scripts' text; None when that is not clear.

    Reading text, not importing Alembic, keeps every `ipw` command ~0.5 s faster when the
    database needs no migration, which is nearly always.
    """
    revisions, parents = _revision_lines()
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def _known_revisions() -> set[str]:
    return _revision_lines()[0]


def _revision_lines() -> tuple[set[str], set[str]]:
    """Every migration's id, and every id some migration names as its parent."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in (MIGRATIONS_DIR / "versions").glob("*.py"):
        for is_parent, revision in REVISION_LINE.findall(script.read_text()):
            (parents if is_parent else revisions).add(revision)
    return revisions, parents


def _at_head(engine: Engine) -> bool:
    """Whether the database is already at the newest revision, so Alembic need not run."""
    head = _head_revision()
    if head is None:
        return False
    try:
        with engine.connect() as connection:
            current = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    except DatabaseError:
        return False  # a new database, or one that cannot be read: _migrate says which
    return [row[0] for row in current] == [head]


def _migrate(engine: Engine, shown: str) -> None:
    """Bring the schema to the newest revision; a no-op when it is already there."""
    # Imported here: only a database that needs migrating pays for loading Alembic.
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    config = Config()
    # Config values go through ConfigParser interpolation, so a '%' in the path must be doubled.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    try:
        with (
            engine.connect() as connection,
            _foreign_keys_off(connection),
            connection.begin(),
        ):
            _lock_for_migration(connection)
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            _check_foreign_keys(connection, shown)
    except CommandError as error:
        raise UserError(
            f"database {shown} has a schema this OpenJarvis does not know ({error}); "
            f"upgrade openjarvis or {FIX}"
        ) from None
    except OperationalError as error:
        raise UserError(f"cannot open database {shown}: {_first_line(error)}; {FIX}") from None
    except DatabaseError as error:
        raise UserError(
            f"{shown} is not an OpenJarvis database ({_first_line(error)}); {FIX} to another file"
        ) from None


@contextmanager
def _foreign_keys_off(connection: Connection) -> Iterator[None]:
    """SQLite: foreign keys off while migrating. Its batch mode rebuilds a table by copying it
    and dropping the old one, which a foreign key pointing at it (run -> host) refuses; the
    setting can change only outside a transaction, so it is set around the migration's."""
    if connection.dialect.name != "sqlite":
        yield
        return
    connection.exec_driver_sql("PRAGMA foreign_keys = OFF")
    connection.commit()
    try:
        yield
    finally:
        connection.exec_driver_sql("PRAGMA foreign_keys = ON")
        connection.commit()


def _check_foreign_keys(connection: Connection, shown: str) -> None:
    """SQLite: every reference still holds after the migration (checked before it commits, as
    foreign keys were off while it ran)."""
    if connection.dialect.name != "sqlite":
        return
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        tables = ", ".join(sorted({str(row[0]) for row in broken}))
        raise UserError(f"{shown} has rows whose references are broken ({tables}); {DAMAGED_FIX}")


def _first_line(error: DatabaseError) -> str:
    text = str(error.orig).strip()
    return text.splitlines()[0] if text else type(error.orig).__name__

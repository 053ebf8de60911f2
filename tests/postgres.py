"""A throwaway PostgreSQL server for tests, from the distribution's binaries, in a temp folder.

Runs as the `postgres` user when the tests run as root (PostgreSQL refuses to run as root).
"""

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

__all__ = ["PostgresServer", "find_postgres_binaries"]

BINARY_GLOB = "/usr/lib/postgresql/*/bin"
START_TIMEOUT_S = 60


def find_postgres_binaries() -> Path | None:
    """The newest installed server's bin folder (Debian keeps one per major version)."""
    folders = [Path(p).parent for p in Path("/").glob(BINARY_GLOB.lstrip("/") + "/initdb")]
    if not folders:
        return None
    return max(folders, key=lambda folder: int(folder.parent.name.split(".")[0]))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PostgresServer:
    """One cluster in a temp folder, trust auth on 127.0.0.1; `database()` makes a fresh DB."""

    def __init__(self, binaries: Path) -> None:
        self._binaries = binaries
        self.root = Path(tempfile.mkdtemp(prefix="openjarvis-pg-"))
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")  # KeyError: no postgres user to run it as
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self.port = _free_port()
        self._data = self.root / "data"
        self._started = False

    def _run(self, tool: str, *args: str) -> None:
        command = [*self._as_user, str(self._binaries / tool), *args]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False
        )
        if result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{tool} failed: {result.stderr.strip()} {tail}")

    def start(self) -> None:
        # --no-sync and fsync=off: a test cluster trades durability for speed.
        self._run("initdb", "-D", str(self._data), "-U", "postgres", "-A", "trust", "--no-sync")
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self._data), "-l", str(self.root / "server.log"), "-w",
            "-o", options, "start",
        )  # fmt: skip
        self._started = True

    def stop(self) -> None:
        if self._started:
            self._run("pg_ctl", "-D", str(self._data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as connection:
            connection.execute(sql)

    def create_database(self) -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        name = f"test_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

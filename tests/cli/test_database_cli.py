"""The `ipw` commands around the database, run as a user runs them (`python -m openjarvis` in a
subprocess, with its own XDG_DATA_HOME): reading commands never create a database and read
read-only ones, merges never touch their sources and are all or nothing, runs whose process is
gone show as interrupted with their saved tasks.
"""

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from openjarvis.store import log_request, open_store
from tests.store.conftest import downgrade
from tests.synthetic import add_run, logged_request, make_host

__all__: list[str] = []

LAPTOP = make_host("laptop")


def ipw(*args: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> tuple[int, str, str]:
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "openjarvis", *args],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "240"},
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


def assert_one_error_line(code: int, err: str, expected: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert expected in err, err


def files_under(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    environment = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    environment.pop("OPENJARVIS_DB", None)
    return environment


READING_COMMANDS = {
    "runs": ["runs"],
    "show": ["show", "3f2a"],
    "compare": ["compare", "3f2a", "9c1e"],
    "report": ["report", "--out", "{tmp}/report"],
    "requests": ["requests"],
    "db export": ["db", "export", "{tmp}/export.db"],
}


@pytest.mark.parametrize("command", READING_COMMANDS.values(), ids=READING_COMMANDS.keys())
def test_a_reading_command_on_a_missing_database_creates_nothing(
    command: list[str], tmp_path: Path, env: dict[str, str]
) -> None:
    args = [part.format(tmp=tmp_path) for part in command]
    missing = tmp_path / "typo" / "ipw.db"
    before = files_under(tmp_path)
    code, _, err = ipw(*args, "--db", str(missing), env=env)
    assert_one_error_line(code, err, f"no database at {missing}; `ipw measure` creates it")
    # Without --db: the default database under XDG_DATA_HOME is not created either.
    code, _, err = ipw(*args, env=env)
    default = tmp_path / "data" / "openjarvis" / "ipw.db"
    assert_one_error_line(code, err, f"no database at {default}")
    assert files_under(tmp_path) == before


@pytest.fixture(scope="module")
def read_only_mount() -> tuple[str, ...]:
    """A command prefix that runs the command with tmp folders bind-mounted read-only, in a
    private mount namespace (no root needed: a user namespace maps us to root in it)."""
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here (unshare -rm: {probe.stderr!r})")
    return (
        "unshare",
        "-rm",
        "sh",
        "-c",
        'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"',
    )


def test_a_database_in_a_read_only_folder_is_read(
    tmp_path: Path, env: dict[str, str], read_only_mount: tuple[str, ...]
) -> None:
    folder = tmp_path / "mounted"
    folder.mkdir()
    db = folder / "ipw.db"
    with open_store(str(db)) as store:
        run_id = add_run(store, LAPTOP, tasks=3)
    before = files_under(folder)
    mount = (*read_only_mount, str(folder))
    code, out, err = ipw("runs", "--db", str(db), "--json", env=env, prefix=mount)
    assert code == 0, err
    assert [row["run_id"] for row in json.loads(out)] == [run_id]
    code, out, err = ipw("show", run_id[:8], "--db", str(db), env=env, prefix=mount)
    assert code == 0, err
    assert "figures over 3 tasks" in out
    assert files_under(folder) == before


def test_an_older_read_only_database_is_refused_with_the_fix(
    tmp_path: Path, env: dict[str, str], read_only_mount: tuple[str, ...]
) -> None:
    folder = tmp_path / "mounted"
    folder.mkdir()
    db = folder / "ipw.db"
    with open_store(str(db)) as store:
        add_run(store, LAPTOP, tasks=1)
    downgrade(db, "0004_request_log")
    code, _, err = ipw("runs", "--db", str(db), env=env, prefix=(*read_only_mount, str(folder)))
    assert_one_error_line(code, err, "has an older schema (0004_request_log) and is read-only")
    assert f"`ipw db merge {db}`" in err


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "laptop.db"
    with open_store(str(path)) as store:
        add_run(store, LAPTOP, tasks=3, seed=1, trace_samples=100)
        add_run(store, LAPTOP, tasks=2, seed=2)
    return path


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    path = tmp_path / "foreign.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE foo (x INTEGER)")
    return path


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    path = tmp_path / "damaged.db"
    with open_store(str(path)) as store:
        add_run(store, LAPTOP, tasks=40, seed=3, trace_samples=2000)
    middle = path.stat().st_size // 2 // 4096 * 4096
    with path.open("r+b") as file:
        file.seek(middle)
        file.write(bytes(range(256)) * 16)
    return path


def test_merge_leaves_its_source_byte_identical(
    good: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    before = sha256_of(good)
    team = tmp_path / "team.db"
    code, out, err = ipw("db", "merge", str(good), "--db", str(team), env=env)
    assert code == 0, err
    assert "2 run(s) added" in out
    assert sha256_of(good) == before


def test_merge_refuses_a_foreign_file_and_leaves_it_alone(
    foreign: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    before = sha256_of(foreign)
    team = tmp_path / "team.db"
    code, _, err = ipw("db", "merge", str(foreign), "--db", str(team), env=env)
    assert_one_error_line(code, err, f"{foreign} is not an OpenJarvis database")
    assert sha256_of(foreign) == before
    with sqlite3.connect(foreign) as raw:
        assert [row[0] for row in raw.execute("SELECT name FROM sqlite_master")] == ["foo"]
    assert not team.exists()


def test_merge_refuses_a_damaged_file(damaged: Path, tmp_path: Path, env: dict[str, str]) -> None:
    before = sha256_of(damaged)
    code, _, err = ipw("db", "merge", str(damaged), "--db", str(tmp_path / "team.db"), env=env)
    assert_one_error_line(code, err, f"{damaged} is damaged")
    assert sha256_of(damaged) == before


def test_merging_a_good_and_a_damaged_file_merges_neither(
    good: Path, damaged: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    team = tmp_path / "team.db"
    with open_store(str(team)) as store:
        add_run(store, LAPTOP, tasks=1, seed=4)
    before = sha256_of(team)
    code, _, err = ipw("db", "merge", str(good), str(damaged), "--db", str(team), env=env)
    assert_one_error_line(code, err, "is damaged")
    assert sha256_of(team) == before


def test_runs_and_show_name_a_run_whose_process_ended_with_its_saved_tasks(
    tmp_path: Path, env: dict[str, str]
) -> None:
    db = tmp_path / "ipw.db"
    # Another process measures a run, saves two tasks, and ends without finishing it.
    script = (
        "import os, sys; from openjarvis.store import open_store; "
        "from tests.synthetic import add_run, logged_request, make_host; "
        "store = open_store(sys.argv[1]); "
        "print(add_run(store, make_host('laptop'), tasks=2, state='running'), os.getpid())"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, str(db)], capture_output=True, text=True, check=True
    )
    run_id, pid = child.stdout.split()
    code, out, err = ipw("runs", "--db", str(db), env=env)
    assert code == 0, err
    header = next(line for line in out.splitlines() if "tasks" in line)
    line = next(line for line in out.splitlines() if run_id[:8] in line)
    row = dict(
        zip(
            [cell.strip() for cell in header.split("┃")],
            [cell.strip() for cell in line.split("│")],
            strict=True,
        )
    )
    assert row["state"] == "interrupted (process ended)"
    assert row["tasks"] == "2"  # tasks saved, though the run has no summary
    code, out, err = ipw("runs", "--db", str(db), "--json", env=env)
    (row,) = json.loads(out)
    assert (row["state"], row["shown_state"], row["saved_tasks"]) == (
        "running",
        "interrupted (process ended)",
        2,
    )
    code, out, err = ipw("show", run_id, "--db", str(db), env=env)
    assert code == 0, err
    assert "interrupted (process ended)" in out
    assert f"pid {pid} on " in out


def test_merge_reads_an_older_database_in_a_read_only_folder(
    tmp_path: Path, env: dict[str, str], read_only_mount: tuple[str, ...]
) -> None:
    folder = tmp_path / "mounted"
    folder.mkdir()
    source = folder / "old.db"
    with open_store(str(source)) as store:
        run_id = add_run(store, LAPTOP, tasks=2)
    downgrade(source, "0004_request_log")
    before = files_under(folder)
    team = tmp_path / "team.db"
    mount = (*read_only_mount, str(folder))
    code, out, err = ipw("db", "merge", str(source), "--db", str(team), env=env, prefix=mount)
    assert code == 0, err
    assert "1 run(s) added" in out
    assert files_under(folder) == before
    with open_store(str(team)) as merged:
        assert len(merged.task_results(run_id)) == 2


def test_export_keeps_the_request_log(tmp_path: Path, env: dict[str, str]) -> None:
    """`ipw db export` once dropped jarvis serve's request log (32 rows became 0)."""
    source, exported = tmp_path / "serve.db", tmp_path / "export.db"
    start = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    with open_store(str(source)) as store:
        add_run(store, LAPTOP, tasks=2)
        for n in range(32):
            log_request(store, logged_request("gemma", n + 1, start + timedelta(seconds=n)))
    code, out, err = ipw("db", "export", str(exported), "--db", str(source), env=env)
    assert code == 0, err
    assert f"exported to {exported}: 1 run(s), 32 logged request(s)" in " ".join(out.split())
    code, out, err = ipw("requests", "--db", str(exported), "--json", env=env)
    assert code == 0, err
    assert json.loads(out)["totals"]["requests"] == 32

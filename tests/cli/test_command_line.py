"""What every `ipw` and `jarvis` command line owes a user: `--version`, flags shown as flags in
help, and a bad count or a repeated run refused in one line with exit 2.

Run as a user runs them: the real commands in a subprocess, with their own XDG_DATA_HOME.
"""

import ast
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from openjarvis import __version__
from openjarvis.store import open_store
from tests.synthetic import add_run, make_host

__all__: list[str] = []

LAUNCH = {
    "ipw": "from openjarvis.cli.ipw import main; main()",
    "jarvis": "from openjarvis.cli.jarvis import main; main()",
}


def run(
    command: str, *args: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "COLUMNS": "100",
        **(env or {}),
    }
    environment.pop("OPENJARVIS_DB", None)
    return subprocess.run(
        [sys.executable, "-c", LAUNCH[command], *args],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_error(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr


@pytest.mark.parametrize("command", ["ipw", "jarvis"])
def test_version(command: str, tmp_path: Path) -> None:
    done = run(command, "--version", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"openjarvis {__version__}\n"


HELP = [
    ("ipw",),
    *[
        ("ipw", name)
        for name in (
            "measure",
            "runs",
            "show",
            "compare",
            "report",
            "suites",
            "score",
            "power",
            "requests",
            "db",
        )
    ],
    ("ipw", "db", "export"),
    ("ipw", "db", "merge"),
    ("jarvis",),
    ("jarvis", "serve"),
    ("jarvis", "models"),
]
FLAGS = {
    ("ipw", "measure"): ["--all", "--allow-shared", "--json"],
    ("ipw", "compare"): ["--allow-mixed-scope", "--json"],
    ("ipw", "power"): ["--watch", "--json"],
    ("jarvis", "serve"): ["--no-log"],
    ("jarvis",): ["--resume", "--version"],
    ("ipw",): ["--version"],
}


@pytest.mark.parametrize("words", HELP, ids=[" ".join(words) for words in HELP])
def test_help_shows_flags_as_flags(words: tuple[str, ...], tmp_path: Path) -> None:
    done = run(words[0], *words[1:], "--help", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "<bool>" not in done.stdout and "--no-" not in done.stdout.replace("--no-log", "")
    lines = done.stdout.splitlines()
    for flag in [*FLAGS.get(words, []), "--help"]:
        # The flag, then at least two spaces and its help: no value after it.
        line = next(line for line in lines if line.strip().startswith(flag + " "))
        assert line.strip()[len(flag) :].startswith("  "), line


@pytest.mark.parametrize("limit", ["0", "-3"])
@pytest.mark.parametrize("command", ["runs", "report"])
def test_limit_must_be_at_least_one(command: str, limit: str, tmp_path: Path) -> None:
    done = run("ipw", command, "--limit", limit, tmp_path=tmp_path)
    one_line_error(done, f"--limit must be at least 1 (got {limit})")


def test_compare_refuses_the_same_run_twice(tmp_path: Path) -> None:
    db = str(tmp_path / "ipw.db")
    with open_store(db) as store:
        run_id = add_run(store, make_host("laptop"), tasks=3)
        other = add_run(store, make_host("laptop"), tasks=3, seed=1)
    # Twice by different prefixes of one id is still the same run.
    done = run("ipw", "compare", run_id[:6], other, run_id, "--db", db, tmp_path=tmp_path)
    one_line_error(done, f"run {run_id[:8]} is given twice")
    done = run("ipw", "compare", run_id, other, "--db", db, "--json", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr


def test_runs_since_without_an_offset_is_local_time(tmp_path: Path) -> None:
    """As `ipw requests` reads it: 12 hours behind UTC, an hour from now on the local clock
    is after a run started now (a UTC reading would put it 11 hours before)."""
    db = str(tmp_path / "ipw.db")
    with open_store(db) as store:
        run_id = add_run(store, make_host("laptop"), tasks=2)
    local_now = datetime.now(UTC).astimezone(timezone(timedelta(hours=-12))).replace(tzinfo=None)

    def listed(since: datetime) -> list[str]:
        done = run(
            "ipw",
            *("runs", "--db", db, "--json", "--since", since.isoformat(timespec="minutes")),
            tmp_path=tmp_path,
            env={"TZ": "Etc/GMT+12"},  # POSIX sign: UTC-12
        )
        assert done.returncode == 0, done.stderr
        return [row["run_id"] for row in json.loads(done.stdout)]

    assert listed(local_now + timedelta(hours=1)) == []
    assert listed(local_now - timedelta(hours=1)) == [run_id]


def test_one_function_in_cli_formats_an_estimate() -> None:
    """`ipw measure`, `show`, `compare` and `score` write `value [low, high]` through
    figure_text.interval_text (over report.runs.format_interval); a second formatter drifts.
    Another function may take an estimate only to hand it to interval_text."""
    cli = Path(__file__).parents[2] / "src" / "openjarvis" / "cli"
    taking_an_estimate = {
        f"{path.name}:{node.name}": node
        for path in sorted(cli.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and any(
            "Estimate" in ast.unparse(arg.annotation or ast.Constant(None))
            for arg in node.args.args
        )
    }
    assert "figure_text.py:interval_text" in taking_an_estimate
    formatting_their_own = [
        name
        for name, node in taking_an_estimate.items()
        if name != "figure_text.py:interval_text"
        and not any(
            isinstance(call, ast.Call) and ast.unparse(call.func) == "interval_text"
            for call in ast.walk(node)
        )
    ]
    assert formatting_their_own == []


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[str, str, str]:
    db = str(tmp_path / "ipw.db")
    with open_store(db) as store:
        gpu = make_host("h200-box", gpus=("NVIDIA H200 (GPU-aaaa)",))
        measured = add_run(store, gpu, "gemma-3-270m-it-q4", tasks=4)
        estimated = add_run(store, make_host("laptop"), "qwen", tasks=4, method="estimate", seed=1)
    return db, measured, estimated


def test_tables_piped_keep_every_column_whole(
    two_runs: tuple[str, str, str], tmp_path: Path
) -> None:
    """Not a terminal and no COLUMNS: the table is as wide as its content, not 80 columns."""
    db, measured, estimated = two_runs
    piped = {"COLUMNS": ""}
    done = run("ipw", "runs", "--db", db, tmp_path=tmp_path, env=piped)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    header = next(line for line in done.stdout.splitlines() if "┃ run " in line)
    for heading in ("started", "accuracy per J", "J per task", "energy"):
        assert f" {heading} " in header
    row = next(line for line in done.stdout.splitlines() if measured[:8] in line)
    for cell in ("gemma-3-270m-it-q4 Q4_K_M", "h200-box · 1 x NVIDIA H200", "counter · system"):
        assert cell in row
    for command in (("show", measured), ("compare", measured, estimated, "--allow-mixed-scope")):
        done = run("ipw", *command, "--db", db, tmp_path=tmp_path, env=piped)
        assert done.returncode == 0, done.stderr
        assert "…" not in done.stdout and max(map(len, done.stdout.splitlines())) > 80


def test_tables_on_80_columns_fold_but_lose_nothing(
    two_runs: tuple[str, str, str], tmp_path: Path
) -> None:
    db, measured, estimated = two_runs
    narrow = {"COLUMNS": "80"}
    done = run("ipw", "runs", "--db", db, tmp_path=tmp_path, env=narrow)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "…" not in done.stdout and max(map(len, lines)) <= 80
    assert any(measured[:8] in line for line in lines) and any(
        estimated[:8] in line for line in lines
    )
    done = run("ipw", "show", measured, "--db", db, tmp_path=tmp_path, env=narrow)
    assert "…" not in done.stdout and max(map(len, done.stdout.splitlines())) <= 80
    # Every column of the tasks table keeps a width: the energy columns are not squeezed out.
    task_row = next(line for line in done.stdout.splitlines() if "HumanEval/0 " in line)
    cells = [cell.strip() for cell in task_row.split("│")[1:-1]]
    assert len(cells) == 10 and all(cells[:9]), task_row


def test_report_json_says_what_it_wrote(two_runs: tuple[str, str, str], tmp_path: Path) -> None:
    db = two_runs[0]
    out = tmp_path / "report"
    done = run("ipw", "report", "--db", db, "--out", str(out), "--json", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)  # JSON only: nothing else on stdout
    assert written["runs"] == 2 and written["runs_with_figures"] == 2
    assert written["html"] == str(out / "report.html")
    for kind in ("html", "markdown", "csv", "json"):
        assert Path(written[kind]).is_file()
    assert written["database"].endswith("ipw.db")

"""`ipw requests` reads back what `jarvis serve` logged: joules per request and in total."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from openjarvis.store import RequestLogRecord, log_request, open_store


def _record(
    energy_j: float | None, tokens: int, started_at: datetime | None = None
) -> RequestLogRecord:
    return RequestLogRecord(
        started_at=started_at,
        endpoint="/v1/chat/completions",
        model_name="gemma",
        engine="llamacpp",
        stream=True,
        prompt_tokens=10,
        completion_tokens=tokens,
        finish_reason="stop",
        wall_s=1.0,
        ttft_s=0.1,
        decode_tokens_per_s=50.0,
        energy_j=energy_j,
        net_energy_j=None,
        energy_method="estimate" if energy_j is not None else None,
        energy_scope="system",
        energy_null_reason=None if energy_j is not None else "permission",
        energy_sources=[{"source": "estimate:cpu", "energy_j": energy_j}],
    )


def _ipw(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "140", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "openjarvis", "requests", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_totals_and_rows(tmp_path: Path) -> None:
    db = tmp_path / "ipw.db"
    with open_store(str(db)) as store:
        log_request(store, _record(2.0, 20))
        log_request(store, _record(3.0, 30))
    done = _ipw("--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["totals"]["energy_j"] == 5.0 and report["totals"]["completion_tokens"] == 50
    assert [r["energy_j"] for r in report["requests"]] == [2.0, 3.0]
    table = _ipw("--db", str(db))
    assert "total: 2 requests, 50 tokens out, 5 J (estimate)" in table.stdout


def test_unknown_energy_makes_the_total_unknown(tmp_path: Path) -> None:
    db = tmp_path / "ipw.db"
    with open_store(str(db)) as store:
        log_request(store, _record(2.0, 20))
        log_request(store, _record(None, 5))
    report = json.loads(_ipw("--db", str(db), "--json").stdout)
    assert report["totals"]["energy_j"] is None  # never a partial sum shown as the whole
    assert report["totals"]["requests_without_energy"] == 1


def test_bad_since_is_one_line() -> None:
    done = _ipw("--since", "yesterday")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --since takes a date or local time such as 2026-01-31 or 2026-01-31T14:00, "
        "not 'yesterday'"
    ]


def test_since_without_an_offset_is_local_time(tmp_path: Path) -> None:
    """As `ipw runs` reads it: in a zone 12 hours behind UTC, a request at 12:00 UTC was at
    00:00 local, so --since 06:00 (local) leaves it out, which a UTC reading would not."""
    db = tmp_path / "ipw.db"
    with open_store(str(db)) as store:
        log_request(store, _record(2.0, 20, started_at=datetime(2026, 11, 30, 12, tzinfo=UTC)))
    west = {"TZ": "Etc/GMT+12"}  # POSIX sign: UTC-12

    def listed(since: str) -> int:
        done = _ipw("--db", str(db), "--json", "--since", since, env=west)
        assert done.returncode == 0, done.stderr
        return int(json.loads(done.stdout)["totals"]["requests"])

    assert listed("2026-11-30T06:00") == 0
    assert listed("2026-11-29T23:00") == 1
    assert listed("2026-11-30T06:00+00:00") == 1  # an offset is taken as given
    table = _ipw("--db", str(db), env=west).stdout
    assert "2026-11-30 00:00:00" in table  # shown in local time too


def test_piped_rows_are_whole_and_say_which_requests_shared_a_batch(tmp_path: Path) -> None:
    db = tmp_path / "ipw.db"
    with open_store(str(db)) as store:
        log_request(store, _record(2.0, 20))
        log_request(store, replace(_record(3.0, 30), shared=True, mean_batch=3.2))
    environment = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run(
        [sys.executable, "-m", "openjarvis", "requests", "--db", str(db)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout  # not cut at 80 columns when piped
    assert "shared · batch" in done.stdout
    rows = [line for line in done.stdout.splitlines() if "chat/completions" in line]
    assert rows[0].rstrip(" │").endswith("no · —") and rows[1].rstrip(" │").endswith("yes · 3.2")

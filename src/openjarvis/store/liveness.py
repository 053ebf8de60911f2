"""Whether a run in state `running` is still being measured, from the process it records.

A run records its process (host, pid) when it is created or resumed, and a heartbeat with every
saved task. On the run's own host the process decides: the run is live while that pid is alive
and started before the run's latest heartbeat (a pid reused by a later process does not count).
From another host only the heartbeat can tell: the run is live while its heartbeat is younger
than REMOTE_HEARTBEAT_TIMEOUT_S.
"""

import os
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

from openjarvis.errors import UserError
from openjarvis.records import RunRecord

__all__ = [
    "REMOTE_HEARTBEAT_TIMEOUT_S",
    "ended_reason",
    "refuse_if_live",
    "shown_state",
    "this_process",
]

# Heartbeats come with saved tasks, so a task may take this long before other hosts give up on
# the run. Longer tasks (a large model on a CPU, many samples) look ended to other hosts only.
REMOTE_HEARTBEAT_TIMEOUT_S = 30 * 60
# /proc gives a process's start in clock ticks since boot, and boot time in whole seconds.
START_TIME_TOLERANCE_S = 5.0


def this_process() -> tuple[str, int]:
    """(host, pid) of the calling process, as runs record it."""
    return socket.gethostname(), os.getpid()


def ended_reason(run: RunRecord, now: datetime | None = None) -> str | None:
    """Why a `running` run is no longer being measured ("process ended", ...), or None while it
    may be; None too for runs in any other state."""
    if run.state != "running":
        return None
    if run.process_pid is None or run.process_host is None or run.heartbeat_at is None:
        return "process unknown"  # recorded by an OpenJarvis older than the heartbeat
    if run.process_host == socket.gethostname():
        alive = _process_alive(run.process_pid, run.heartbeat_at)
        return None if alive else "process ended"
    silent_s = ((now or datetime.now(UTC)) - run.heartbeat_at).total_seconds()
    if silent_s < REMOTE_HEARTBEAT_TIMEOUT_S:
        return None
    return f"no heartbeat for {_duration(silent_s)}"


def shown_state(run: RunRecord) -> str:
    """The state to show people: a `running` run whose process is gone is interrupted."""
    reason = ended_reason(run)
    return run.state if reason is None else f"interrupted ({reason})"


def refuse_if_live(run: RunRecord) -> None:
    """Raise a one-line UserError when another process is still measuring `run`."""
    if run.state != "running" or ended_reason(run) is not None:
        return
    if run.process_host == socket.gethostname():
        raise UserError(
            f"run {run.id} is still being measured by process {run.process_pid} on this "
            f"machine; let it finish, or stop it (Ctrl-C, or `kill {run.process_pid}`) and "
            "resume it then"
        )
    assert run.heartbeat_at is not None  # ended_reason says "process unknown" otherwise
    silent_s = (datetime.now(UTC) - run.heartbeat_at).total_seconds()
    raise UserError(
        f"run {run.id} is being measured by process {run.process_pid} on {run.process_host} "
        f"(last heartbeat {_duration(silent_s)} ago); resume it there, or here after "
        f"{_duration(REMOTE_HEARTBEAT_TIMEOUT_S)} without a heartbeat"
    )


def _process_alive(pid: int, heartbeat_at: datetime) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    state, started_at = _proc_stat(pid)
    if state in ("Z", "X"):
        return False  # a zombie has ended; only its parent has not collected it yet
    # A process that started after the run's latest heartbeat cannot have written it.
    later = timedelta(seconds=START_TIME_TOLERANCE_S)
    return started_at is None or started_at <= heartbeat_at + later


def _proc_stat(pid: int) -> tuple[str | None, datetime | None]:
    """A process's state letter and start time from /proc (Linux); (None, None) elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot_line = next(
            line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
    except (OSError, StopIteration):
        return None, None
    # The command name (field 2) may hold spaces and parentheses; fields after it are plain.
    after_name = stat.rsplit(")", 1)[1].split()
    state, start_ticks = after_name[0], int(after_name[19])  # fields 3 and 22
    boot_s = int(boot_line.split()[1])
    started_s = boot_s + start_ticks / os.sysconf("SC_CLK_TCK")
    return state, datetime.fromtimestamp(started_s, UTC)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"

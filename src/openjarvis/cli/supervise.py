"""`ipw measure` in a child process, so that a native library that faults (llama.cpp, CUDA, a
Triton kernel) cannot end the command silently: the parent turns the child's death by signal
into one line that names the run, the tasks saved and how to continue.

The child writes Python's fault report (where it crashed) to a file the line points to, and
tells the parent its run (id and database) through a pipe as soon as the run's row is written.
It runs in its own process group, so that Ctrl-C from the terminal reaches it once, through the
parent, which passes SIGINT and SIGTERM on and waits for the child's own message.
"""

import ctypes
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

__all__ = ["CRASH_EXIT", "announce_run", "enable_fault_report", "is_supervised", "run_supervised"]

_CHILD_ENV = "OPENJARVIS_SUPERVISED_FAULT_LOG"
_RUN_PIPE_ENV = "OPENJARVIS_SUPERVISED_RUN_FD"  # the pipe's end the child announces its run on
# A library's fault, as the child's exit signal: what the one line is for.
_FAULTS = {signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT}
CRASH_EXIT = 70  # EX_SOFTWARE: the program failed, not the user's input
_PR_SET_PDEATHSIG = 1


def is_supervised() -> bool:
    return _CHILD_ENV in os.environ


def enable_fault_report() -> None:
    """Python's fault report on a fatal signal: into the parent's file in a supervised child
    (its one line points there), else on stderr."""
    path = os.environ.get(_CHILD_ENV)
    if path is None:
        faulthandler.enable()
        return
    # Kept open for the process's life: faulthandler writes to it from the signal handler.
    faulthandler.enable(file=open(path, "w"))  # noqa: SIM115


def announce_run(run_id: str, db: str | None) -> None:
    """In a supervised child: tell the parent which run (and database) it measures, so that a
    crash's line names it. Unsupervised, nothing."""
    descriptor = os.environ.get(_RUN_PIPE_ENV)
    if descriptor is None:
        return
    line = json.dumps({"run_id": run_id, "db": db}) + "\n"
    # Under PIPE_BUF bytes: one atomic write, whole or not at all, even if the child then dies.
    os.write(int(descriptor), line.encode())


def run_supervised(argv: list[str]) -> int:
    """Run `ipw ARGV` in a child and return the exit status to leave with."""
    handle, fault_log = tempfile.mkstemp(prefix="openjarvis-fault-", suffix=".log")
    os.close(handle)
    announced, announcing = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "openjarvis", *argv],
            env={**os.environ, _CHILD_ENV: fault_log, _RUN_PIPE_ENV: str(announcing)},
            pass_fds=(announcing,),
            process_group=0,
            preexec_fn=_die_with_parent,  # the parent is one thread here: preexec_fn is safe
        )
    finally:
        os.close(announcing)  # the child holds its own copy

    def pass_on(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous_int = signal.signal(signal.SIGINT, pass_on)
    previous_term = signal.signal(signal.SIGTERM, pass_on)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    run = _announced_run(announced)
    if code >= 0 or -code not in _FAULTS:
        Path(fault_log).unlink(missing_ok=True)
        return code if code >= 0 else 128 - code
    sys.stderr.write(f"error: {_crash_line(signal.Signals(-code).name, run)}; "
                     f"fault report: {fault_log}\n")  # fmt: skip
    return CRASH_EXIT


def _announced_run(announced: int) -> tuple[str, str | None] | None:
    """The last run the child announced (id, database), read without waiting: the child has
    ended, and a process it started may still hold the pipe open. None: it announced none."""
    os.set_blocking(announced, False)
    data = b""
    try:
        while chunk := os.read(announced, 65536):
            data += chunk
    except BlockingIOError:
        pass  # all that was written is read
    finally:
        os.close(announced)
    lines = data.decode(errors="replace").splitlines()
    if not lines:
        return None
    last = json.loads(lines[-1])
    return str(last["run_id"]), last["db"]


def _die_with_parent() -> None:
    """In the child, before it runs: killed when the parent dies, so that `kill -9` of the
    command ends the measurement too (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _crash_line(signal_name: str, run: tuple[str, str | None] | None) -> str:
    """What crashed, what was saved and how to continue, from the run the child announced."""
    what = f"the engine's native code crashed ({signal_name})"
    if run is None:
        return f"{what} before the run was recorded; nothing was saved"
    run_id, db = run
    try:
        from openjarvis.store import open_reader

        with open_reader(db) as store:
            saved = len(store.task_results(run_id))
    except Exception as error:  # the one line must still come out
        return f"{what} in run {run_id}; its saved tasks could not be read ({error})"
    db_option = f" --db {db}" if db else ""
    return (
        f"{what} in run {run_id} with {saved} task(s) saved; continue it with "
        f"`ipw measure --resume {run_id}{db_option}`"
    )

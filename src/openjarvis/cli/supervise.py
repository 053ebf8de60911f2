"""`ipw measure` in a child process, so that a native library that faults (llama.cpp, CUDA, a
Triton kernel) cannot end the command silently: the parent turns the child's death by signal
into one line that names the run, the tasks saved and how to continue.

The child writes Python's fault report (where it crashed) to a file the line points to. It runs
in its own process group, so that Ctrl-C from the terminal reaches it once, through the parent,
which passes SIGINT and SIGTERM on and waits for the child's own message.
"""

import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

__all__ = ["CRASH_EXIT", "enable_fault_report", "is_supervised", "run_supervised"]

_CHILD_ENV = "OPENJARVIS_SUPERVISED_FAULT_LOG"
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


def run_supervised(argv: list[str]) -> int:
    """Run `ipw ARGV` in a child and return the exit status to leave with."""
    handle, fault_log = tempfile.mkstemp(prefix="openjarvis-fault-", suffix=".log")
    os.close(handle)
    child = subprocess.Popen(
        [sys.executable, "-m", "openjarvis", *argv],
        env={**os.environ, _CHILD_ENV: fault_log},
        process_group=0,
        preexec_fn=_die_with_parent,  # the parent is one thread here: preexec_fn is safe
    )

    def pass_on(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous_int = signal.signal(signal.SIGINT, pass_on)
    previous_term = signal.signal(signal.SIGTERM, pass_on)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    if code >= 0 or -code not in _FAULTS:
        Path(fault_log).unlink(missing_ok=True)
        return code if code >= 0 else 128 - code
    sys.stderr.write(f"error: {_crash_line(signal.Signals(-code).name, child.pid, argv)}; "
                     f"fault report: {fault_log}\n")  # fmt: skip
    return CRASH_EXIT


def _die_with_parent() -> None:
    """In the child, before it runs: killed when the parent dies, so that `kill -9` of the
    command ends the measurement too (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _crash_line(signal_name: str, pid: int, argv: list[str]) -> str:
    """What crashed, what was saved and how to continue, from the run the child recorded."""
    what = f"the engine's native code crashed ({signal_name})"
    db = _option(argv, "--db")
    try:
        from openjarvis.store import open_reader

        with open_reader(db) as store:
            run = next((r for r in store.list_runs(limit=20) if r.process_pid == pid), None)
            if run is None or run.id is None:
                return f"{what} before the run was recorded; nothing was saved"
            saved = len(store.task_results(run.id))
    except Exception as error:  # the one line must still come out
        return f"{what}; its run could not be read ({error})"
    db_option = f" --db {db}" if db else ""
    return (
        f"{what} in run {run.id} with {saved} task(s) saved; continue it with "
        f"`ipw measure --resume {run.id}{db_option}`"
    )


def _option(argv: list[str], name: str) -> str | None:
    for i, argument in enumerate(argv):
        if argument == name and i + 1 < len(argv):
            return argv[i + 1]
        if argument.startswith(name + "="):
            return argument.split("=", 1)[1]
    return os.environ.get("OPENJARVIS_DB") if name == "--db" else None

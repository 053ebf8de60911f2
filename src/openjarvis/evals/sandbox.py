"""Run untrusted, model-written Python in an OS-isolated child process and report what happened.

Isolation comes from bubblewrap, else Linux namespaces via unshare, else rlimits only (weak).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import psutil

from openjarvis.errors import UserError
from openjarvis.evals.types import ExecutionResult

__all__ = ["Isolation", "Sandbox"]

# Known gaps, all kinds: memory is capped per process (RLIMIT_AS), so in total up to
# process_limit times that (a cgroup would bound the sum); the host filesystem stays readable
# (read-only), and filesystem unix sockets outside /tmp and /run stay connectable to the uid the
# program runs as. rlimits-only adds: open network, writes wherever that uid may, and (without
# root) children that leave the process group and drop the tag variable escape the sweep.
Isolation = Literal["bubblewrap", "namespaces", "rlimits-only"]
_ISOLATIONS: tuple[Isolation, ...] = ("bubblewrap", "namespaces", "rlimits-only")
_MIB = 1024 * 1024
# As root, programs run as these uids, in the range systemd leaves unassigned
# (1879048192-2147483647), so no login, container or service owns them. One uid per running
# program (leased across processes) makes RLIMIT_NPROC count that program alone and lets a
# sweep kill exactly its processes.
_SANDBOX_UID_BASE = 1_950_000_000
_WORK_DIR = "/tmp/work"  # the program's directory inside bubblewrap and namespaces
_TAG_VARIABLE = "OPENJARVIS_SANDBOX_RUN"
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

# Runs inside the sandbox, never in our process: it is only ever the `-c` argument of the
# interpreter that `_execute` starts under the isolation prefix. It sets the limits, then runs
# the program. The pass signal is positive: a line written to a private fd after the whole
# program has run, so os._exit(0), sys.exit() or a kill before the end can never count as a
# pass. It guards against accidents, not against a program that sets out to forge the line.
_DRIVER = """\
import os, resource, sys
marker_fd = int(sys.argv[1])
names = ("CPU", "AS", "FSIZE", "NPROC", "NOFILE", "CORE")
for name, value in zip(names, map(int, sys.argv[2:])):
    kind = getattr(resource, "RLIMIT_" + name)
    hard = resource.getrlimit(kind)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))
source = sys.stdin.buffer.read()
null_fd = os.open(os.devnull, os.O_RDONLY)
os.dup2(null_fd, 0)
os.close(null_fd)
sys.argv = ["program.py"]
write = os.write
write(marker_fd, b"started\\n")
exec(compile(source, "program.py", "exec"), {"__name__": "__main__"})
write(marker_fd, b"finished\\n")
"""

# Runs as pid 1 of fresh pid/mount/net namespaces: makes every mount read-only (keeping the
# flags a user namespace may not clear), gives the program private tmpfs scratch space, then
# hands over to setpriv, which drops to the sandbox uid ("-" keeps the current one) with no
# capabilities and SIGKILL when unshare dies. One interpreter and mount(2) calls, instead of a
# shell starting one `mount` process per mount point (78 ms per program against 38 for
# bubblewrap, measured on the 2-core VM of docs/benchmarks.md).
_NAMESPACE_SETUP = """\
import codecs, ctypes, os, sys
uid, size = sys.argv[1], sys.argv[2]
command = sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)
KEPT = {b"nosuid": 2, b"nodev": 4, b"noexec": 8, b"noatime": 1024, b"nodiratime": 2048,
        b"relatime": 1 << 21, b"strictatime": 1 << 24}
def mount(source, target, kind, flags, data):
    if libc.mount(source, target, kind, flags, data) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error), target)
with open("/proc/self/mountinfo", "rb") as table:
    mounts = [line.split(b" ") for line in table]
for fields in mounts:
    target = codecs.escape_decode(fields[4])[0]
    kept = sum(KEPT.get(option, 0) for option in fields[5].split(b","))
    mount(None, target, None, 32 | 4096 | 1 | kept, None)  # MS_REMOUNT | MS_BIND | MS_RDONLY
for folder in (b"/tmp", b"/var/tmp", b"/dev/shm", b"/run"):
    if os.path.isdir(folder):
        mount(b"sandbox", folder, b"tmpfs", 2 | 4, b"size=%s,mode=1777" % size.encode())
os.mkdir("/tmp/work", 0o700)
os.chdir("/tmp/work")
drop = ["--no-new-privs", "--bounding-set", "-all", "--inh-caps", "-all", "--pdeathsig", "SIGKILL"]
if uid != "-":
    os.chown("/tmp/work", int(uid), int(uid))
    drop += ["--reuid", uid, "--regid", uid, "--clear-groups"]
os.execvp("setpriv", ["setpriv", *drop, "--", *command])
"""


@dataclass(frozen=True, slots=True)
class Sandbox:
    """Runs Python programs in isolation; build one with `detect()` (or `with_isolation`)."""

    isolation: Isolation
    isolation_note: str  # one line for the run's output and record
    python: str  # interpreter inside the sandbox; stdlib only is guaranteed
    launcher: str = ""  # path of bwrap or unshare
    memory_limit_bytes: int = 2048 * _MIB  # RLIMIT_AS per process
    process_limit: int = 16  # RLIMIT_NPROC
    file_size_limit_bytes: int = 64 * _MIB  # RLIMIT_FSIZE; also caps stdout and stderr
    scratch_size_bytes: int = 64 * _MIB  # each private tmpfs (/tmp, /run, ...)

    @classmethod
    def detect(cls) -> Sandbox:
        """The strongest isolation that works here (probed once per process)."""
        return _detect()

    @classmethod
    def with_isolation(cls, isolation: Isolation) -> Sandbox:
        """A sandbox of this kind, or UserError saying why it does not work here."""
        if isolation not in _ISOLATIONS:
            raise ValueError(f"isolation must be one of {_ISOLATIONS}, got {isolation!r}")
        sandbox, reason = _probe(isolation)
        if sandbox is None:
            raise UserError(f"{isolation} sandbox unavailable: {reason}")
        return sandbox

    def run_python(self, source: str, timeout_s: float) -> ExecutionResult:
        """Run `source` as __main__; it passes only if it runs to its end and exits with 0."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        with _claim_uid() as uid, tempfile.TemporaryDirectory(prefix="openjarvis-run-") as own:
            own_dir = Path(own)  # ours alone: the program's input, output and pass marker
            (own_dir / "program.py").write_text(source, encoding="utf-8")
            work_dir = None
            if self.isolation == "rlimits-only":  # the others get a private tmpfs instead
                work_dir = Path(tempfile.mkdtemp(prefix="openjarvis-sandbox-"))
                if uid is not None:
                    os.chown(work_dir, uid, uid)
            try:
                outcome = self._execute(own_dir, work_dir, uid, timeout_s)
            finally:
                if work_dir is not None:
                    _remove_tree(work_dir)
            return _judge(own_dir, *outcome, timeout_s=timeout_s)

    def _execute(
        self, own_dir: Path, work_dir: Path | None, uid: int | None, timeout_s: float
    ) -> tuple[int, bool, float]:
        """Start, wait, kill whatever is left; (exit code, timed out, seconds)."""
        inner_dir = str(work_dir or _WORK_DIR)
        tag = secrets.token_hex(8)
        env = {"PATH": _SAFE_PATH, "HOME": inner_dir, "TMPDIR": inner_dir, "LANG": "C.UTF-8"}
        env[_TAG_VARIABLE] = tag
        limits = (
            math.ceil(timeout_s) + 1,  # CPU seconds: a backstop, the wall clock decides
            self.memory_limit_bytes,
            self.file_size_limit_bytes,
            self._nproc_limit(uid),
            256,  # open files
            0,  # core dumps
        )
        # Namespaces start as root and drop the uid inside; the others drop it at exec.
        drop = uid is not None and self.isolation != "namespaces"
        with (
            open(own_dir / "program.py", "rb") as stdin,
            open(own_dir / "stdout", "wb") as stdout,
            open(own_dir / "stderr", "wb") as stderr,
            open(own_dir / "marker", "wb") as marker,
        ):
            driver = [self.python, "-I", "-B", "-c", _DRIVER, str(marker.fileno())]
            argv = [*self._launch_prefix(uid), *driver, *map(str, limits)]
            started = time.monotonic()
            process = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                pass_fds=(marker.fileno(),),
                cwd=work_dir or "/",
                env=env,
                start_new_session=True,
                user=uid if drop else None,
                group=uid if drop else None,
                extra_groups=[] if drop else None,
            )
            try:
                timed_out = not _wait_without_reaping(process.pid, timeout_s)
            finally:
                # Until it is reaped the leader keeps its process group id from being reused.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                return_code = process.wait()
            if self.isolation == "rlimits-only":
                self._sweep(uid, tag)
            return return_code, timed_out, time.monotonic() - started

    def _launch_prefix(self, uid: int | None) -> list[str]:
        if self.isolation == "bubblewrap":
            flags = "--unshare-all --unshare-user --disable-userns --die-with-parent "
            flags += "--new-session --cap-drop ALL --ro-bind / / --dev /dev --proc /proc"
            for path in ("/tmp", "/var/tmp", "/run"):
                if os.path.isdir(path):
                    flags += f" --size {self.scratch_size_bytes} --tmpfs {path}"
            flags += f" --dir {_WORK_DIR} --chdir {_WORK_DIR} --"
            return [self.launcher, *flags.split()]
        if self.isolation == "namespaces":
            flags = "--net --pid --ipc --uts --mount --fork --kill-child --mount-proc"
            if uid is None:
                flags = "--user --map-root-user " + flags
            setup = [self.python, "-I", "-S", "-B", "-c", _NAMESPACE_SETUP]
            setup += ["-" if uid is None else str(uid), str(self.scratch_size_bytes)]
            return [self.launcher, *flags.split(), "--", *setup]
        return []

    def _nproc_limit(self, uid: int | None) -> int:
        if uid is not None or self.isolation != "rlimits-only":
            return self.process_limit  # counts this program's processes alone
        # RLIMIT_NPROC counts every process of our user, so allow that many more.
        own = sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"].real == os.getuid())
        return own + self.process_limit

    def _sweep(self, uid: int | None, tag: str) -> None:
        """Kill what escaped the process group (rlimits-only has no pid namespace to do it)."""
        if uid is not None:
            # kill(-1) as the program's own uid reaches exactly its processes, atomically.
            code = "import os, signal\ntry: os.kill(-1, signal.SIGKILL)\nexcept OSError: pass"
            argv = [self.python, "-I", "-S", "-c", code]
            subprocess.run(argv, check=True, user=uid, group=uid, extra_groups=[], env={})
            return
        # Without root, best effort: processes that kept the tag in their environment.
        for _ in range(3):
            tagged = [p for p in psutil.process_iter() if _carries_tag(p, tag)]
            for process in tagged:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            if not tagged:
                return


def _judge(
    own_dir: Path, return_code: int, timed_out: bool, duration_s: float, *, timeout_s: float
) -> ExecutionResult:
    marks = (own_dir / "marker").read_bytes().split()
    stderr = _tail((own_dir / "stderr").read_bytes())
    if timed_out:
        detail = f"killed after {timeout_s:g} s (wall clock) with every process it started"
        return ExecutionResult("timeout", f"{detail}\n{stderr}".strip(), duration_s)
    if b"finished" in marks and return_code == 0:
        return ExecutionResult("passed", "", duration_s)
    if b"started" not in marks:
        detail = f"sandbox failed to start the program (exit code {return_code}): {stderr}"
        return ExecutionResult("error", detail, duration_s)
    detail = stderr or f"exit code {return_code} before reaching the end of the program"
    return ExecutionResult("failed", detail, duration_s)


def _carries_tag(process: psutil.Process, tag: str) -> bool:
    try:
        return process.environ().get(_TAG_VARIABLE) == tag
    except psutil.Error:
        return False  # not ours, or gone: not a process of this program either way


def _wait_without_reaping(pid: int, timeout_s: float) -> bool:
    """True if the process exited within the timeout; it stays a zombie until waited for."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(timeout_s * 1000))
    finally:
        os.close(pidfd)


def _tail(data: bytes, lines: int = 8, chars: int = 1500) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return "\n".join(text.splitlines()[-lines:])[-chars:]


def _remove_tree(path: Path) -> None:
    # The program may have chmod-ed its directories.
    def make_writable(function: Callable[[str], object], failed_path: str, _exc: object) -> None:
        os.chmod(os.path.dirname(failed_path), stat.S_IRWXU)
        function(failed_path)

    shutil.rmtree(path, onerror=make_writable)


_UID_LEASES = Path("/run/openjarvis-sandbox-uids")


@contextlib.contextmanager
def _claim_uid() -> Iterator[int | None]:
    """A uid no other running program has, across processes, when we are root (else None).

    A lease is an flock on a per-uid file: the kernel drops it when its holder exits, so a
    crashed harness never strands a uid, and threads conflict as processes do.
    """
    if os.geteuid() != 0:
        yield None
        return
    _UID_LEASES.mkdir(mode=0o700, exist_ok=True)
    for uid in range(_SANDBOX_UID_BASE, 2**31):
        lease = os.open(_UID_LEASES / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lease)
            continue
        try:
            yield uid
        finally:
            os.close(lease)  # releases the lock
        return


def _interpreter(as_root: bool) -> str:
    """As root the program runs as a bare uid that may not reach a venv under /root."""
    candidates = [sys.executable, shutil.which("python3", path=_SAFE_PATH) or sys.executable]
    if not as_root:
        return candidates[0]
    return next((c for c in candidates if _others_can_execute(c)), candidates[0])


def _others_can_execute(path: str) -> bool:
    real = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in (real, *real.parents))


def _limits_text(sandbox: Sandbox) -> str:
    who = f"uids from {_SANDBOX_UID_BASE}" if os.geteuid() == 0 else "your uid"
    return (
        f"limits per program: {sandbox.memory_limit_bytes // _MIB} MiB address space, "
        f"{sandbox.process_limit} processes, {sandbox.file_size_limit_bytes // _MIB} MiB "
        f"per file, CPU time = timeout + 1 s; runs as {who}"
    )


@functools.cache
def _probe(isolation: Isolation) -> tuple[Sandbox | None, str]:
    """Run a trivial program through the whole path; (sandbox, "") or (None, why not)."""
    as_root = os.geteuid() == 0
    tool = {"bubblewrap": "bwrap", "namespaces": "unshare", "rlimits-only": None}[isolation]
    launcher = shutil.which(tool) if tool else ""
    if launcher is None:
        return None, f"`{tool}` is not on PATH"
    if isolation == "namespaces" and not shutil.which("setpriv"):
        return None, "`setpriv` (util-linux) is not on PATH"
    notes = {
        "bubblewrap": "bubblewrap: no network, own pid/ipc/uts/user namespaces, read-only host "
        "filesystem, private /tmp",
        "namespaces": "namespaces (unshare): no network, own pid/ipc/uts/mount namespaces, "
        "read-only host filesystem, private /tmp",
        "rlimits-only": "rlimits-only (WEAK): programs can use the network, "
        + ("write world-writable files" if as_root else "write any file you can")
        + " and leave processes that escape their group (swept best effort)",
    }
    sandbox = Sandbox(isolation, notes[isolation], _interpreter(as_root), launcher or "")
    sandbox = replace(sandbox, isolation_note=f"{sandbox.isolation_note}; {_limits_text(sandbox)}")
    result = sandbox.run_python("import sys\nassert sys.version_info >= (3, 8)\n", timeout_s=30)
    if not result.passed:
        last_line = (result.detail.splitlines() or [result.status])[-1]
        return None, f"probe {result.status}: {last_line}"
    return sandbox, ""


@functools.cache
def _detect() -> Sandbox:
    if not sys.platform.startswith("linux"):
        raise UserError("the eval sandbox needs Linux (namespaces, pidfd); run evals on Linux")
    reasons: list[str] = []
    for isolation in _ISOLATIONS:
        sandbox, reason = _probe(isolation)
        if sandbox is None:
            reasons.append(f"{isolation}: {reason}")
            continue
        if isolation == "rlimits-only":
            fix = (
                "; stronger isolation failed (" + "; ".join(reasons) + "). Fix: `apt-get "
                "install bubblewrap` or allow unprivileged user namespaces"
            )
            sandbox = replace(sandbox, isolation_note=sandbox.isolation_note + fix)
        return sandbox
    raise UserError("cannot run programs in any sandbox: " + "; ".join(reasons))

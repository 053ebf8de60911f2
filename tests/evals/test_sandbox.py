"""The sandbox against hostile and broken programs, for every isolation that works on this host.

Kinds that cannot run here are skipped with the reason; the detected kind always runs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from openjarvis.errors import UserError
from openjarvis.evals import sandbox as sandbox_module
from openjarvis.evals.sandbox import Isolation, Sandbox
from openjarvis.evals.types import ExecutionResult

ISOLATIONS: tuple[Isolation, ...] = ("bubblewrap", "namespaces", "rlimits-only")
SHORT_TIMEOUT_S = 2.0  # for programs that must be killed; keeps the suite quick
TIMEOUT_S = 20.0  # for programs that end on their own; generous for a loaded machine


def _sandbox_or_skip(isolation: Isolation) -> Sandbox:
    try:
        return Sandbox.with_isolation(isolation)
    except UserError as error:
        pytest.skip(str(error))


@pytest.fixture(params=ISOLATIONS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return _sandbox_or_skip(request.param)


def _processes_with(token: str) -> list[psutil.Process]:
    """Live processes whose command line mentions token (zombies have none)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(token in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


def _wait_until_gone(token: str, deadline_s: float = 5.0) -> list[psutil.Process]:
    end = time.monotonic() + deadline_s
    while (left := _processes_with(token)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def test_detect_picks_the_strongest_isolation_that_works_and_explains_it() -> None:
    detected = Sandbox.detect()
    assert detected is Sandbox.detect()  # probed once
    working = []
    for isolation in ISOLATIONS:
        with contextlib.suppress(UserError):
            working.append(Sandbox.with_isolation(isolation).isolation)
    assert detected.isolation == working[0]
    assert detected.isolation_note.startswith(detected.isolation)
    assert "\n" not in detected.isolation_note
    if detected.isolation == "rlimits-only":
        assert "apt-get install bubblewrap" in detected.isolation_note


def test_without_bwrap_or_unshare_it_falls_back_and_says_how_to_fix_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no bwrap, no unshare
    sandbox_module._probe.cache_clear()
    sandbox_module._detect.cache_clear()
    try:
        weak = Sandbox.detect()
    finally:
        sandbox_module._probe.cache_clear()
        sandbox_module._detect.cache_clear()
    assert weak.isolation == "rlimits-only"
    assert "WEAK" in weak.isolation_note
    assert "bubblewrap: `bwrap` is not on PATH" in weak.isolation_note
    assert "namespaces: `unshare` is not on PATH" in weak.isolation_note
    assert "apt-get install bubblewrap" in weak.isolation_note
    assert weak.run_python("pass", TIMEOUT_S).passed


def test_program_that_runs_to_its_end_passes(sandbox: Sandbox) -> None:
    source = (
        "import os, tempfile\n"
        "open('scratch.txt', 'w').write('kept')\n"  # its own directory is writable
        "assert open('scratch.txt').read() == 'kept'\n"
        "with tempfile.TemporaryFile() as scratch:\n"
        "    scratch.write(b'x')\n"
        "print('hello')\n"
    )
    result = sandbox.run_python(source, TIMEOUT_S)
    assert result == ExecutionResult("passed", "", result.duration_s)
    assert 0 < result.duration_s < TIMEOUT_S


def test_the_program_runs_in_another_process_never_in_ours(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's exec() runs in the sandbox's child: the program sees another pid and none
    of this process's state, and its changes to the interpreter do not reach us."""
    import builtins

    monkeypatch.setattr(builtins, "_openjarvis_harness_mark", True, raising=False)
    source = (
        "import builtins, os\n"
        f"assert os.getpid() != {os.getpid()}\n"
        "assert not hasattr(builtins, '_openjarvis_harness_mark')\n"
        "builtins._openjarvis_program_mark = True\n"
    )
    assert sandbox.run_python(source, TIMEOUT_S).passed
    assert not hasattr(builtins, "_openjarvis_program_mark")


@pytest.mark.parametrize(
    ("source", "expected_in_detail"),
    [
        ("assert 1 + 1 == 3\n", "AssertionError"),
        ("def broken(:\n", "SyntaxError"),
        ("raise SystemExit(3)\n", "exit code 3"),
    ],
)
def test_failing_program_fails_with_the_reason(
    sandbox: Sandbox, source: str, expected_in_detail: str
) -> None:
    result = sandbox.run_python(source, TIMEOUT_S)
    assert result.status == "failed"
    assert expected_in_detail in result.detail


@pytest.mark.parametrize(
    "early_exit", ["import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n", "exit()\n"]
)
def test_exit_with_code_zero_before_the_end_is_not_a_pass(
    sandbox: Sandbox, early_exit: str
) -> None:
    result = sandbox.run_python(early_exit + "assert False, 'checks would fail here'\n", TIMEOUT_S)
    assert result.status == "failed"
    assert "before reaching the end" in result.detail


def test_scrubbed_environment(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENJARVIS_TEST_SECRET", "hunter2")
    source = "import os\nassert 'OPENJARVIS_TEST_SECRET' not in os.environ, dict(os.environ)\n"
    assert sandbox.run_python(source, TIMEOUT_S).passed


def test_infinite_loop_times_out(sandbox: Sandbox) -> None:
    result = sandbox.run_python("while True:\n    pass\n", SHORT_TIMEOUT_S)
    assert result.status == "timeout"
    assert f"{SHORT_TIMEOUT_S:g} s" in result.detail
    assert SHORT_TIMEOUT_S <= result.duration_s < SHORT_TIMEOUT_S + 5


def test_fork_bomb_is_capped_and_fully_killed(sandbox: Sandbox) -> None:
    token = f"forkbomb-{secrets.token_hex(6)}"
    # Children exec a command line we can find; fork failures are ignored so it never ends.
    source = (
        "import os, sys\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        f"            os.execv(sys.executable, [sys.executable, '-c', 'while 1: 0', '{token}'])\n"
        "    except OSError:\n"
        "        pass\n"
    )
    results: list[ExecutionResult] = []
    runner = threading.Thread(
        target=lambda: results.append(sandbox.run_python(source, SHORT_TIMEOUT_S))
    )
    runner.start()
    counts = [0]
    while runner.is_alive():
        counts.append(len(_processes_with(token)))
        time.sleep(0.05)
    runner.join()
    assert results[0].status == "timeout", results[0]
    assert max(counts) > 0, "the fork bomb never ran: this test would prove nothing"
    assert max(counts) < sandbox.process_limit  # the program itself is one of the processes
    assert _wait_until_gone(token) == []


def test_ten_gigabyte_allocation_fails_with_memory_error(sandbox: Sandbox) -> None:
    before = psutil.Process().memory_info().rss  # earlier tests may have loaded models here
    result = sandbox.run_python("hog = bytearray(10 * 1024**3)\n", TIMEOUT_S)
    assert result.status == "failed"
    assert "MemoryError" in result.detail
    # The harness itself is untouched: the allocation happened (and failed) in the child.
    assert psutil.Process().memory_info().rss - before < 1024**3


@pytest.fixture(params=["user file", "world-writable file"])
def canary(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A file outside any /tmp: a user's project file (0644 in 0755) or one anybody may write.

    It sits beside this test because bubblewrap and namespaces hide /tmp, which would make a
    canary there prove nothing about the read-only host filesystem. The world-writable one
    shows that the filesystem, not just the uid the program runs as, refuses the write.
    """
    world = request.param == "world-writable file"
    directory = Path(__file__).parent / f".canary-{secrets.token_hex(6)}"
    directory.mkdir()
    directory.chmod(0o777 if world else 0o755)
    path = directory / "canary.txt"
    path.write_text("alive\n")
    path.chmod(0o666 if world else 0o644)
    yield path
    shutil.rmtree(directory)


@pytest.mark.parametrize(
    "attack",
    [
        "import os\nos.system('rm -rf {dir}')\n",
        "open('{path}', 'w').write('overwritten')\n",
        "import os\nos.remove('{path}')\n",
    ],
)
def test_files_outside_the_sandbox_survive(sandbox: Sandbox, canary: Path, attack: str) -> None:
    if sandbox.isolation == "rlimits-only":
        if os.geteuid() != 0:
            pytest.skip("rlimits-only without root runs as you and can write your files (noted)")
        if canary.stat().st_mode & 0o002:
            pytest.skip("rlimits-only can write world-writable files (stated in its note)")
    source = attack.format(dir=canary.parent, path=canary)
    sandbox.run_python(source, TIMEOUT_S)
    assert canary.read_text() == "alive\n"
    assert canary.parent.is_dir()


def test_network_is_unreachable(sandbox: Sandbox) -> None:
    if sandbox.isolation == "rlimits-only":
        pytest.skip("rlimits-only leaves the network open (stated in its isolation_note)")
    accepted: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        port = server.getsockname()[1]
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    connection, _ = server.accept()
                except TimeoutError:
                    continue
                with connection:
                    accepted.append(connection.recv(100))

        listener = threading.Thread(target=accept)
        listener.start()
        try:
            # Control: the server is reachable from outside the sandbox.
            with socket.create_connection(("127.0.0.1", port), timeout=5) as probe:
                probe.sendall(b"control")
            source = (
                "import socket\n"
                f"socket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'escaped')\n"
            )
            result = sandbox.run_python(source, TIMEOUT_S)
            time.sleep(0.3)
        finally:
            stop.set()
            listener.join()
    assert result.status == "failed"
    assert "Error" in result.detail  # ConnectionRefusedError or OSError: unreachable
    assert b"escaped" not in accepted
    assert accepted == [b"control"]


@pytest.mark.parametrize(("ending", "passes"), [("assert 1 + 1 == 2", True), ("assert 0", False)])
def test_closing_stdout_and_stderr(sandbox: Sandbox, ending: str, passes: bool) -> None:
    source = f"import os, sys\nsys.stdout.close()\nos.close(1)\nos.close(2)\n{ending}\n"
    result = sandbox.run_python(source, TIMEOUT_S)
    assert result.status == ("passed" if passes else "failed")
    print("the harness's own stdout still works")


def _sleeper(token: str) -> str:
    """Python that replaces the calling process with one that sleeps, findable by token."""
    return (
        "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(3600)', "
        f"'{token}'])"
    )


@pytest.mark.parametrize("main_ends", ["sleeps forever", "exits at once"])
def test_child_that_calls_setsid_dies_with_the_program(sandbox: Sandbox, main_ends: str) -> None:
    token = f"setsid-child-{secrets.token_hex(6)}"
    source = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    {_sleeper(token)}\n"
        "time.sleep(0.5)\n"  # lets the test see the child before the program ends
        + ("time.sleep(3600)\n" if main_ends == "sleeps forever" else "")
    )
    expected = "timeout" if main_ends == "sleeps forever" else "passed"
    _run_and_check_token_dies(sandbox, source, token, expected)


def test_program_that_calls_setsid_itself_dies_at_timeout(sandbox: Sandbox) -> None:
    token = f"setsid-main-{secrets.token_hex(6)}"
    # Leaves the process group the harness kills (where it is not already a group leader).
    source = (
        f"import os, sys\ntry:\n    os.setsid()\nexcept OSError:\n    pass\n{_sleeper(token)}\n"
    )
    _run_and_check_token_dies(sandbox, source, token, "timeout")


def _run_and_check_token_dies(sandbox: Sandbox, source: str, token: str, expected: str) -> None:
    results: list[ExecutionResult] = []
    runner = threading.Thread(
        target=lambda: results.append(sandbox.run_python(source, SHORT_TIMEOUT_S))
    )
    runner.start()
    seen = False
    while runner.is_alive():
        seen = seen or bool(_processes_with(token))
        time.sleep(0.02)
    runner.join()
    assert seen, "the sleeper never started: this test would prove nothing"
    assert results[0].status == expected, results[0]
    assert _wait_until_gone(token) == []


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        Sandbox.detect().run_python("pass", 0)

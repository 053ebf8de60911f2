"""Shell commands the user approved: a subprocess in the working directory with a time limit.

The command gets its own process group, so a timeout ends everything it started.
"""

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_OUTPUT_CHARS", "ShellResult", "run_command"]

MAX_OUTPUT_CHARS = 8_000


@dataclass(frozen=True, slots=True)
class ShellResult:
    command: str
    exit_code: int | None  # None when the time limit ended it
    output: str  # stdout and stderr interleaved as the command wrote them
    timeout_s: float

    def for_model(self) -> str:
        output = self.output
        if len(output) > MAX_OUTPUT_CHARS:
            # The end of a log holds the error; the cut is said, never silent.
            output = (
                f"[cut: the last {MAX_OUTPUT_CHARS:,} of {len(output):,} characters]\n"
                f"{output[-MAX_OUTPUT_CHARS:]}"
            )
        if self.exit_code is None:
            status = f"stopped after the {self.timeout_s:g} s time limit"
        else:
            status = f"exit code {self.exit_code}"
        return f"$ {self.command}\n{output}\n[{status}]"


def run_command(command: str, working_dir: Path, timeout_s: float) -> ShellResult:
    process = subprocess.Popen(
        command,
        shell=True,
        cwd=working_dir,
        stdin=subprocess.DEVNULL,  # a command waiting for input would hang the assistant
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return ShellResult(command, process.returncode, output, timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return ShellResult(command, None, output, timeout_s)

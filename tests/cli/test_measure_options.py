"""Every option of `ipw measure` is checked where it is parsed: a value out of range, or options
that contradict each other, give one line naming the allowed range, exit 2, and write nothing.

Run as a user runs it (`python -m openjarvis` in a subprocess, its own XDG_DATA_HOME); no check
here loads a model.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

__all__: list[str] = []

INVALID = {
    "negative temperature": (["--temperature", "-1"], "--temperature must be 0 or more"),
    "NaN temperature": (["--temperature", "nan"], "--temperature must be 0 or more"),
    "zero threads": (["--threads", "0"], "--threads must be at least 1 (got 0)"),
    "negative threads": (["--threads", "-2"], "--threads must be at least 1 (got -2)"),
    "negative seed": (["--seed", "-1"], "--seed must be 0 to 4294967295"),
    "seed past 32 bits": (["--seed", "4294967295", "--samples", "2"], "--seed must be 0 to"),
    "negative context": (["--n-ctx", "-5"], "--n-ctx must be at least 1 token (got -5)"),
    "zero context": (["--n-ctx", "0"], "--n-ctx must be at least 1 token (got 0)"),
    "negative idle": (["--idle-seconds", "-1"], "--idle-seconds must be 0 or more"),
    "endless idle": (["--idle-seconds", "inf"], "--idle-seconds must be 0 or more, finite"),
    "zero timeout": (["--timeout", "0"], "--timeout must be above 0 seconds"),
    "zero limit": (["--limit", "0"], "--limit must be at least 1"),
    "zero samples": (["--samples", "0"], "--samples must be at least 1"),
    "zero tp": (["--tp", "0"], "--tp must be at least 1"),
    "unknown scope": (["--scope", "gpu"], "use --scope system or --scope accelerator"),
    "all with limit": (["--all", "--limit", "5"], "--all runs every task and --limit N"),
    "resume with suite": (
        ["--resume", "3f2a", "--suite", "mbpp"],
        "--resume continues a run with the options it was started with; leave out --suite",
    ),
    "resume with several": (
        ["--resume", "3f2a", "--limit", "3", "--model", "x.gguf", "--samples", "2"],
        "leave out --model, --limit, --samples",
    ),
    "resume of a missing database": (["--resume", "3f2a"], "no database at"),
    # Each engine's fixed capabilities, checked before the engine starts or a file is written.
    "llama.cpp past its batch": (
        ["--concurrency", "5"],
        "--concurrency 5 is more than the llamacpp engine runs at once (4); use --concurrency 4",
    ),
    "torch past its batch": (
        ["--engine", "torch", "--concurrency", "65"],
        "--concurrency 65 is more than the torch engine runs at once (64)",
    ),
    "cloud past its rate": (
        ["--engine", "openai", "--model", "m", "--concurrency", "9"],
        "--concurrency 9 is more than the openai engine runs at once (8)",
    ),
    "unknown meter": (["--meter", "guess"], "--meter takes auto, local, estimate (got 'guess')"),
    "a local meter for a remote API": (
        ["--engine", "anthropic", "--model", "m", "--meter", "local"],
        "--meter local is for OpenAI-compatible servers on this machine",
    ),
    "zero concurrency": (["--concurrency", "0"], "--concurrency must be at least 1 task (got 0)"),
    "local judge beside concurrent tasks": (
        ["--judge", "llamacpp", "--concurrency", "2"],
        "a local judge (llamacpp) keeps its joules apart only between the judged model's tasks",
    ),
    "lm-eval option for another suite": (
        ["--apply-chat-template"],
        "--num-fewshot, --lm-eval-include and the other lm-eval options are for lm-eval suites",
    ),
    "multiturn without a chat template": (
        ["--suite", "lm-eval:x", "--fewshot-as-multiturn"],
        "--fewshot-as-multiturn needs --apply-chat-template",
    ),
    "negative few-shot seed": (
        ["--suite", "lm-eval:x", "--fewshot-seed", "-1"],
        "--fewshot-seed must be 0 or more (got -1)",
    ),
    "lm-eval options in the name": (
        ["--suite", "lm-eval:x?num_fewshot=2"],
        "lm-eval options are flags of ipw measure now",
    ),
    "resume with an lm-eval option": (
        ["--resume", "3f2a", "--apply-chat-template"],
        "leave out --apply-chat-template",
    ),
}


@pytest.mark.parametrize(("args", "message"), INVALID.values(), ids=INVALID.keys())
def test_an_invalid_option_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("OPENJARVIS_DB", None)
    db = tmp_path / "ipw.db"
    done = subprocess.run(
        [sys.executable, "-m", "openjarvis", "measure", *args, "--db", str(db)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr and "damaged" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # no database, no data folder

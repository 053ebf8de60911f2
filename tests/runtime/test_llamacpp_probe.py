"""The child-process probe of llama.cpp: a build that faults is one clear line, a good build is
probed once and remembered."""

import subprocess
import sys
from pathlib import Path

import pytest

from openjarvis.errors import UserError
from openjarvis.runtime import llamacpp_probe
from openjarvis.runtime.llamacpp_probe import check_llama_cpp_runs
from openjarvis.runtime.models import resolve_model

FAULTING = Path(__file__).parents[1] / "fakes" / "faulting_llama_cpp"


@pytest.fixture()
def model_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return resolve_model(None).path


def _probes(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "cache" / "openjarvis" / "llamacpp-probe").glob("*"))


def test_a_faulting_build_is_one_line_with_the_rebuild_command(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FAULTING))
    with pytest.raises(UserError) as raised:
        check_llama_cpp_runs(model_path)
    message = str(raised.value)
    assert "SIGILL" in message
    assert "GGML_NATIVE=OFF" in message
    assert "\n" not in message
    assert _probes(tmp_path) == []  # a crash is never remembered as a pass


def test_a_working_build_is_probed_once(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_llama_cpp_runs(model_path)
    assert len(_probes(tmp_path)) == 1

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("a remembered pass must not start a child")

    monkeypatch.setattr(llamacpp_probe.subprocess, "run", no_child)
    check_llama_cpp_runs(model_path)


def test_ipw_measure_on_a_faulting_build_says_so_and_exits_2(
    tmp_path: Path, model_path: Path
) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONPATH": str(FAULTING),
    }
    db = tmp_path / "runs.db"
    measured = subprocess.run(
        [sys.executable, "-m", "openjarvis", "measure", "--limit", "1", "--db", str(db)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert measured.returncode == 2
    lines = measured.stderr.strip().splitlines()
    assert len(lines) == 1, measured.stderr
    assert lines[0].startswith("error: llama.cpp crashed with SIGILL")

"""The energy scope as `ipw measure`, `ipw show`, `ipw compare` and the report tell it: the GPUs
the engine runs on, GPUs left out, and a partial scope when a source in it cannot be read.

The measure test runs the real embedded model on the CPU beside a fake two-GPU NVML whose first
GPU refuses its energy counter; the others use synthetic runs in a real SQLite store.
"""

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from openjarvis.cli.ipw import app
from openjarvis.cli.summary import print_summary, summary_dict
from openjarvis.errors import UserError
from openjarvis.evals.config import RunConfig, prepare
from openjarvis.evals.runner import MeasureResult, run_measure
from openjarvis.evals.suites import SuiteConfig
from openjarvis.power import rapl
from openjarvis.report.runs import energy_label, frontiers
from openjarvis.runtime.llamacpp import LlamaCppEngine, _ggml_gpu_count
from openjarvis.runtime.models import embedded_default
from openjarvis.store import open_store
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu, install_fake_nvml
from tests.synthetic import add_run, make_host

__all__: list[str] = []

UUID_A = "GPU-aaaa1111-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbb2222-0000-0000-0000-000000000000"
GPU_A, GPU_B = f"nvml:{UUID_A}", f"nvml:{UUID_B}"
H200 = make_host("h200-box", gpus=(f"NVIDIA H200 ({UUID_B})",))
WHOLE: dict[str, object] = {"in_scope": [GPU_B], "out_of_scope": [GPU_A], "missing": {}}
PARTIAL: dict[str, object] = {
    "in_scope": [GPU_A, GPU_B],
    "out_of_scope": [],
    "missing": {GPU_A: "permission"},
}


def ipw(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "240"})
    return result.exit_code, result.output, result.exception


def row(table: str, field: str) -> str:
    """A row of a two-column Rich table, as `field │ value` without the borders."""
    line = next(line for line in table.splitlines() if line.strip("│ ").startswith(f"{field} "))
    return " ".join(line.strip("│ ").split())


def printed(result: MeasureResult) -> str:
    out = io.StringIO()
    print_summary(result, Console(file=out, width=240), as_json=False)
    return out.getvalue()


@pytest.fixture
def two_gpus_one_refusing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A fake NVML with two GPUs, the first refusing its counter; no RAPL zones."""
    refusing = FakeGpu(UUID_A, energy_error=fake_nvml.NVML_ERROR_NO_PERMISSION)
    install_fake_nvml(monkeypatch, [refusing, FakeGpu(UUID_B)])
    (tmp_path / "sys" / "class" / "powercap").mkdir(parents=True)
    monkeypatch.setenv(rapl.SYSFS_ROOT_ENV, str(tmp_path / "sys"))


def test_the_llama_cpp_engine_on_the_cpu_runs_on_no_gpu() -> None:
    engine = LlamaCppEngine(embedded_default().path)
    try:
        assert engine.devices == ()
    finally:
        engine.close()
    assert _ggml_gpu_count() == 0  # this build's device list, read through ggml's own library


@pytest.mark.usefixtures("two_gpus_one_refusing")
def test_measure_meters_the_engines_gpus_and_says_when_the_scope_is_partial(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "runs.db")
    config = RunConfig(suite=SuiteConfig(limit=1), idle_seconds=0, scope="accelerator")
    # The llama.cpp engine on the CPU uses no GPU: both are out of scope, so the accelerator
    # scope holds nothing and the run is refused before it starts (no row written).
    with pytest.raises(UserError) as refused:
        run_measure(prepare(config), db)
    assert f"out of scope: {GPU_A}, {GPU_B}" in str(refused.value)
    assert "--scope system" in str(refused.value) and "--gpus all" in str(refused.value)
    assert not (tmp_path / "runs.db").exists()  # refused before the database was created

    # --gpus all takes both in, and the first cannot be read: the scope is partial.
    every = run_measure(prepare(replace(config, gpus="all")), db)
    assert every.energy_coverage == PARTIAL
    text = printed(every)
    assert f"scope accelerator (partial: {GPU_A} permission)" in text
    assert "counter · accelerator (partial)" in text
    assert "out of scope" not in text
    assert summary_dict(every)["energy_coverage"] == PARTIAL  # --json carries it too

    with open_store(db) as store:
        stored = store.get_run(every.run_id)
    assert stored.energy_coverage == PARTIAL
    assert stored.config is not None and stored.config["gpus"] == "all"  # --resume: the same

    code, output, error = ipw("show", every.run_id, "--db", db)
    assert code == 0, error
    assert f"scope accelerator (partial: {GPU_A} permission)" in output
    assert f"{GPU_A} (permission)" in row(output, "missing")
    assert row(output, "out of scope").endswith("none")


def test_show_says_when_a_run_predates_coverage(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    with open_store(db) as store:
        run_id = add_run(store, H200, tasks=3)
    code, output, error = ipw("show", run_id, "--db", db)
    assert code == 0, error
    assert "not recorded (the run predates energy coverage)" in output


def test_compare_refuses_a_partial_run_beside_a_whole_one_unless_allowed(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    with open_store(db) as store:
        whole = add_run(store, H200, scope="accelerator", tasks=8, coverage=WHOLE)
        partial = add_run(store, H200, scope="accelerator", tasks=8, seed=1, coverage=PARTIAL)
        also_whole = add_run(store, H200, scope="accelerator", tasks=8, seed=2, coverage=WHOLE)
    code, _, error = ipw("compare", whole, partial, "--db", db)
    assert isinstance(error, UserError)
    assert f"{partial[:8]}: accelerator (partial: {GPU_A} permission)" in str(error)
    assert "--allow-mixed-scope" in str(error)

    code, output, error = ipw("compare", whole, partial, "--db", db, "--allow-mixed-scope")
    assert code == 0, error
    assert "counter · accelerator (partial)" in output
    assert "could not read a source in their scope" in output
    code, output, error = ipw(
        "compare", whole, partial, "--db", db, "--json", "--allow-mixed-scope"
    )
    assert code == 0, error
    (comparison,) = json.loads(output)["comparisons"]
    assert comparison["mixed_scope"] is True

    code, output, error = ipw("compare", whole, also_whole, "--db", db)
    assert code == 0, error
    assert "partial" not in output


def test_the_report_marks_partial_runs_and_ranks_them_apart(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    with open_store(db) as store:
        whole = add_run(store, H200, scope="accelerator", tasks=6, coverage=WHOLE)
        partial = add_run(store, H200, scope="accelerator", tasks=6, seed=1, coverage=PARTIAL)
        runs = {run.id: run for run in store.list_runs()}
    assert energy_label(runs[partial]) == "counter · accelerator (partial)"
    assert energy_label(runs[whole]) == "counter · accelerator"
    assert set(frontiers(list(runs.values()))) == {
        "accelerator scope, measured",
        "accelerator scope (partial), measured",
    }
    out = tmp_path / "report"
    code, _, error = ipw("report", "--db", db, "--out", str(out))
    assert code == 0, error
    markdown = (out / "report.md").read_text()
    # The run's rows (the configuration table comes first, then the figures): its energy
    # label is in the figures' row.
    partial_rows = [line for line in markdown.splitlines() if line.startswith(f"| {partial[:8]}")]
    assert any("| counter · accelerator (partial) |" in line for line in partial_rows)
    assert "1 run(s) have a partial energy scope, marked '(partial)'" in markdown
    assert f"({partial[:8]}: {GPU_A})" in markdown
    assert "accelerator (partial)</td>" in (out / "report.html").read_text()
    rows = (out / "runs.csv").read_text()
    assert "energy_partial" in rows.splitlines()[0]

"""The summary `ipw measure` prints: what a newcomer reads when nothing passed."""

import io

import pytest
from rich.console import Console

from openjarvis.cli.output import stdout_console
from openjarvis.cli.summary import print_summary
from openjarvis.evals.runner import MeasureResult
from openjarvis.metrics import TaskFigures, compute_figures

__all__: list[str] = []


def _result(passed: int, model_kind: str | None) -> MeasureResult:
    tasks = [TaskFigures(1, int(i < passed), 2.0, 10.0, 4.0, 20) for i in range(20)]
    return MeasureResult(
        run_id="3f2a9c1e-0000",
        model_name="gemma-3-270m-Q4_K_M",
        figures=compute_figures(tasks),
        energy_scope="system",
        energy_method="counter",
        energy_note=None,
        sandbox_isolation="bubblewrap",
        sandbox_note="tests ran in bubblewrap",
        model_kind=model_kind,
    )


def _printed(result: MeasureResult) -> str:
    out = io.StringIO()
    print_summary(result, Console(file=out, width=200), as_json=False)
    return out.getvalue()


def test_zero_passes_on_a_base_model_says_what_it_means_and_what_to_try() -> None:
    printed = " ".join(_printed(_result(0, "base")).split())
    assert "0 of 20 passed: gemma-3-270m-Q4_K_M is a base model" in printed
    assert "accuracy per joule is 0 because accuracy is; the energy figures still hold" in printed
    assert "--suite arithmetic" in printed and "jarvis models" in printed
    # The interval of 0 of 20 is no [0, 0].
    assert "0 [0, 0.161]" in printed


def test_no_hint_where_something_passed_or_the_model_is_tuned() -> None:
    assert "is a base model" not in _printed(_result(3, "base"))
    assert "is a base model" not in _printed(_result(0, "chat"))
    assert "is a base model" not in _printed(_result(0, None))


def test_piped_the_summary_keeps_whole_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped (no terminal, no COLUMNS), the console `ipw measure` prints to keeps each line
    whole; a plain Console would cut them at 80 columns."""
    monkeypatch.delenv("COLUMNS", raising=False)
    print_summary(_result(0, "base"), stdout_console(), as_json=False)
    lines = capsys.readouterr().out.splitlines()
    hint = next(line for line in lines if line.startswith("0 of 20 passed"))
    assert hint.endswith("(--model PATH.gguf; `jarvis models` lists those on this machine).")

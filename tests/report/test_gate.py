"""The comparability gate on hand-made runs: shared tasks, mixed scopes and methods, a run left
out for having too few tasks, the verdict and what limits it, Wilson intervals and the stated
band of an estimate, all worked out by hand."""

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from openjarvis.intervals import small_n_caution
from openjarvis.intervals import wilson as wilson_interval
from openjarvis.metrics import compute_figures, task_figures
from openjarvis.report.analysis import panels
from openjarvis.report.content import accuracy_text, gate_blocks, headline_block
from openjarvis.report.drawing import row_labels
from openjarvis.report.gate import gate, headline, section_frontier, shared_figures, verdict
from openjarvis.report.plot import Point
from openjarvis.report.plots import point_names
from openjarvis.report.runs import distinct_labels, is_cloud, suite_name, suite_titles
from openjarvis.report.uncertainty import run_figure_text
from openjarvis.store import RunRecord, TaskResultRecord, open_store
from tests.report.test_routing import make_task
from tests.synthetic import add_run, make_host

__all__: list[str] = []

H200 = make_host("box", gpus=("NVIDIA H200 (GPU-aaaa)",))
LAPTOP = make_host("laptop")
PARTIAL = {"in_scope": ["nvml:GPU-aaaa"], "missing": {"nvml:GPU-bbbb": "permission"}}


def run(
    run_id: str,
    model: str,
    engine: str = "torch",
    scope: str = "accelerator",
    method: str = "counter",
    **fields: Any,
) -> RunRecord:
    made = RunRecord(
        model_name=model,
        model_path=None,
        model_sha256=None,
        engine=engine,
        engine_settings={"dtype": "bfloat16"} if engine == "torch" else {},
        suite="humaneval",
        options={},
        energy_scope=scope,
        energy_method=method,
        sandbox_isolation="bubblewrap",
        tool_version="0.1.0",
        state="complete",
        id=run_id,
        host=H200,
    )
    return replace(made, **fields)


def tasks(count: int, passing: int, energy_j: float) -> list[TaskResultRecord]:
    """Tasks t0..t(count-1), the first `passing` of them passed, each drawing `energy_j`."""
    return [make_task(i, i < passing, energy_j) for i in range(count)]


RUNS = [
    run("a", "big"),  # t0..t9, t0..t4 pass, 100 J
    run("b", "small", engine="llamacpp", model_quantisation="Q4_K_M"),  # t0..t4, t0 t1, 50 J
    run("c", "small", engine="llamacpp", scope="system", method="estimate", host=LAPTOP),
    run("d", "tiny"),  # t0, t1 only: would cut the section's 5 shared tasks to 2
    run("e", "big", energy_coverage=PARTIAL),  # a partial scope: its own section
]
TASKS = {
    "a": tasks(10, 5, 100.0),
    "b": tasks(5, 2, 50.0),
    "c": tasks(10, 0, 30.0),
    "d": tasks(2, 2, 10.0),
    "e": tasks(10, 5, 90.0),
}


def test_sections_keep_scopes_and_methods_apart_on_shared_tasks() -> None:
    sections = gate(RUNS, TASKS)
    assert [section.title for section in sections] == [
        "humaneval · accelerator scope · measured energy · n = 5",
        "humaneval · accelerator (partial) scope · measured energy · n = 10",
        "humaneval · system scope · estimated energy · n = 10",
    ]
    measured = sections[0]
    # On t0..t4: a passes 5/5 at 100 J (10 passes per kJ), b 2/5 at 50 J (8): a leads.
    assert [entry.run.id for entry in measured.entries] == ["a", "b"]
    a, b = measured.entries
    assert (a.passed, a.trials, b.passed, b.trials) == (5, 5, 2, 5)
    assert a.figures.tasks == b.figures.tasks == 5
    assert a.figures.accuracy_per_joule.value == pytest.approx(5 / 5 / 100)
    assert b.figures.accuracy_per_joule.value == pytest.approx(2 / 5 / 50)
    # d would cut the 5 shared tasks to 2, under half: left out, and said so.
    assert [(r.id, why) for r, why in measured.left_out] == [
        ("d", "ran 2 of the 5 tasks the others share")
    ]
    # a dominates b? No: b uses less energy, a is more accurate: both are on the frontier.
    assert [entry.run.id for entry in section_frontier(measured)] == ["b", "a"]
    # One run alone makes no frontier.
    assert section_frontier(sections[1]) == [] and section_frontier(sections[2]) == []


def test_two_runs_alone_share_whatever_tasks_they_have() -> None:
    """With only two runs the rule that keeps a section from shrinking does not apply: they are
    compared on the tasks both ran, however few."""
    (section,) = gate([RUNS[0], RUNS[3]], TASKS)
    assert section.task_ids == ("t0", "t1") and not section.left_out


def test_the_verdict_names_its_ratio_counts_and_limits() -> None:
    head = headline(gate(RUNS, TASKS))
    (within,) = head.within
    assert within.like_for_like and within.figure == "accuracy_per_joule"
    # 10 / 8 passes per kJ; every task of a run draws the same energy, so the paired bootstrap
    # only resamples b's passes: the interval is wide and holds 1.
    assert within.ratio.value == pytest.approx(1.25)
    assert (within.passed, within.samples) == ((5, 2), (5, 5))
    sentence = within.sentence()
    # Some resamples of b pass nothing, where a / b has no bound: the interval says so.
    # a and e are both big · H200 · torch: their labels add what tells them apart (e's scope).
    assert sentence.startswith(
        "big · H200 · torch · counter · accelerator does 1.2x [0.62, no upper bound]"
    )
    assert not within.resolved and "(not resolved: the interval includes 1)" in sentence
    assert "the passes per kJ of small Q4_K_M · H200 · llamacpp on the 5 tasks both ran" in sentence
    assert "(5/5 against 2/5 passed)" in sentence
    assert within.limits[:3] == (
        "small n, 5 tasks (5 of 5 passed: 57% to 100% at 95 %; 2 of 5 passed: 12% to 77% at "
        "95 %); read differences as tentative",
        "engines differ (torch vs llamacpp)",
        "precision differs (bfloat16 vs Q4_K_M)",
    )
    # The other sections' leaders against a, labelled not like for like.
    partial, estimated = head.across
    assert not partial.like_for_like and not estimated.like_for_like
    # e: 5/10 at 90 J against a's 5/10 at 100 J on the same ten tasks: e leads, 100/90.
    assert partial.best.run.id == "e" and partial.ratio.value == pytest.approx(100 / 90)
    assert any("energy scopes differ" in limit for limit in partial.limits)
    # c passes nothing: no ratio of passes per kJ, said in words.
    assert estimated.best.run.id == "a" and estimated.ratio.value is None
    assert "passes 5/10 and small · EPYC 7B13 (2 cores) · llamacpp none" in estimated.sentence()
    assert any("estimate (stated band x0.5 to x1.5" in limit for limit in estimated.limits)
    block = headline_block(head)
    assert block.id == "headline" and block.lines[0].text == sentence
    assert block.lines[1].limit and block.lines[1].text.startswith("What limits this: small n")


def test_wilson_intervals_and_the_estimate_band_by_hand() -> None:
    z = 1.959964
    # 0 of n: the interval is [0, (z²/n) / (1 + z²/n)]; 0 of 10 -> [0, 0.2775], never [0, 0].
    assert wilson_interval(0, 10) == (0.0, pytest.approx((z * z / 10) / (1 + z * z / 10)))
    zero_of_five = wilson_interval(0, 5)
    assert zero_of_five is not None and zero_of_five[1] == pytest.approx(0.4345, abs=1e-4)
    # 5 of 10: centre 0.5, half-width z * sqrt(0.025 + z²/400) / (1 + z²/10).
    half = z * (0.25 / 10 + z * z / 400) ** 0.5 / (1 + z * z / 10)
    assert wilson_interval(5, 10) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    for n in range(1, 300):  # the interval always holds the rate, 1 of 1 included
        all_pass, none_pass = wilson_interval(n, n), wilson_interval(0, n)
        assert all_pass is not None and none_pass is not None
        assert all_pass[1] == 1.0 and none_pass[0] == 0.0
    assert wilson_interval(0, 0) is None
    estimated = gate(RUNS, TASKS)[2].entries[0]
    assert accuracy_text(estimated) == "0/10 = 0% [0%, 28%]"
    # All of c's 30 J per task is estimated (no readings): the CPU band x0.5 to x1.5.
    assert estimated.energy_band_j() == (pytest.approx(15.0), pytest.approx(45.0))
    rows = {block.id: block for block in gate_blocks(gate(RUNS, TASKS))}
    # c is alone in its section: a row of the one table of such sections, not a block.
    assert "section-humaneval-system-estimated" not in rows
    (table,) = rows["sections-of-one-run"].tables
    (row,) = [row for row in table.rows if row[0].startswith("humaneval · system scope")]
    assert row[-2:] == ("30 [30, 30] est. (band 15 to 45)", "0 (none passed)")


def test_small_n_is_said_below_thirty_tasks_with_the_counts_that_passed() -> None:
    """Not a made-up 'half of them passing': 0 of 3 says 0 of 3."""
    assert small_n_caution(30, [(15, 30)]) is None
    assert small_n_caution(3, [(0, 3)]) == (
        "small n, 3 tasks (0 of 3 passed: 0% to 56% at 95 %); read differences as tentative"
    )


def test_figures_on_all_of_a_runs_tasks_are_those_it_stored(tmp_path: Path) -> None:
    """The stored summary stands in for a recomputation only where it covers the same tasks:
    the numbers are the same (same tasks, same seed); on a subset they are computed."""
    with open_store(str(tmp_path / "ipw.db")) as store:
        run_id = add_run(store, H200, tasks=12, seed=5)
        stored, saved = store.get_run(run_id), store.task_results(run_id)
    computed = compute_figures([task_figures(t) for t in saved])
    whole = shared_figures(stored, saved)
    assert whole.accuracy == computed.accuracy
    assert whole.mean_energy_j == computed.mean_energy_j
    assert whole.accuracy_per_joule == computed.accuracy_per_joule
    subset = shared_figures(stored, saved[:5])
    assert subset.tasks == 5
    assert (
        subset.mean_energy_j == compute_figures([task_figures(t) for t in saved[:5]]).mean_energy_j
    )


def test_a_lead_smaller_than_the_estimates_band_is_said_to_be_able_to_vanish() -> None:
    """f (estimated, 2/5 at 45 J) against b (measured, 2/5 at 50 J): f leads by 50/45, but at
    the top of f's band (x1.5) its lead becomes (50/45)/1.5 = 0.74."""
    estimated = run("f", "small", engine="llamacpp", method="estimate", model_quantisation="Q4_K_M")
    sections = gate([RUNS[1], estimated], {"b": TASKS["b"], "f": tasks(5, 2, 45.0)})
    found = verdict(sections[0].entries[0], sections[1].entries[0], like_for_like=False)
    assert found is not None and found.best.run.id == "f"
    assert found.ratio.value == pytest.approx(50 / 45)
    assert found.limits[-1] == (
        "within the estimates' stated bands the lead could vanish (down to 0.74x)"
    )


def test_an_unknown_energy_gives_no_ratio_and_says_why() -> None:
    unknown = [replace(t, energy_j=None, net_energy_j=None) for t in TASKS["b"]]
    sections = gate(RUNS[:2], {"a": TASKS["a"], "b": unknown})
    (found,) = headline(sections).within
    assert found.ratio.value is None and found.ratio.null_reason == "energy-unknown"
    assert found.sentence().endswith(
        "cannot be compared on energy (energy-unknown) over the 5 tasks both ran."
    )


def test_the_runs_table_shows_0_of_5_with_its_wilson_interval_not_0_0() -> None:
    zero = {"value": 0.0, "low": 0.0, "high": 0.0, "null_reason": None}
    summary = {"tasks": 5, "samples": 1, "accuracy": zero, "accuracy_per_joule": zero}
    estimated = run("z", "small", engine="llamacpp", method="estimate", summary=summary)
    assert run_figure_text(estimated, "accuracy") == "0/5 = 0% [0%, 43%]"
    assert run_figure_text(estimated, "accuracy_per_joule", 1000.0) == "0 (none passed) est."
    # Unequal samples per task: the rate is no count over trials, so the bootstrap stays.
    uneven = {**summary, "accuracy": {"value": 0.3125, "low": 0.1, "high": 0.5}, "samples": 2}
    assert run_figure_text(replace(estimated, summary=uneven), "accuracy") == "0.312 [0.1, 0.5]"


def test_a_verdict_on_a_busy_machine_says_so_and_resolves_nothing() -> None:
    """x does 10x the passes per kJ of y on 40 tasks, an interval far from 1; but y was measured
    while another program kept a core busy, so the ratio is not taken as resolved."""
    evidence = "other processes kept 0.98 cores busy during the tasks (29.4 CPU-s over 30.0 s)"
    busy = {"machine": {"busy": True, "evidence": [evidence], "stretches": []}}
    quiet_run, busy_run = run("x", "big"), run("y", "small", summary=busy)
    found_tasks = {"x": tasks(40, 20, 10.0), "y": tasks(40, 20, 100.0)}
    (section,) = gate([quiet_run, busy_run], found_tasks)
    found = verdict(section.entries[0], section.entries[1], like_for_like=True)
    assert found is not None and found.ratio.low is not None and found.ratio.low > 5
    assert found.busy and not found.resolved
    assert found.sentence().endswith("(not resolved: measured on a busy machine).")
    assert f"small · H200 · torch was measured on a busy machine ({evidence})" in found.limits
    # The same runs on a quiet machine: resolved.
    calm = verdict(
        replace(section.entries[0]),
        replace(section.entries[1], run=replace(busy_run, summary=None)),
        like_for_like=True,
    )
    assert calm is not None and calm.resolved and not calm.busy


def test_labels_tell_apart_runs_that_differ_only_in_suite_or_nothing_at_all() -> None:
    first, second = run("p1", "gemma"), run("p2", "gemma", suite="arithmetic")
    third = run("p3", "gemma")  # the same as p1 in every label part
    labels = distinct_labels([first, second, third])
    assert labels["p2"] == "gemma · H200 · torch · arithmetic"
    assert labels["p1"] == "gemma · H200 · torch · humaneval · run p1"
    assert labels["p3"] == "gemma · H200 · torch · humaneval · run p3"
    assert len(set(labels.values())) == 3
    # A suite stored with its options and include path is titled by its name alone.
    old = run("p4", "gemma", suite="lm-eval:tiny_gen?limit=3&num_fewshot=0&include=/tmp/x")
    assert suite_name(old) == "lm-eval:tiny_gen"
    assert suite_name(run("p5", "gemma", suite="/home/me/suites/good.jsonl")) == "good.jsonl"


def test_sections_of_one_run_are_one_line_and_one_table_not_drawn() -> None:
    """Two of the three sections hold one run: the verdict says so once (not once per
    section), they share one table, and only the section of two runs is drawn."""
    sections = gate(RUNS, TASKS)
    block = headline_block(headline(sections))
    alone = [line.text for line in block.lines if "hold one run each" in line.text]
    assert alone == [
        "2 of 3 sections hold one run each, with nothing of their suite, scope and method "
        "class to compare it with: listed below, not drawn."
    ]
    assert not any("nothing in its scope" in line.text for line in block.lines)
    assert [panel.title for panel in panels(sections)] == [sections[0].title]


def test_points_on_a_panel_are_named_apart() -> None:
    """Two runs of one model at one and four at once were both annotated `gemma`."""

    def point(label: str) -> Point:
        return Point(label, "Xeon", 10.0, None, None, 0.0, 0.0, 0.3, True, False)

    one = point("gemma · Xeon (2 cores) · llamacpp")
    four = point("gemma · Xeon (2 cores) · llamacpp · 4 at once")
    other = point("qwen · Xeon (2 cores) · llamacpp")
    assert point_names([one, four]) == ["gemma", "gemma · 4 at once"]
    assert point_names([one, other]) == ["gemma", "qwen"]
    assert point_names([one]) == ["gemma · Xeon (2 cores) · llamacpp"]


def test_plot_rows_of_two_hosts_with_the_same_hardware_are_told_apart() -> None:
    """Two boxes with the same GPU and model read alike by `model · hardware · engine`."""
    first = run("r1aaaaaa", "gemma", summary={"tasks": 5})
    second = run("r2bbbbbb", "gemma", host=make_host("other-box", gpus=("NVIDIA H200 (GPU-b)",)))
    second = replace(second, summary={"tasks": 5})
    labels = row_labels([first, second])
    assert len(set(labels)) == 2
    assert "run r1aaaaaa" in labels[0] and "run r2bbbbbb" in labels[1]


def test_one_suite_name_over_other_tasks_is_another_section() -> None:
    """Two files named good.jsonl with other tasks (or one edited between runs) are two suites:
    their runs get sections of their own, titled with the start of each content hash; runs of
    one content through two paths stay one section."""
    here = run("q1", "gemma", suite="suites/good.jsonl", suite_sha256="aa" * 32)
    there = run("q2", "small", suite="./good.jsonl", suite_sha256="aa" * 32)
    edited = run("q3", "tiny", suite="good.jsonl", suite_sha256="bb" * 32)
    runs = [here, there, edited]
    found = gate(runs, {r.id or "": tasks(4, 2, 10.0) for r in runs})
    titles = sorted((section.suite, len(section.entries)) for section in found)
    assert titles == [("good.jsonl (aaaaaaaa)", 2), ("good.jsonl (bbbbbbbb)", 1)]
    assert suite_titles([here, there]) == {"q1": "good.jsonl", "q2": "good.jsonl"}


def test_a_server_on_this_machine_metered_here_is_local_not_cloud() -> None:
    served = run("s1", "gemma", engine="openai", engine_settings={"meter": "local"})
    remote = run("s2", "gpt-4o", engine="openai", engine_settings={"meter": "estimate"})
    assert not is_cloud(served) and is_cloud(remote) and not is_cloud(run("s3", "gemma"))

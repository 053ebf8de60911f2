"""The one-row decode kernels (runtime/torch/one_row.py) inside the engine: where they run, and
on a GPU the tokens they pick against the step they replace."""

import os
import re

import pytest

pytest.importorskip("torch")

import torch

from openjarvis.runtime.torch.config import TimedChoice
from openjarvis.runtime.torch.core import EngineCore
from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings


@pytest.mark.parametrize(
    ("asked", "state"),
    [("auto", "off: not on a GPU"), ("on", "off: not on a GPU"), ("off", "off: not asked for")],
)
def test_off_the_gpu_the_engine_says_the_kernels_are_off(asked: TimedChoice, state: str) -> None:
    settings = TorchSettings(device="cpu", max_seq_len=64, one_row_kernel=asked)
    engine = TorchEngine("tiny-llama", settings)
    try:
        assert engine.settings_dict()["one_row_kernel_state"] == state
    finally:
        engine.close()


def test_a_model_the_kernel_does_not_take_is_named_with_the_reason() -> None:
    pytest.importorskip("triton")
    from openjarvis.runtime.torch.model import Transformer, config_for
    from openjarvis.runtime.torch.one_row import supported

    def reason(preset: str) -> str | None:
        with torch.device("meta"):
            return supported(Transformer(config_for(preset)))

    assert reason("tiny-tp") == "a q/k/v bias"
    assert reason("llama-3-70b") == "a shape the kernel's tiles do not fit"  # rows of 28,672
    assert reason("gemma-3-270m") is None
    assert reason("llama-3.2-1b") is None
    assert reason("llama-3-8b") is None


def test_pdl_is_used_only_where_triton_and_the_gpu_have_it() -> None:
    """Programmatic dependent launch compiles to PTX that GPUs before Hopper lack: there the
    kernel runs without it (an A100 or an RTX 4090 keeps the kernel), and the state says why."""
    from openjarvis.runtime.torch.runner import pdl_choice

    assert pdl_choice(True, True, (9, 0)) == (True, ", PDL")
    assert pdl_choice(True, True, (10, 0)) == (True, ", PDL")
    assert pdl_choice(True, True, (8, 9)) == (
        False,
        ", no PDL (sm_89: it needs compute capability 9.0 or later)",
    )
    assert pdl_choice(True, False, (9, 0)) == (
        False,
        ", no PDL (this Triton has no grid dependency controls)",
    )
    assert pdl_choice(False, True, (9, 0)) == (False, "")


def _logits(
    preset: str, one_row: bool, tokens: list[int], prompt: int, pdl: bool = False
) -> "torch.Tensor":
    """Float32 logits [steps, vocab]: the prompt's prefill, then one-row decode steps of the
    same tokens (teacher-forced: both runs see the same inputs whatever they would pick)."""
    from openjarvis.runtime.torch.paged import BLOCK_SIZE, slots_of
    from openjarvis.runtime.torch.step_inputs import StepInputs

    settings = TorchSettings(
        device="cuda", max_seq_len=128, seed=5, concurrency=4, compile=False,
        one_row_kernel="on" if one_row else "off", one_row_pdl=pdl,
        engine_process=False,  # the runner in this process
    )  # fmt: skip
    engine = TorchEngine(preset, settings)
    try:
        state = str(engine.settings_dict()["one_row_kernel_state"])
        assert state.startswith("on" if one_row else "off"), state
        assert state.endswith(", PDL") == pdl, state
        core = engine._core
        assert isinstance(core, EngineCore)  # engine_process=False
        runner = core.runner
        table = torch.arange(1, runner.table_width + 1, dtype=torch.int32).view(1, -1)
        positions = torch.arange(len(tokens)).view(1, -1)
        slots = slots_of(table, positions, BLOCK_SIZE)
        ids = torch.tensor(tokens).view(1, -1)

        def step(decode: bool, start: int, end: int) -> "torch.Tensor":
            where = slice(start, end)
            inputs = StepInputs(
                decode, True, ids[:, where], positions[:, where], slots[:, where], table
            )
            return runner.run(inputs).float().cpu()

        rows = [step(False, 0, prompt)]
        rows += [step(True, p, p + 1) for p in range(prompt, len(tokens))]
        return torch.cat(rows)
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-qwen3", "tiny-llama"])
@pytest.mark.parametrize("prompt", [1, 30])
def test_one_row_kernels_give_the_logits_of_the_step_they_replace(preset: str, prompt: int) -> None:
    """One sequence, every decode step one row, to 100 positions: past the sliding window and
    across several cache blocks. bf16 both ways, rounded and summed in other orders through
    the layers: the logits agree within a few of bf16's steps (0.2 at most of ~26,000 in the
    first GPU run, 0.4 % of them past 0.05), and so does the greedy pick wherever the top two
    are further apart than that."""
    tokens = [(7 * i + 3) % 250 for i in range(100)]
    on, off = _logits(preset, True, tokens, prompt), _logits(preset, False, tokens, prompt)
    torch.testing.assert_close(on, off, atol=0.25, rtol=5e-2)
    top2 = off.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.25
    assert clear.sum() >= 10, "steps with a clear pick (or the test says little)"
    assert torch.equal(on.argmax(-1)[clear], off.argmax(-1)[clear])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_launches_that_start_early_give_the_same_logits() -> None:
    """Programmatic dependent launch (`one_row_pdl`) inside the engine's CUDA graph: each launch
    waits for the one before before it reads, so the logits are the plain launches' exactly."""
    from openjarvis.kernels.decode_layer import gdc_wait

    if gdc_wait is None:
        pytest.skip("this Triton has no grid dependency controls")
    tokens = [(7 * i + 3) % 250 for i in range(60)]
    early = _logits("tiny-gemma3", True, tokens, 20, pdl=True)
    torch.testing.assert_close(early, _logits("tiny-gemma3", True, tokens, 20), atol=0, rtol=0)


def _state_after_start(preset: str) -> str:
    """The one-row state of an engine started on the GPU (the step patched by the caller),
    after checking that its decode steps run (the compiled step, where the kernels are off)
    and that a one-row graph is there exactly when the kernels are on."""
    settings = TorchSettings(
        device="cuda", max_seq_len=128, seed=5, concurrency=2, compile=False,
        engine_process=False,
    )  # fmt: skip
    engine = TorchEngine(preset, settings)
    try:
        assert len(list(engine.generate_tokens([5, 6, 7], 4))) == 4
        state = str(engine.settings_dict()["one_row_kernel_state"])
        core = engine._core
        assert isinstance(core, EngineCore)  # engine_process=False
        timed_off = state.startswith("off: slower")
        assert (1 in core.runner.graphs) == (not timed_off), (state, sorted(core.runner.graphs))
        return state
    finally:
        engine.close()


_TIMED = r"(\d+\.\d{3}) ms a step against (\d+\.\d{3}) ms"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_auto_keeps_the_kernels_only_where_their_step_replays_faster() -> None:
    """ "auto" (the default) times the kernels' one-row graph against the compiled step's
    two-row graph at start; the state gives both times and keeps the faster."""
    state = _state_after_start("tiny-gemma3")
    timed = re.search(_TIMED, state)
    assert timed is not None, state
    kernel_ms, compiled_ms = (float(group) for group in timed.groups())
    if kernel_ms != compiled_ms:  # equal as printed: either may have won
        assert state.startswith("on" if kernel_ms < compiled_ms else "off: slower"), state


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_kernels_slower_than_the_compiled_step_leave_it_the_one_row_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernels' step made slower (a spin of ~5 ms captured in its graph) loses to the
    compiled step: the one-row graph goes and one-row steps run in the two-row graph."""
    from openjarvis.runtime.torch import one_row

    real = one_row.OneRowStep.__call__

    def slowed(self: one_row.OneRowStep, *inputs: "torch.Tensor") -> "torch.Tensor":
        torch.cuda._sleep(10_000_000)  # cycles: milliseconds at any clock
        return real(self, *inputs)

    monkeypatch.setattr(one_row.OneRowStep, "__call__", slowed)
    state = _state_after_start("tiny-llama")
    assert state.startswith("off: slower than the compiled step at two rows ("), state
    timed = re.search(_TIMED, state)
    assert timed is not None and float(timed[1]) > 2.0 > float(timed[2]), state


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_kernels_that_fail_to_start_leave_the_compiled_step_and_say_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from openjarvis.runtime.torch import one_row

    def fails(*_: object) -> None:
        raise RuntimeError("no such kernel\nmore lines")

    monkeypatch.setattr(one_row.OneRowStep, "__call__", fails)
    state = _state_after_start("tiny-llama")
    assert state == "off: its kernels failed to start (RuntimeError: no such kernel)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_kernels_whose_output_differs_from_the_model_s_leave_the_compiled_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start-up step is checked against the model's own: kernels that run but compute
    something else (a miscompile, a bug) are not used; the state gives the difference."""
    from openjarvis.runtime.torch import one_row

    real = one_row.OneRowStep.__call__

    def off_by_a_tenth(self: one_row.OneRowStep, *inputs: "torch.Tensor") -> "torch.Tensor":
        return real(self, *inputs) * 1.1

    monkeypatch.setattr(one_row.OneRowStep, "__call__", off_by_a_tenth)
    state = _state_after_start("tiny-gemma3")
    assert state.startswith("off: its output differs from the model's step (0.1"), state


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the kernels on the CPU: TRITON_INTERPRET=1"
)
def test_the_start_up_check_measures_the_kernels_against_the_model_s_step() -> None:
    """The runner's check on the CPU (the kernels interpreted, float32): the kernels' step is
    within rounding of the model's at the 100th position, and one 10 % off is seen as such."""
    from openjarvis.runtime.torch.one_row import OneRowStep

    settings = TorchSettings(
        device="cpu", dtype="float32", max_seq_len=128, seed=5, concurrency=2,
        engine_process=False,
    )  # fmt: skip
    engine = TorchEngine("tiny-gemma3", settings)
    try:
        core = engine._core
        assert isinstance(core, EngineCore)  # engine_process=False
        runner = core.runner
        step = OneRowStep(runner.model, programs=5)
        with torch.inference_mode():
            assert runner._one_row_difference(step) < 1e-5

            class Off(OneRowStep):
                def __call__(self, *inputs: "torch.Tensor") -> "torch.Tensor":
                    return super().__call__(*inputs) * 1.1

            off = runner._one_row_difference(Off(runner.model, programs=5))
        assert off == pytest.approx(0.1, abs=1e-4)
    finally:
        engine.close()


@pytest.mark.parametrize(("kernel_us", "kept"), [(300.0, True), (700.0, False)])
def test_auto_s_choice_follows_the_two_graphs_replay_times(
    monkeypatch: pytest.MonkeyPatch, kernel_us: float, kept: bool
) -> None:
    """The runner's choice itself, on the CPU: graphs that only count their replays stand in
    for the CUDA graphs, and CUDA events' timing gives each graph's own time a replay (the
    compiled two-row graph 500 us). Both take turns over the timed context, which is undone
    after; the loser goes, with bucket 1 where it is the kernels'."""
    from functools import partial

    from openjarvis.kernels import all_reduce
    from openjarvis.runtime.torch.step_inputs import StepInputs

    class Graph:
        def __init__(self, us: float) -> None:
            self.us, self.replays = us, 0
            self.positions_seen: set[int] = set()

        def replay(self) -> None:
            self.replays += 1
            self.positions_seen.add(int(static.positions[0, 0]))

    def timed_us(work: "partial[None]") -> float:
        graph = work.args[0]
        before = graph.replays
        work()
        return graph.us * (graph.replays - before)

    settings = TorchSettings(device="cpu", max_seq_len=1024, engine_process=False)
    engine = TorchEngine("tiny-llama", settings)
    try:
        core = engine._core
        assert isinstance(core, EngineCore)  # engine_process=False
        runner = core.runner
        zeros = torch.zeros(4, 1, dtype=torch.long)
        static = StepInputs(True, True, zeros, zeros.clone(), zeros.clone(), zeros.int())
        kernel, compiled = Graph(kernel_us), Graph(500.0)
        monkeypatch.setattr(all_reduce, "timed_us", timed_us)
        monkeypatch.setattr(runner, "static", static, raising=False)
        monkeypatch.setattr(runner, "graphs", {1: (kernel, None), 2: (compiled, None)})
        monkeypatch.setattr(runner, "buckets", (1, 2))
        monkeypatch.setattr(runner, "one_row", object())
        note = runner._time_one_row("on: 5 programs a launch")
        assert kernel.replays == compiled.replays == 70  # 7 rounds of 10, in turns
        assert kernel.positions_seen == compiled.positions_seen == {399}
        assert int(static.positions.abs().sum()) == 0  # undone
        timing = f"{kernel_us / 1e3:.3f} ms a step against 0.500 ms"
        if kept:
            assert note == f"on: 5 programs a launch, {timing} for the compiled step at two rows"
            assert runner.one_row is not None and sorted(runner.graphs) == [1, 2]
        else:
            assert note == f"off: slower than the compiled step at two rows ({timing})"
            assert runner.one_row is None and sorted(runner.graphs) == [2]
            assert runner.buckets == (2,)
    finally:
        engine.close()

"""Prefill steps as one-sequence CUDA graphs: what can be checked without a GPU. The graph
replays the eager model on the padded step, so the padded step must give the eager step's
logits, and the scheduler must hand such an engine one sequence per prefill step."""

import pytest

pytest.importorskip("torch")

import torch

from openjarvis.runtime.torch.core import EngineCore
from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings
from openjarvis.runtime.torch.paged import BLOCK_SIZE, BlockPool
from openjarvis.runtime.torch.scheduler import Scheduler, Sequence
from openjarvis.runtime.torch.step_inputs import (
    StepInputs,
    pad_prefill,
    prefill_buckets,
    prefill_graph_key,
    prefill_widths,
)


def test_buckets_are_powers_of_two_from_16_up_to_the_budget() -> None:
    assert prefill_buckets(2048) == (16, 32, 64, 128, 256, 512, 1024, 2048)
    assert prefill_buckets(100) == (16, 32, 64, 100)
    assert prefill_buckets(16) == (16,)


def test_each_length_has_a_graph_per_table_width_from_the_blocks_it_fills() -> None:
    assert prefill_widths(16, 256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert prefill_widths(100, 256) == (8, 16, 32, 64, 128, 256)  # 100 tokens fill 7 blocks
    assert prefill_widths(2048, 256) == (128, 256)
    assert prefill_widths(16, 6) == (1, 2, 4, 6)  # the widest table need not be a power of two
    buckets = prefill_buckets(2048)
    # A short step after a long cached prefix: the smallest length, a table wide enough.
    assert prefill_graph_key(13, 72, buckets, 256) == (16, 128)
    assert prefill_graph_key(13, 1, buckets, 256) == (16, 1)
    assert prefill_graph_key(300, 19, buckets, 256) == (512, 32)  # 512 tokens fill 32 blocks
    assert prefill_graph_key(2049, 200, buckets, 256) is None


@pytest.mark.parametrize("cached", [0, 16], ids=["cold", "after-a-cached-block"])
def test_a_padded_prefill_step_gives_the_eager_steps_logits(cached: int) -> None:
    engine = TorchEngine("tiny-tp", TorchSettings(device="cpu", max_seq_len=64, seed=3))
    try:
        core = engine._core
        assert isinstance(core, EngineCore)  # in this process, the default on the CPU
        scheduler, runner = core.scheduler, core.runner
        prompt = [(5 * i + 7) % 240 for i in range(27)]
        sequence = Sequence(prompt, 4, frozenset())
        sequence.keys = []
        scheduler.waiting.append(sequence)
        step = scheduler.next_step()
        assert step is not None and step.kind == "prefill"
        if cached:  # the first block computed already: the step carries the rest
            runner.run(StepInputs.of(step, BLOCK_SIZE))
            sequence.cached = cached
            step = scheduler.next_step()
            assert step is not None and step.rows[0].start == cached
        inputs = StepInputs.of(step, BLOCK_SIZE)
        eager = runner.run(inputs)
        padded = pad_prefill(inputs, 32, runner.table_width)
        assert padded.tokens.shape == (1, 32) and padded.tables.shape == (1, runner.table_width)
        torch.testing.assert_close(runner.run(padded), eager, rtol=1e-5, atol=1e-5)
        # As narrow a table as the smallest graph that holds the step: the same logits.
        key = prefill_graph_key(27 - cached, inputs.tables.size(1), (32,), runner.table_width)
        assert key is not None and key[1] < runner.table_width
        width = key[1]
        narrow = pad_prefill(inputs, 32, width)
        assert narrow.tables.shape == (1, width)
        torch.testing.assert_close(runner.run(narrow), eager, rtol=1e-5, atol=1e-5)
        # The padding is not invisible by accident: the same step with a changed real token
        # gives other logits.
        changed = pad_prefill(
            StepInputs(
                False, True, inputs.tokens + 1, inputs.positions, inputs.slots, inputs.tables
            ),
            32,
            runner.table_width,
        )
        assert not torch.allclose(runner.run(changed), eager, atol=1e-3)
    finally:
        engine.close()


def test_one_sequence_per_prefill_step_where_prefill_replays_graphs() -> None:
    def scheduler(prefill_rows: int | None) -> Scheduler:
        made = Scheduler(BlockPool(32, 16, reuse=False), 4, 2048, 64, prefill_rows=prefill_rows)
        for first in (1, 50):
            made.add(Sequence([first, first + 1, first + 2], 4, frozenset()))
        return made

    both = scheduler(None).next_step()
    assert both is not None
    assert len(both.rows) == 2
    one = scheduler(1)
    first = one.next_step()
    assert first is not None
    one.finish_step(first, [9], 0.0, 1.0)  # the first prompt is in the cache, its token picked
    second = one.next_step()
    assert second is not None and second.kind == "prefill"
    assert [len(s.rows) for s in (first, second)] == [1, 1]
    assert first.rows[0].sequence is not second.rows[0].sequence


def _greedy_runs(settings: TorchSettings, prompts: list[list[int]]) -> list[list[int]]:
    engine = TorchEngine("tiny-tp", settings)
    try:
        runs = [[token for token, _ in engine.generate_tokens(p, 12)] for p in prompts]
        # Together too: each prefill its own step, the decode steps shared.
        streams = [engine.generate_tokens(p, 12) for p in prompts]
        runs += [[token for token, _ in stream] for stream in streams]
        return runs
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_prefill_replayed_from_graphs_picks_the_eager_tokens_on_a_gpu() -> None:
    """Prompts in several buckets (5 to 70 tokens), one after a cached prefix of two blocks."""
    prefix = [(7 * i + 3) % 240 for i in range(40)]
    prompts = [
        prefix[:5],
        prefix[:27],
        prefix,
        [*prefix, 9, 8, 7],
        [(3 * i) % 240 for i in range(70)],
    ]

    def settings(graphs: bool) -> TorchSettings:
        return TorchSettings(
            device="cuda", max_seq_len=128, seed=11, concurrency=4, compile=False,
            cuda_graphs=graphs, prefill_graphs=graphs,
        )  # fmt: skip

    assert _greedy_runs(settings(True), prompts) == _greedy_runs(settings(False), prompts)

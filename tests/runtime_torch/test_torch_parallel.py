"""Tensor parallelism on the CPU (gloo): N processes started by the engine give the logits and
the greedy tokens of one process, for world sizes 2, 3 and 4, and with the decode step
compiled (the collectives are registered operators that torch.compile traces around)."""

from collections.abc import Iterator
from typing import TypedDict, Unpack

import pytest

pytest.importorskip("torch")

import torch

from openjarvis.errors import UserError
from openjarvis.runtime.torch.config import TorchSettings
from openjarvis.runtime.torch.engine import TorchEngine
from openjarvis.runtime.torch.loading import build_model
from openjarvis.runtime.torch.model import TransformerBlock, config_for
from openjarvis.runtime.torch.parallel import tensor_parallel
from tests.runtime_torch.test_mixed_steps import joined_while_decoding

# float32: the sharded matmuls and the all-reduce add partial sums in another order than one
# process does; the difference is rounding, near 1e-7 of the logits' scale.
RELATIVE_TOLERANCE = 1e-5
PROMPT = [5, 17, 42, 99, 3, 250 % 240, 7, 64]


class _Options(TypedDict, total=False):
    """Keyword arguments of TorchEngine.generate_tokens after the prompt and the count."""

    stop_tokens: frozenset[int]
    temperature: float
    seed: int | None


def _settings(tp: int, compile: bool = False) -> TorchSettings:
    return TorchSettings(device="cpu", tp=tp, max_seq_len=64, seed=11, compile=compile)


@pytest.fixture(scope="module")
def single() -> Iterator[TorchEngine]:
    engine = TorchEngine("tiny-tp", _settings(1))
    yield engine
    engine.close()


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_tensor_parallel_equals_one_process(single: TorchEngine, world_size: int) -> None:
    expected_logits = single.logits(PROMPT)
    expected_tokens = [token for token, _ in single.generate_tokens(PROMPT, 10)]
    engine = TorchEngine("tiny-tp", _settings(world_size))
    try:
        logits = engine.logits(PROMPT)
        tokens = [token for token, _ in engine.generate_tokens(PROMPT, 10)]
    finally:
        engine.close()
    error = (logits - expected_logits).norm() / expected_logits.norm()
    assert error < RELATIVE_TOLERANCE, f"world size {world_size}: relative error {error:.2e}"
    assert tokens == expected_tokens
    assert len(set(tokens)) > 1, "random weights should not repeat one token (a weak test)"


def test_compiled_decode_with_tensor_parallelism_gives_the_same_tokens(
    single: TorchEngine,
) -> None:
    """One graph per decode step on every process (fullgraph: no break at the all-reduce or
    the logits' all-gather), and the same greedy tokens as one eager process."""
    expected = [token for token, _ in single.generate_tokens(PROMPT, 10)]
    engine = TorchEngine("tiny-tp", _settings(2, compile=True))
    try:
        tokens = [token for token, _ in engine.generate_tokens(PROMPT, 10)]
        assert engine.settings_dict()["compile"] is True
    finally:
        engine.close()
    assert tokens == expected


def test_heads_that_do_not_divide_are_refused_before_any_process_starts() -> None:
    with pytest.raises(UserError, match=r"attention heads \(24\) do not divide over 5"):
        TorchEngine("tiny-tp", _settings(5))


def test_world_size_one_pass_changes_nothing() -> None:
    config = config_for("tiny-llama")
    plain = build_model(config, seed=2)
    passed = build_model(config, seed=2, shard=tensor_parallel(0, 1, lambda x: x, lambda x: x))
    for (name, a), (_, b) in zip(
        plain.state_dict().items(), passed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    layer = passed.layers[0]
    assert isinstance(layer, TransformerBlock)
    assert layer.attention.n_heads == config.n_heads


def test_row_parallel_layer_sends_one_token_to_the_fused_product_and_more_to_the_reduce() -> None:
    from openjarvis.runtime.torch.parallel import RowParallelLinear

    calls: list[str] = []

    def reduce(x: torch.Tensor) -> torch.Tensor:
        calls.append("reduce")
        return x * 2  # stands in for the sum over two processes

    def fused(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        calls.append("fused")
        return (weight @ x.reshape(-1)) * 2

    layer = RowParallelLinear(8, 4, reduce, fused, torch.device("cpu"), torch.float32)
    one_token, prompt = torch.randn(1, 1, 8), torch.randn(1, 3, 8)
    expected_one = torch.nn.functional.linear(one_token, layer.weight) * 2
    assert torch.allclose(layer(one_token), expected_one)
    assert layer(one_token).shape == (1, 1, 4)
    assert layer(prompt).shape == (1, 3, 4)
    assert calls == ["fused", "fused", "reduce"]
    unfused = RowParallelLinear(8, 4, reduce, None, torch.device("cpu"), torch.float32)
    calls.clear()
    unfused(one_token)
    assert calls == ["reduce"]


def test_every_rank_stays_in_step_across_early_stops_stop_tokens_and_sampling(
    single: TorchEngine,
) -> None:
    """Every rank runs the steps rank 0 broadcasts: a consumer that leaves mid-decode, a stop
    token and a seeded draw must leave every rank where rank 0 is."""
    count = 35

    def tokens(engine: TorchEngine, **options: Unpack[_Options]) -> list[int]:
        return [token for token, _ in engine.generate_tokens(PROMPT, count, **options)]

    expected = tokens(single)
    sampled = tokens(single, temperature=0.8, seed=5)
    stop = frozenset({expected[20]})
    engine = TorchEngine("tiny-tp", _settings(2))
    try:
        stopped = engine.generate_tokens(PROMPT, count)
        first = [next(stopped)[0] for _ in range(3)]
        stopped.close()  # mid-decode: its sequence is dropped at the next step
        assert first == expected[:3]
        assert tokens(engine) == expected
        assert tokens(engine, temperature=0.8, seed=5) == sampled
        assert tokens(engine, stop_tokens=stop) == expected[: expected.index(min(stop)) + 1]
        assert [token for token, _ in engine.generate_tokens(PROMPT, 0)] == []
        assert [token for token, _ in engine.generate_tokens(PROMPT, 1)] == expected[:1]
    finally:
        engine.close()
    assert sampled != expected


def test_prompts_joining_a_wide_step_with_tensor_parallelism_get_one_process_s_tokens() -> None:
    """Two processes, prompts joining the decode step as rows (16 a step, 4 sequences at
    most): three prompts arrive while one sequence decodes, in a step wider than the
    concurrency whose first rows alone get logits (each rank's vocabulary shard, gathered).
    Every sequence's tokens are those of one process that prefills them alone."""
    prompts = [[40, 41, 42, 43], [50, 51], [60, 61, 62]]

    def settings(tp: int, prompt_rows: int) -> TorchSettings:
        return TorchSettings(
            device="cpu", tp=tp, max_seq_len=64, seed=11, concurrency=4,
            decode_prompt_rows=prompt_rows,
        )  # fmt: skip

    results = []
    for tp, prompt_rows in ((1, 0), (2, 16)):
        engine = TorchEngine("tiny-tp", settings(tp, prompt_rows))
        try:
            results.append(joined_while_decoding(engine, PROMPT, prompts, 6))
            counts = engine.step_counts()
        finally:
            engine.close()
    alone, parallel = results
    assert parallel == alone
    assert counts.steps["mixed"] >= 1  # the two-process engine took the prompts as rows

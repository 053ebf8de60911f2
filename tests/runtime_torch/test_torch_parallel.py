"""Tensor parallelism on the CPU (gloo): N processes started by the engine give the logits and
the greedy tokens of one process, for world sizes 2, 3 and 4, and with the decode step
compiled (the collectives are registered operators that torch.compile traces around)."""

import pytest

torch = pytest.importorskip("torch")

from openjarvis.errors import UserError  # noqa: E402
from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings  # noqa: E402
from openjarvis.runtime.torch.loading import build_model  # noqa: E402
from openjarvis.runtime.torch.model import config_for  # noqa: E402
from openjarvis.runtime.torch.parallel import tensor_parallel  # noqa: E402

# float32: the sharded matmuls and the all-reduce add partial sums in another order than one
# process does; the difference is rounding, near 1e-7 of the logits' scale.
RELATIVE_TOLERANCE = 1e-5
PROMPT = [5, 17, 42, 99, 3, 250 % 240, 7, 64]


def _settings(tp: int, compile: bool = False) -> TorchSettings:
    return TorchSettings(device="cpu", tp=tp, max_seq_len=64, seed=11, compile=compile)


@pytest.fixture(scope="module")
def single() -> TorchEngine:
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
    assert passed.layers[0].attention.n_heads == config.n_heads

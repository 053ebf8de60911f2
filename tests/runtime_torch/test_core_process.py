"""The torch engine's core in a process of its own (the default on a GPU), here on the CPU: the
same tokens, logits and steps as in the caller's process, the meter's ledger rebuilt from the
core's steps, errors that cross the pipe as they are, and a core that dies reported."""

import itertools
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")

import torch

from openjarvis.errors import UserError
from openjarvis.runtime.torch.config import TorchSettings
from openjarvis.runtime.torch.core_process import CoreProcess
from openjarvis.runtime.torch.engine import TorchEngine

PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7] * 10, [77]]


def _engine(process: bool, max_seq_len: int = 64) -> TorchEngine:
    settings = TorchSettings(
        device="cpu", max_seq_len=max_seq_len, seed=11, concurrency=8, engine_process=process
    )
    return TorchEngine("tiny-tp", settings)


@pytest.fixture(scope="module")
def remote() -> Iterator[TorchEngine]:
    engine = _engine(True)
    yield engine
    engine.close()


def test_the_core_process_decodes_what_the_callers_process_does(remote: TorchEngine) -> None:
    local = _engine(False)
    try:
        for prompt in PROMPTS:
            expected = [token for token, _ in local.generate_tokens(prompt, 12)]
            assert [token for token, _ in remote.generate_tokens(prompt, 12)] == expected
        assert torch.equal(remote.logits([1, 2, 3]), local.logits([1, 2, 3]))
        assert remote.step_counts().steps == local.step_counts().steps
        assert remote.settings_dict()["kv_cache_blocks"] == local.settings_dict()["kv_cache_blocks"]
    finally:
        local.close()


def test_the_ledger_holds_a_requests_steps_as_the_core_ran_them(remote: TorchEngine) -> None:
    """One piece per step the sequence took (a prefill, then a decode per token after the
    first), in the order they landed, the same pieces as its completion's work; once the core
    is idle the ledger is complete up to now."""
    key = 41
    remote.ledger.open(key)
    try:
        sequence = remote._submit([5, 6, 7], 6, frozenset(), 0.0, None, ledger_key=key)
        tokens = [pair for batch in remote._deliveries(sequence) for pair in batch]
        pieces = list(remote.ledger.pieces(key))
    finally:
        remote.ledger.close(key)
    assert len(tokens) == 6 and len(pieces) == 6  # the prefill picks the first token
    assert pieces == sequence.work
    assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(pieces))
    assert pieces[-1].end_s <= tokens[-1][1] + 1e-9
    deadline = time.monotonic() + 5
    while remote.ledger.complete_s() < pieces[-1].end_s and time.monotonic() < deadline:
        time.sleep(0.01)
    before = time.monotonic()
    time.sleep(0.05)
    assert remote.ledger.complete_s() >= before  # idle: complete up to now


def test_pieces_cross_with_their_batch_and_shares(remote: TorchEngine) -> None:
    """Two requests at once: each step's pieces arrive with the sequences the step carried
    and their shares of its tokens (a step both took: batch 2, shares adding up to 1)."""
    keys = (51, 52)
    for key in keys:
        remote.ledger.open(key)
    try:
        sequences = [
            remote._submit(prompt, 8, frozenset(), 0.0, None, ledger_key=key)
            for prompt, key in zip(([5, 6, 7], [8, 9, 10, 11]), keys, strict=True)
        ]
        for sequence in sequences:
            list(remote._deliveries(sequence))
        pieces = [list(remote.ledger.pieces(key)) for key in keys]
    finally:
        for key in keys:
            remote.ledger.close(key)
    steps: dict[tuple[float, float], list] = {}
    for piece in itertools.chain(*pieces):
        steps.setdefault((piece.start_s, piece.end_s), []).append(piece)
    assert any(len(taken) == 2 for taken in steps.values()), "the two shared a step"
    for taken in steps.values():
        assert all(piece.batch == len(taken) for piece in taken)
        assert sum(piece.share for piece in taken) == pytest.approx(1.0)


def test_a_consumer_that_leaves_frees_its_sequence_in_the_core(remote: TorchEngine) -> None:
    tokens = remote.generate_tokens([3, 1, 4, 1, 5], 40)
    next(tokens)
    tokens.close()
    before = remote.step_counts().steps["decode"]
    time.sleep(0.3)  # 40 tokens of the tiny model would take about 0.1 s here
    after = remote.step_counts().steps["decode"]
    assert after - before <= 2  # a step or two in flight at the cancel, then nothing


def test_an_error_in_the_core_crosses_as_itself(tmp_path) -> None:
    missing = str(tmp_path / "no-such-folder")
    with pytest.raises(UserError, match=r"model not found: .*no-such-folder"):
        TorchEngine(missing, TorchSettings(device="cpu", engine_process=True))


def test_a_core_that_dies_is_reported_to_its_consumers_and_callers() -> None:
    engine = _engine(True, max_seq_len=4096)
    try:
        tokens = engine.generate_tokens([2, 7, 1, 8], 4000)  # seconds of decoding
        next(tokens)
        core = engine._core
        assert isinstance(core, CoreProcess)
        core._process.kill()
        with pytest.raises(RuntimeError, match="process ended \\(killed by SIGKILL\\)"):
            list(tokens)
        with pytest.raises(RuntimeError, match="stopped after an error"):
            engine.generate_tokens([1], 2)
        assert engine.ledger.complete_s() >= time.monotonic() - 1  # idle: nothing will land
    finally:
        engine.close()


def test_a_message_the_caller_cannot_take_fails_the_requests_not_hangs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug on this side of the pipe (here: taking the tokens raises) ends the core and is
    handed to every request in flight, instead of leaving them waiting for tokens forever."""
    from openjarvis.runtime.torch.core_process import CoreProcess

    engine = _engine(True, max_seq_len=4096)
    try:
        take = CoreProcess._take

        def broken(self: CoreProcess, message: tuple) -> None:
            if message[0] == "out":
                raise KeyError("a bug")
            take(self, message)

        monkeypatch.setattr(CoreProcess, "_take", broken)
        tokens = engine.generate_tokens([2, 7, 1, 8], 4000)
        raised: list[str] = []

        def consume() -> None:
            try:
                list(tokens)
            except RuntimeError as error:
                raised.append(str(error))

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        consumer.join(timeout=60)  # before the fix: waits for tokens forever
        assert raised and "messages could not be read: KeyError" in raised[0]
        with pytest.raises(RuntimeError, match="stopped after an error"):
            engine.generate_tokens([1], 2)
    finally:
        engine.close()


def test_a_step_that_fails_in_the_core_stops_the_engine_on_this_side_too() -> None:
    """A token the model has no row for fails the core's step loop: the request gets the
    error, the engine here refuses the next request at once, and the meter's ledger is idle
    (no step will land), as with the core in this process."""
    engine = _engine(True)
    try:
        with pytest.raises(RuntimeError, match="the torch engine failed: IndexError"):
            list(engine.generate_tokens([10**6], 3))
        with pytest.raises(RuntimeError, match="stopped after an error"):
            engine.generate_tokens([1], 2)
        assert engine.ledger.complete_s() >= time.monotonic() - 1
    finally:
        engine.close()

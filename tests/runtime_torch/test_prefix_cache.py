"""Prefix caching in the torch engine's block pool: full blocks found again by content, shared
with reference counts, kept after their sequence ends and evicted only when blank blocks run
out; and through the engine, the greedy tokens with a cached prefix equal those without."""

import pytest

pytest.importorskip("torch")

from openjarvis.runtime.torch.paged import BlockPool, chain_key
from openjarvis.runtime.types import Completion

SIZE = 4


def test_keys_chain_so_equal_blocks_at_other_positions_differ() -> None:
    pool = BlockPool(8, SIZE)
    keys = pool.prefix_keys([1, 2, 3, 4, 1, 2, 3, 4, 9])
    assert len(keys) == 2  # the ninth token is in no full block
    assert keys[0] != keys[1]  # same tokens, another prefix before them
    assert keys[0] == chain_key(b"", [1, 2, 3, 4])
    assert pool.prefix_keys([1, 2, 3, 5, 1, 2, 3, 4])[1] != keys[1]


def test_a_published_prefix_is_found_while_held_and_after_it_is_given_back() -> None:
    pool = BlockPool(8, SIZE)
    tokens = list(range(10))
    keys = pool.prefix_keys(tokens)
    blocks = pool.take(3)
    for block, key in zip(blocks, keys, strict=False):
        pool.publish(block, key)
    assert pool.cached(keys) == blocks[:2]
    pool.give_back(blocks)
    assert pool.free == 7
    assert pool.cached(keys) == blocks[:2]  # content kept while unreferenced
    # A second sequence with the same first block and another second one shares only the first.
    other = pool.prefix_keys([0, 1, 2, 3, 7, 7, 7, 7])
    assert pool.cached(other) == blocks[:1]


def test_shared_blocks_are_counted_and_free_only_when_nobody_holds_them() -> None:
    pool = BlockPool(6, SIZE)
    first = pool.take(2)
    key = chain_key(b"", [1, 2, 3, 4])
    pool.publish(first[0], key)
    assert pool.free == 3
    second = pool.take(2, [first[0]])
    assert second[0] == first[0] and pool.free == 2
    pool.give_back(first)
    assert pool.free == 3  # first[1] is free; the shared block is still held by the second
    pool.give_back(second)
    assert pool.free == 5


def test_taking_an_unreferenced_cached_block_uses_up_a_free_block() -> None:
    pool = BlockPool(3, SIZE)  # two usable blocks
    held = pool.take(2)
    key = chain_key(b"", [1, 2, 3, 4])
    pool.publish(held[0], key)
    pool.give_back(held)
    assert pool.can_take(2, [held[0]])
    assert not pool.can_take(3, [held[0]])
    assert pool.take(2, [held[0]])[0] == held[0]
    assert pool.free == 0


def test_blank_blocks_go_first_then_the_least_recently_freed_is_evicted() -> None:
    pool = BlockPool(4, SIZE)  # blocks 1, 2, 3
    a, b = pool.take(1), pool.take(1)
    key_a, key_b = chain_key(b"", [1] * SIZE), chain_key(b"", [2] * SIZE)
    pool.publish(a[0], key_a)
    pool.publish(b[0], key_b)
    pool.give_back(a)
    pool.give_back(b)
    assert pool.take(1) == [3]  # the blank block, both prefixes kept
    assert pool.cached([key_a]) == a and pool.cached([key_b]) == b
    assert pool.take(1) == a  # evicted: freed before b
    assert pool.cached([key_a]) == [] and pool.cached([key_b]) == b


def test_a_prefix_computed_twice_stays_with_the_first_block() -> None:
    pool = BlockPool(4, SIZE)
    key = chain_key(b"", [5] * SIZE)
    one, two = pool.take(1), pool.take(1)
    pool.publish(one[0], key)
    pool.publish(two[0], key)
    assert pool.cached([key]) == one
    pool.give_back(two)
    assert pool.free == 2  # the duplicate came back blank, not cached
    pool.give_back(one)
    assert pool.cached([key]) == one


def test_a_pool_without_reuse_finds_nothing() -> None:
    pool = BlockPool(4, SIZE, reuse=False)
    key = chain_key(b"", [1, 2, 3, 4])
    (block,) = pool.take(1)
    pool.publish(block, key)
    assert pool.cached([key]) == []
    pool.give_back([block])
    assert pool.free == 3


def test_a_sequence_s_blocks_are_keyed_by_their_tokens_in_prompt_reply_or_both() -> None:
    """Blocks published after the fact (`Scheduler._publish`, keys from none on): each under
    the key of the tokens at its positions, prompt blocks, the one across the prompt's end and
    reply blocks alike."""
    from openjarvis.runtime.torch.scheduler import Scheduler, Sequence

    pool = BlockPool(8, SIZE)
    sequence = Sequence(list(range(10)), 8, frozenset())
    sequence.blocks = pool.take(5)
    sequence.output = [100 + i for i in range(8)]
    sequence.cached, sequence.keys = 17, []  # four full blocks: 0-3, 4-7, 8-11, 12-15
    Scheduler(pool, 1, 64, 32)._publish(sequence, sequence.keys)
    assert sequence.keys == pool.prefix_keys([*sequence.prompt, *sequence.output])


# ---- through the engine ----------------------------------------------------------------------

PREFIX = [(7 * i + 3) % 240 for i in range(40)]  # two full blocks of 16 and 8 more tokens


def _tiny(reuse: bool, device: str):
    from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings

    settings = TorchSettings(
        device=device,
        max_seq_len=128,
        seed=11,
        concurrency=4,
        reuse_prompt_cache=reuse,
        compile=False,  # the GPU run checks the cache, not the compiled step
        engine_process=False,  # the tests read the pool
    )
    return TorchEngine("tiny-tp", settings)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _greedy(engine, prompt: list[int]) -> list[int]:
    return [token for token, _ in engine.generate_tokens(prompt, 12)]


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param("cuda", marks=pytest.mark.skipif(not _has_cuda(), reason="no CUDA GPU")),
    ],
)
def test_greedy_tokens_are_the_same_with_a_cached_prefix(device: str) -> None:
    """Also on a GPU in bf16, where the tail after a cached prefix, computed in a smaller
    batch than a cold prompt, could round otherwise."""
    cold, warm = _tiny(reuse=False, device=device), _tiny(reuse=True, device=device)
    try:
        later = [*PREFIX, 11, 12, 13, 14, 15]
        assert _greedy(warm, PREFIX) == _greedy(cold, PREFIX)
        pool = warm._core.scheduler.pool
        # The first prompt's full blocks (and those its reply filled) are published ...
        assert len(pool.cached(pool.prefix_keys(later[:-1]))) == 2
        assert not cold._core.scheduler.pool.cached(pool.prefix_keys(later[:-1]))
        # ... and the second prompt, computed from block 2 on, picks the same tokens.
        assert _greedy(warm, later) == _greedy(cold, later)
        # Several at once, sharing the prefix, each as it would alone.
        together = [[*PREFIX, i] for i in range(3)]
        streams = [warm.generate_tokens(prompt, 12) for prompt in together]
        assert [[t for t, _ in s] for s in streams] == [_greedy(cold, p) for p in together]
        assert pool.free == pool.blocks - 1  # every reference given back
    finally:
        cold.close()
        warm.close()


def test_a_block_the_reply_alone_filled_is_published_under_the_reply_s_tokens() -> None:
    engine = _tiny(reuse=True, device="cpu")
    try:
        prompt = PREFIX[:16]  # one full block; the reply fills the next by itself
        reply = [token for token, _ in engine.generate_tokens(prompt, 20)]
        pool = engine._core.scheduler.pool
        assert len(pool.cached(pool.prefix_keys([*prompt, *reply[:16], 0]))) == 2
        shifted = [*prompt, *reply[1:17], 0]  # the same length, the reply one token on
        assert len(pool.cached(pool.prefix_keys(shifted))) == 1
    finally:
        engine.close()


def test_a_chat_turn_on_the_embedded_gguf_reuses_the_last_and_says_how_much() -> None:
    pytest.importorskip("gguf")
    from openjarvis.runtime.models import resolve_model
    from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings
    from openjarvis.runtime.types import ChatMessage, ChatRequest

    path = resolve_model(None).path
    system = ChatMessage("system", "You answer questions about Python. " * 12)
    first = (system, ChatMessage("user", "What is a list?"))

    def turns(reuse: bool) -> tuple[Completion, Completion]:
        settings = TorchSettings(device="cpu", max_seq_len=512, reuse_prompt_cache=reuse)
        engine = TorchEngine(path, settings)
        try:
            one = engine.generate(ChatRequest(first, max_tokens=8))
            history = (*first, ChatMessage("assistant", one.text), ChatMessage("user", "Why?"))
            return one, engine.generate(ChatRequest(history, max_tokens=8))
        finally:
            engine.close()

    (cold_one, cold_two), (warm_one, warm_two) = turns(False), turns(True)
    assert (cold_one.cached_tokens, cold_two.cached_tokens, warm_one.cached_tokens) == (0, 0, 0)
    # The second turn shares the first's prompt: all its full blocks before the reply.
    assert warm_two.cached_tokens is not None
    assert warm_two.cached_tokens >= warm_one.prompt_tokens // 16 * 16 - 16
    assert warm_two.cached_tokens % 16 == 0 and warm_two.cached_tokens < warm_two.prompt_tokens
    assert (warm_one.text, warm_two.text) == (cold_one.text, cold_two.text)

"""Prefix caching in the torch engine's block pool: full blocks found again by content, shared
with reference counts, kept after their sequence ends and evicted only when blank blocks run
out; and through the engine, the greedy tokens with a cached prefix equal those without."""

import pytest

pytest.importorskip("torch")

from openjarvis.runtime.torch.paged import BlockPool, chain_key

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

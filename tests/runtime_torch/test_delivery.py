"""Tokens reach their consumers in periods that grow with the running sequences (so that many
streams wake their consumers a bounded number of times a second), except a first token and an
end, which go at once."""

import pytest

pytest.importorskip("torch")

from openjarvis.runtime.torch.paged import BlockPool
from openjarvis.runtime.torch.scheduler import (
    DELIVERY_PERIOD_S,
    DELIVERY_WAKES_PER_S,
    Scheduler,
    Sequence,
)


def _drain(sequence: Sequence) -> list[tuple[int, float] | None]:
    items: list[tuple[int, float] | None] = []
    while not sequence.outbox.empty():
        batch = sequence.outbox.get()
        assert isinstance(batch, list)
        items += batch
    return items


def _running(count: int) -> tuple[Scheduler, list[Sequence]]:
    scheduler = Scheduler(BlockPool(4 * count + 1, 16, reuse=False), count, 4096, 64)
    sequences = [Sequence([1, 2, 3], 8, frozenset({0})) for _ in range(count)]
    for sequence in sequences:
        scheduler.add(sequence)
    prefill = scheduler.next_step()
    assert prefill is not None and prefill.kind == "prefill" and len(prefill.rows) == count
    scheduler.deliver(0.995)  # a delivery (of nothing) just before the prefill lands
    scheduler.finish_step(prefill, [7] * count, 0.0, 1.0)
    return scheduler, sequences


def test_with_many_streams_the_period_grows_and_first_tokens_and_ends_go_at_once() -> None:
    count = 64
    period_s = count / DELIVERY_WAKES_PER_S
    assert period_s > DELIVERY_PERIOD_S
    scheduler, sequences = _running(count)
    scheduler.deliver(1.0)  # within the period, but every first token goes at once
    assert all(_drain(s) == [(7, 1.0)] for s in sequences)
    now_s = 1.0
    decode = scheduler.next_step()
    assert decode is not None and decode.kind == "decode"
    scheduler.finish_step(decode, [8] * count, now_s, now_s + 0.002)
    now_s += 0.002
    scheduler.deliver(now_s)  # within the period: nobody is woken for an ordinary token
    assert not any(_drain(s) for s in sequences)
    # One sequence ends (its end token): it alone hears at once, with the token before.
    decode = scheduler.next_step()
    assert decode is not None
    picked: list[int | None] = [0, *([9] * (count - 1))]
    scheduler.finish_step(decode, picked, now_s, now_s + 0.002)
    now_s += 0.002
    scheduler.deliver(now_s)
    assert _drain(sequences[0]) == [(8, 1.002), (0, 1.004), None]
    assert not any(_drain(s) for s in sequences[1:])
    # Once the period has passed, the rest have theirs, in order.
    scheduler.deliver(1.0 + period_s)
    assert all(_drain(s) == [(8, 1.002), (9, 1.004)] for s in sequences[1:])


def test_a_lone_stream_is_handed_its_tokens_every_base_period() -> None:
    scheduler, (sequence,) = _running(1)
    scheduler.deliver(1.0)  # its first token, at once
    assert _drain(sequence) == [(7, 1.0)]
    decode = scheduler.next_step()
    assert decode is not None
    scheduler.finish_step(decode, [8], 1.0, 1.001)
    scheduler.deliver(1.001)
    assert _drain(sequence) == []
    scheduler.deliver(1.0 + DELIVERY_PERIOD_S)
    assert _drain(sequence) == [(8, 1.001)]

"""Tokens to text: what is held back for a stop sequence against the plain rule, and a
stream's chunks and stop on random pieces that split characters across tokens."""

import random

import pytest

from openjarvis.runtime.streaming import Outcome, singly, stream_text
from openjarvis.runtime.types import Completion, StreamChunk, held_back

STOPS = ("\ndef", "\nclass", "\n#", "ééa", "aab")


def _itself(outcome: Outcome) -> Completion:
    """The outcome itself as the last chunk's completion, to compare."""
    return outcome  # type: ignore[return-value]  # deliberately the Outcome, which the tests read


def _outcome(chunks: list[StreamChunk]) -> Outcome:
    outcome = chunks[-1].completion
    assert isinstance(outcome, Outcome)  # what _itself handed back
    return outcome


def held_back_plainly(text: str, stops: tuple[str, ...]) -> int:
    return max(
        (size for stop in stops for size in range(1, len(stop)) if text.endswith(stop[:size])),
        default=0,
    )


def test_held_back_is_the_longest_tail_that_starts_a_stop() -> None:
    rng = random.Random(7)
    alphabet = "ab\n#défclas"
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        stops = tuple(rng.sample(STOPS, rng.randrange(0, len(STOPS) + 1)))
        assert held_back(text, stops) == held_back_plainly(text, stops), (text, stops)


@pytest.mark.parametrize("seed", range(40))
def test_a_stream_is_its_text_up_to_the_first_stop(seed: int) -> None:
    rng = random.Random(seed)
    source = "".join(rng.choice(["a", "b", "é", "🙂", "\n", "def", "#", "c"]) for _ in range(60))
    data = source.encode() + (b"\xff" if seed % 5 == 0 else b"")  # an invalid byte, ignored
    pieces, at = [], 0
    while at < len(data):  # pieces of 1-4 bytes: characters split across tokens
        size = rng.randrange(1, 5)
        pieces.append(data[at : at + size])
        at += size
    stop = tuple(rng.sample(STOPS, rng.randrange(0, 3)))
    pairs, batches = [(token, float(token)) for token in range(len(pieces))], []
    while pairs:  # handed over in batches of 1-8 tokens, as a batching engine does
        size = rng.randrange(1, 9)
        batches.append(pairs[:size])
        pairs = pairs[size:]
    chunks = list(
        stream_text(
            iter(batches),
            piece=pieces.__getitem__,
            is_end=lambda token: False,
            stop=stop,
            max_tokens=len(pieces),
            start_s=0.0,
            clock=lambda: 0.0,
            finish=_itself,
        )
    )
    # The text is the source up to its first stop (all of it without one, less the invalid
    # byte), and the chunks add up to it.
    text = data.decode("utf-8", errors="ignore")
    cuts = [at for s in stop if (at := text.find(s)) >= 0]
    expected = text[: min(cuts)] if cuts else text
    outcome = _outcome(chunks)
    assert outcome.text == expected
    assert outcome.finish_reason == ("stop" if cuts else "length")
    assert "".join(chunk.text for chunk in chunks) == expected


def _stream(
    batches: list, pieces: list[bytes], end: int | None, stop: tuple, max_tokens: int
) -> list[StreamChunk]:
    return list(
        stream_text(
            iter(batches),
            piece=pieces.__getitem__,
            is_end=lambda token: token == end,
            stop=stop,
            max_tokens=max_tokens,
            start_s=0.0,
            clock=lambda: 0.0,
            finish=_itself,
        )
    )


@pytest.mark.parametrize("seed", range(60))
def test_batches_give_what_tokens_one_at_a_time_give(seed: int) -> None:
    """An end token, a stop sequence or max_tokens inside a batch: the same text, tokens
    counted and finish as when the same tokens come one at a time."""
    rng = random.Random(seed)
    pieces = [
        rng.choice([b"a", b"b", b"\n", b"def", b"#", b"\xc3", b"\xa9", b"c"]) for _ in range(50)
    ]
    end = rng.choice([None, rng.randrange(len(pieces))])
    stop = tuple(rng.sample(STOPS, rng.randrange(0, 3)))
    max_tokens = rng.randrange(1, len(pieces) + 1)
    pairs = [(token, float(token)) for token in range(len(pieces))]
    batches, rest = [], pairs
    while rest:
        size = rng.randrange(1, 12)
        batches.append(rest[:size])
        rest = rest[size:]
    one_by_one = _stream([[pair] for pair in pairs], pieces, end, stop, max_tokens)
    batched = _stream(batches, pieces, end, stop, max_tokens)
    want, got = _outcome(one_by_one), _outcome(batched)
    assert (got.text, got.token_times_s, got.finish_reason) == (
        want.text,
        want.token_times_s,
        want.finish_reason,
    )
    assert "".join(c.text for c in batched) == "".join(c.text for c in one_by_one)
    # A chunk per batch, and the last; the batch that ends the stream goes token by token.
    assert len(batched) <= len(batches) + max(map(len, batches))


def test_closing_the_stream_closes_the_engine_s_tokens() -> None:
    closed = []

    def tokens():
        try:
            yield from [(0, 0.0), (1, 1.0)]
        finally:
            closed.append(True)

    stream = stream_text(
        singly(tokens()),
        piece=lambda token: b"x",
        is_end=lambda token: False,
        stop=(),
        max_tokens=10,
        start_s=0.0,
        clock=lambda: 0.0,
        finish=_itself,  # not used here
    )
    next(stream)
    stream.close()
    assert closed == [True]

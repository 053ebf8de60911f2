"""Tokens to text: the stream's text, its chunks and its stop against the plain rule (decode
all the bytes so far; hold back the longest tail that starts a stop sequence), on random
pieces that split characters across tokens."""

import random

import pytest

from openjarvis.runtime.streaming import stream_text
from openjarvis.runtime.types import held_back

STOPS = ("\ndef", "\nclass", "\n#", "ééa", "aab")


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


def plain_chunks(pieces: list[bytes], stop: tuple[str, ...]) -> tuple[list[str], str, str]:
    """The rule, with the whole text decoded again at every token."""
    data, text, emitted, chunks, reason = b"", "", 0, [], "length"
    for piece in pieces:
        searched_from = max(0, len(text) - max((len(s) for s in stop), default=0))
        data += piece
        text = data.decode("utf-8", errors="ignore")
        cut = min((i for s in stop if (i := text.find(s, searched_from)) >= 0), default=-1)
        if cut >= 0:
            text, reason = text[:cut], "stop"
        safe = len(text) - held_back_plainly(text, stop)
        if safe > emitted:
            chunks.append(text[emitted:safe])
            emitted = safe
        if reason == "stop":
            break
    chunks.append(text[emitted:])
    return chunks, text, reason


@pytest.mark.parametrize("seed", range(40))
def test_chunks_match_the_whole_text_decoded_at_every_token(seed: int) -> None:
    rng = random.Random(seed)
    source = "".join(rng.choice(["a", "b", "é", "🙂", "\n", "def", "#", "c"]) for _ in range(60))
    data = source.encode() + (b"\xff" if seed % 5 == 0 else b"")  # an invalid byte, ignored
    pieces, at = [], 0
    while at < len(data):  # pieces of 1-4 bytes: characters split across tokens
        size = rng.randrange(1, 5)
        pieces.append(data[at : at + size])
        at += size
    stop = tuple(rng.sample(STOPS, rng.randrange(0, 3)))
    chunks = list(
        stream_text(
            iter([(token, float(token)) for token in range(len(pieces))]),
            piece=pieces.__getitem__,
            is_end=lambda token: False,
            stop=stop,
            max_tokens=len(pieces),
            start_s=0.0,
            clock=lambda: 0.0,
            finish=lambda outcome: outcome,  # type: ignore[arg-type, return-value]  # the outcome itself, to compare
        )
    )
    expected_chunks, expected_text, reason = plain_chunks(pieces, stop)
    assert [chunk.text for chunk in chunks] == expected_chunks
    outcome = chunks[-1].completion
    assert outcome.text == expected_text  # type: ignore[union-attr]  # an Outcome here
    assert outcome.finish_reason == reason  # type: ignore[union-attr]  # an Outcome here

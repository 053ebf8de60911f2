"""Tokens to text: what is held back for a stop sequence against the plain rule, and a
stream's chunks and stop on random pieces that split characters across tokens."""

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
    # The text is the source up to its first stop (all of it without one, less the invalid
    # byte), and the chunks add up to it.
    text = data.decode("utf-8", errors="ignore")
    cuts = [at for s in stop if (at := text.find(s)) >= 0]
    expected = text[: min(cuts)] if cuts else text
    outcome = chunks[-1].completion
    assert outcome.text == expected  # type: ignore[union-attr]  # an Outcome here
    assert outcome.finish_reason == ("stop" if cuts else "length")  # type: ignore[union-attr]  # an Outcome here
    assert "".join(chunk.text for chunk in chunks) == expected

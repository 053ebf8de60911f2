"""Tokens to text, once for every local engine: batches of tokens and arrival times in (as the
engine hands them over), StreamChunks out, and the Completion with its timings last.

Stop sequences are searched in the decoded text; text that could still be the start of one is
held back until the next token decides. A character split over two tokens decodes whole.
"""

from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

from openjarvis.runtime.types import Completion, StreamChunk, WorkPiece, held_back

__all__ = ["Outcome", "singly", "stream_text"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a decode produced, before the engine adds what it knows (prompt size, bytes read)."""

    text: str
    token_times_s: tuple[float, ...]  # arrival of each emitted token (time.monotonic())
    finish_reason: str  # "stop" (end token or stop sequence) or "length"
    start_s: float
    end_s: float

    def completion(
        self,
        prompt_tokens: int,
        *,
        decode_bytes_per_token: float | None,
        bandwidth_bytes_per_s: float | None,
        work: tuple[WorkPiece, ...] = (),
        batch: float = 1.0,
        cached_tokens: int | None = None,
    ) -> Completion:
        """The Completion; MBU = decode rate x batch x bytes per token / bandwidth (the
        device's bandwidth use while this sequence decoded among `batch` others), None when
        any of them is unknown or fewer than two tokens were decoded."""
        times = self.token_times_s
        decode_s = times[-1] - times[0] if times else None
        mbu = None
        if decode_bytes_per_token and bandwidth_bytes_per_s and decode_s and len(times) > 1:
            rate = (len(times) - 1) / decode_s
            mbu = rate * batch * decode_bytes_per_token / bandwidth_bytes_per_s
        return Completion(
            text=self.text,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(times),
            finish_reason=self.finish_reason,
            wall_s=self.end_s - self.start_s,
            ttft_s=times[0] - self.start_s if times else None,
            decode_s=decode_s,
            decode_bytes_per_token=decode_bytes_per_token,
            memory_bandwidth_utilisation=mbu,
            work=work,
            cached_tokens=cached_tokens,
        )


def stream_text(
    batches: Iterator[Sequence[tuple[int, float]]],
    *,
    piece: Callable[[int], bytes],
    is_end: Callable[[int], bool],
    stop: tuple[str, ...],
    max_tokens: int,
    start_s: float,
    clock: Callable[[], float],
    finish: Callable[[Outcome], Completion],
) -> Generator[StreamChunk]:
    """Turn batches of (token, arrival time) pairs, as the engine hands them over, into chunks
    of text: one chunk per batch.

    Stops at an end token (not emitted, not counted), after the token that completes a stop
    sequence (the text is cut before it), or after `max_tokens` tokens; the batch iterator is
    closed then, so that an engine can free the sequence. The last chunk carries
    `finish(outcome)`. A batch that holds no end token, completes no stop sequence and stays
    under `max_tokens` is decoded at once (a batching engine hands a stream dozens of tokens at
    a time under load: per-token work there took a fifth of a server's interpreter); one that
    ends the stream is taken token by token, to stop at the token that ends it."""
    text_bytes, text, emitted = b"", "", 0
    times: list[float] = []
    finish_reason = "length"
    longest_stop = max((len(s) for s in stop), default=0)
    try:
        for batch in batches:
            if not batch:
                continue
            searched_from = max(0, len(text) - longest_stop)
            if len(times) + len(batch) < max_tokens and not any(is_end(t) for t, _ in batch):
                grown = text_bytes + b"".join([piece(token) for token, _ in batch])
                decoded = grown.decode("utf-8", errors="ignore")
                if not any(decoded.find(s, searched_from) >= 0 for s in stop):
                    text_bytes, text = grown, decoded
                    times.extend([time_s for _, time_s in batch])
                    safe = len(text) - held_back(text, stop)
                    if safe > emitted:
                        yield StreamChunk(text[emitted:safe], batch[-1][1])
                        emitted = safe
                    continue
            ended = False
            for token, time_s in batch:  # the batch ends the stream: find the token
                if is_end(token):
                    finish_reason, ended = "stop", True
                    break
                times.append(time_s)
                searched_from = max(0, len(text) - longest_stop)
                text_bytes += piece(token)
                text = text_bytes.decode("utf-8", errors="ignore")
                cut = min((i for s in stop if (i := text.find(s, searched_from)) >= 0), default=-1)
                if cut >= 0:
                    text, finish_reason = text[:cut], "stop"
                safe = len(text) - held_back(text, stop)
                if safe > emitted:
                    yield StreamChunk(text[emitted:safe], time_s)
                    emitted = safe
                if finish_reason == "stop" or len(times) >= max_tokens:
                    ended = True
                    break
            if ended:
                break
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    end_s = clock()
    outcome = Outcome(text, tuple(times), finish_reason, start_s, end_s)
    yield StreamChunk(text[emitted:], end_s, finish(outcome))


def singly(tokens: Iterator[tuple[int, float]]) -> Generator[list[tuple[int, float]]]:
    """Each (token, arrival time) as a batch of its own, for `stream_text` over an engine that
    hands tokens over one at a time; closing it closes `tokens`."""
    try:
        for pair in tokens:
            yield [pair]
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()

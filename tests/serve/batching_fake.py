"""A batching engine faked at the model's edge, the one fake the server's concurrency tests use.

Its "model" replies with scripted words (a token each) at a fixed step time; everything above
that runs for real: the token-to-text path (runtime/streaming.py), the Completion with its work
pieces, the server, the meter. It counts the sequences in flight and frees one when its token
iterator is closed, as a batching engine frees a sequence's KV blocks.
"""

import re
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

from openjarvis.runtime.ledger import StepLedger
from openjarvis.runtime.streaming import singly, stream_text
from openjarvis.runtime.types import (
    ChatRequest,
    Completion,
    Request,
    StreamChunk,
    WorkPiece,
    final_completion,
)

__all__ = ["FakeBatchingEngine", "echo_reply"]

_END = -1


def echo_reply(prompt: str) -> str:
    """The scripted reply to a prompt: it names the prompt, so a mixed-up reply shows."""
    return f"You said {prompt!r}, and here is a reply of several words to it."


def _prompt(request: Request) -> str:
    if isinstance(request, ChatRequest):
        return request.messages[-1].content
    return request.prompt


@dataclass
class FakeBatchingEngine:
    reply: Callable[[str], str] = echo_reply
    concurrency: int = 16
    step_s: float = 0.002  # one decode step
    # Sequences that must be in flight before any emits its first token: a test that needs
    # them at once fails (the barrier times out) when the server runs them in turn.
    gather: int = 1
    # Cleared: sequences hold before each token (a test acts while they are in flight).
    flowing: threading.Event = field(default_factory=threading.Event)
    fail_after: int | None = None  # tokens after which a sequence's step fails
    kind: str = "torch"  # a local engine: the server meters and claims its sources
    name: str = "fake-batching"
    active: int = 0
    peak: int = 0
    started: int = 0
    freed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _barrier: threading.Barrier | None = None
    # The steps as they land, for the meter. Each sequence sleeps its own steps here, so a
    # step is recorded when its sequence's piece is (an approximation at the model's edge).
    ledger: StepLedger = field(default_factory=StepLedger)

    def __post_init__(self) -> None:
        self.flowing.set()
        if self.gather > 1:
            self._barrier = threading.Barrier(self.gather, timeout=20)

    @property
    def model_name(self) -> str:
        return self.name

    @property
    def devices(self) -> tuple[int, ...]:
        return ()

    def settings_dict(self) -> dict[str, object]:
        return {}

    def generate(self, request: Request) -> Completion:
        return final_completion(self.stream(request))

    def stream(self, request: Request) -> Generator[StreamChunk]:
        words = re.findall(r"\S+\s*", self.reply(_prompt(request)))
        work: list[WorkPiece] = []
        followed = self.ledger.attach(request.ledger_key, work)
        start_s = time.monotonic()
        prompt_tokens = len(_prompt(request).split())
        yield from stream_text(
            singly(self._tokens(len(words), work, followed)),
            piece=lambda token: words[token].encode(),
            is_end=lambda token: token == _END,
            stop=request.stop,
            max_tokens=request.max_tokens or len(words) + 1,
            start_s=start_s,
            clock=time.monotonic,
            finish=lambda outcome: outcome.completion(
                prompt_tokens,
                decode_bytes_per_token=None,
                bandwidth_bytes_per_s=None,
                work=tuple(work),
            ),
        )

    def _tokens(
        self, count: int, work: list[WorkPiece], followed: bool
    ) -> Iterator[tuple[int, float]]:
        with self._lock:
            self.active += 1
            self.started += 1
            self.peak = max(self.peak, self.active)
            self.ledger.busy()
        try:
            if self._barrier is not None:
                self._barrier.wait()
            for token in [*range(count), _END]:
                self.flowing.wait()
                if token == self.fail_after:
                    raise RuntimeError("the fake engine's step failed")
                step_start_s = time.monotonic()
                time.sleep(self.step_s)
                with self._lock:  # landed in the order of their ends
                    batch = self.active
                    step_end_s = time.monotonic()
                    work.append(WorkPiece(step_start_s, step_end_s, 1 / batch, batch))
                    self.ledger.landed(step_start_s, step_end_s, 1 / batch if followed else 0.0)
                yield token, time.monotonic()
        finally:
            with self._lock:
                self.active -= 1
                self.freed += 1
                if self.active == 0:
                    self.ledger.idle()

    def close(self) -> None:
        pass

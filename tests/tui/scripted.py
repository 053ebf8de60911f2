"""An engine that replays scripted replies: the one fake the assistant's tests use.

It honours stop sequences and max_tokens like a real engine and counts a token per word, so
context and energy accounting run for real on its numbers.
"""

import re
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from openjarvis.runtime.types import (
    ChatRequest,
    Completion,
    EnergyEstimate,
    Request,
    StreamChunk,
    final_completion,
)
from openjarvis.tui.engines import LoadedModel

__all__ = ["ScriptedEngine", "scripted_model"]


@dataclass
class ScriptedEngine:
    replies: list[str]
    name: str = "scripted-model"
    kind: str = "llamacpp"
    cloud_joules_per_token: float | None = None  # set: replies carry a labelled estimate
    cost_usd_per_token: float | None = None
    delay_s: float = 0.0  # between chunks, for tests that act while a reply streams
    # The snapshot tests pass a clock that steps, so that timings and tokens/s repeat exactly.
    clock: Callable[[], float] = time.monotonic
    concurrency: int = 1
    ledger: None = None  # one reply at a time: no step ledger
    requests: list[ChatRequest] = field(default_factory=list)
    closed: bool = False

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
        assert isinstance(request, ChatRequest)
        self.requests.append(request)
        if not self.replies:
            raise AssertionError("the scripted engine ran out of replies")
        start_s = self.clock()
        script = self.replies.pop(0)
        finish = "stop"
        for stop in request.stop:
            if stop in script:
                script = script[: script.index(stop)]
        words = re.findall(r"\S+\s*|\s+", script)
        if request.max_tokens is not None and len(words) > request.max_tokens:
            words, finish = words[: request.max_tokens], "length"
        times = []
        for word in words:
            time.sleep(self.delay_s)
            times.append(self.clock())
            yield StreamChunk(word, times[-1])
        prompt_tokens = sum(len(m.content.split()) + 4 for m in request.messages)
        tokens = len(words)
        estimate = None
        if self.cloud_joules_per_token is not None:
            joules = self.cloud_joules_per_token * (tokens + prompt_tokens)
            estimate = EnergyEstimate("estimate:cloud:test", joules, "test constants")
        cost = None if self.cost_usd_per_token is None else self.cost_usd_per_token * tokens
        completion = Completion(
            text="".join(words),
            prompt_tokens=prompt_tokens,
            completion_tokens=tokens,
            finish_reason=finish,
            wall_s=self.clock() - start_s,
            ttft_s=times[0] - start_s if times else None,
            decode_s=times[-1] - times[0] if times else None,
            cost_usd=cost,
            energy_estimate=estimate,
        )
        yield StreamChunk("", self.clock(), completion)

    def close(self) -> None:
        self.closed = True


def scripted_model(engine: ScriptedEngine, context_tokens: int | None = 4096) -> LoadedModel:
    return LoadedModel(engine, context_tokens, engine.name)

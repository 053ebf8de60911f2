"""What reusing a cached prompt prefix saved: the prefill joules its tokens would have cost,
priced by the last cold prefill measured here (docs/assistant.md, "Prompt reuse").

An estimate that assumes a prompt token costs the same wherever it sits; the benchmark
(benchmarks/assistant_prefix.py) measures the same turns with and without reuse instead.
"""

import threading

__all__ = ["MIN_PRICED_TOKENS", "PrefillPrice"]

# A prefill that computed fewer prompt tokens than this is mostly fixed cost (one pass over the
# weights), so it would price a token far too high: it is not used as a price.
MIN_PRICED_TOKENS = 64


class PrefillPrice:
    """Joules per computed prompt token of the latest prefill of at least MIN_PRICED_TOKENS
    tokens; requests and replies report theirs as they finish (from any thread)."""

    def __init__(self) -> None:
        self._j_per_token: float | None = None
        self._lock = threading.Lock()

    def observe(
        self, prompt_tokens: int, cached_tokens: int | None, prefill_j: float | None
    ) -> None:
        """A finished request: its prefill energy prices a token when it computed enough."""
        if prefill_j is None or cached_tokens is None or prefill_j <= 0:
            return
        computed = prompt_tokens - cached_tokens
        if computed >= MIN_PRICED_TOKENS:
            with self._lock:
                self._j_per_token = prefill_j / computed

    def saved_j(self, cached_tokens: int | None) -> float | None:
        """The prefill joules `cached_tokens` would have cost; None when the engine did not
        say how many it reused or no prefill has priced a token yet."""
        with self._lock:
            j_per_token = self._j_per_token
        if cached_tokens is None or j_per_token is None:
            return None
        return cached_tokens * j_per_token

    def forget(self) -> None:
        """Another model: the old price no longer holds."""
        with self._lock:
            self._j_per_token = None

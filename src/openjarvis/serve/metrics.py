"""`/metrics` for `jarvis serve` in Prometheus's text format (prometheus-client): joules per
source, requests, tokens, time to first token, latency, batch size and how long energy took to
be known, with the model as a label.

Each finished request adds its own energy as the meter attributed it (shared requests their
share), so the counters add up to what the request log holds. A request whose energy (or a
source's) is unknown adds nothing to the joules: it is counted apart, with the reason.
"""

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from openjarvis.runtime.types import Completion
from openjarvis.serve.protocol import EnergyField

__all__ = ["CONTENT_TYPE", "ServeMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds: from a small model's first token on a GPU to a long reply on a laptop CPU.
_TIME_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Seconds from a request's end to its energy: about one counter refresh (NVML's 100 ms on an
# H200, RAPL's 1 ms), more where the ledger or the counter lags.
_DELAY_BUCKETS_S = (0.005, 0.025, 0.05, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class ServeMetrics:
    """The server's metrics in a registry of their own (not the process-wide default), so two
    servers in one process, as in tests, never share counters."""

    def __init__(self, model: str, in_flight: Callable[[], int]) -> None:
        self.model = model
        self.registry = CollectorRegistry()
        labels = ["model"]
        self.joules = Counter(
            "jarvis_energy_joules",
            "Energy of finished requests per source, as the meter attributed it (gross)",
            [*labels, "source", "method"],
            registry=self.registry,
        )
        self.requests = Counter(
            "jarvis_requests",
            "Finished requests",
            [*labels, "endpoint", "finish_reason"],
            registry=self.registry,
        )
        self.energy_unknown = Counter(
            "jarvis_requests_energy_unknown",
            "Finished requests whose energy could not be obtained, by reason (never counted as 0)",
            [*labels, "reason"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "jarvis_prompt_tokens",
            "Prompt tokens of finished requests",
            labels,
            registry=self.registry,
        )
        self.completion_tokens = Counter(
            "jarvis_completion_tokens",
            "Generated tokens of finished requests",
            labels,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "jarvis_time_to_first_token_seconds",
            "Request start to its first token",
            labels,
            buckets=_TIME_BUCKETS_S,
            registry=self.registry,
        )
        self.latency = Histogram(
            "jarvis_request_duration_seconds",
            "Request start to its last token",
            labels,
            buckets=_TIME_BUCKETS_S,
            registry=self.registry,
        )
        self.batch = Histogram(
            "jarvis_batch_size",
            "Mean number of sequences in the engine steps of each request (batching engines)",
            labels,
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self.energy_delay = Histogram(
            "jarvis_energy_delay_seconds",
            "A request's end (its last token) to the meter's publication of its energy",
            labels,
            buckets=_DELAY_BUCKETS_S,
            registry=self.registry,
        )
        in_flight_gauge = Gauge(
            "jarvis_requests_in_flight",
            "Requests generating now",
            labels,
            registry=self.registry,
        )
        in_flight_gauge.labels(model).set_function(lambda: float(in_flight()))

    def observe(
        self,
        endpoint: str,
        completion: Completion,
        energy: EnergyField,
        energy_delay_s: float | None,
    ) -> None:
        """Count one finished request; `energy_delay_s`: its end to its energy's publication
        (None: not published by the meter)."""
        model = self.model
        if energy_delay_s is not None:
            self.energy_delay.labels(model).observe(energy_delay_s)
        self.requests.labels(model, endpoint, completion.finish_reason).inc()
        self.prompt_tokens.labels(model).inc(completion.prompt_tokens)
        self.completion_tokens.labels(model).inc(completion.completion_tokens)
        self.latency.labels(model).observe(completion.wall_s)
        if completion.ttft_s is not None:
            self.ttft.labels(model).observe(completion.ttft_s)
        if energy["mean_batch"] is not None:
            self.batch.labels(model).observe(energy["mean_batch"])
        if energy["energy_j"] is None:
            self.energy_unknown.labels(model, energy["null_reason"] or "unknown").inc()
        for source in energy["sources"]:
            joules = source.get("energy_j")
            if not isinstance(joules, int | float):
                continue  # unknown: the request is counted above, with its reason
            if joules < 0:  # a counter cannot go down: say so rather than drop it
                self.energy_unknown.labels(model, "negative-source-energy").inc()
                continue
            self.joules.labels(model, str(source["source"]), str(source["method"])).inc(joules)

    def exposition(self) -> bytes:
        """The text a scrape of /metrics gets."""
        return generate_latest(self.registry)

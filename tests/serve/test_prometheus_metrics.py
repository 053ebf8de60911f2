"""`GET /metrics` on `jarvis serve` with the real embedded model: Prometheus's text format, as
prometheus-client's own parser reads it, and counters that grow with a request."""

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings
from openjarvis.runtime.models import resolve_model
from openjarvis.serve import EnergyServer, running_server

pytestmark = pytest.mark.e2e

KEY = "metrics-test-key"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def server() -> Iterator[EnergyServer]:
    model = resolve_model(None)
    engine = LlamaCppEngine(model.path, LlamaCppSettings(n_ctx=1024), name=model.name)
    with running_server(engine, None, api_key=KEY) as running:
        yield running
    engine.close()


def _scrape(server: EnergyServer) -> Samples:
    """What a Prometheus scrape (curl with the bearer token) reads, parsed by its parser."""
    root = server.url.removesuffix("/v1")
    reply = httpx.get(f"{root}/metrics", headers={"authorization": f"Bearer {KEY}"})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def _total(samples: Samples, name: str) -> float:
    return sum(value for (sample, _), value in samples.items() if sample == name)


def test_metrics_need_the_key_like_every_route(server: EnergyServer) -> None:
    reply = httpx.get(server.url.removesuffix("/v1") + "/metrics")
    assert reply.status_code == 401


def test_the_energy_counter_grows_after_a_request(server: EnergyServer) -> None:
    before = _scrape(server)
    body = {
        "model": "gemma-3-270m-Q4_K_M",
        "prompt": "The sea is",
        "max_tokens": 12,
        "temperature": 0,
    }
    reply = httpx.post(
        f"{server.url}/completions",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
        timeout=120,
    )
    assert reply.status_code == 200
    energy = reply.json()["energy"]
    after = _scrape(server)
    model = (("model", "gemma-3-270m-Q4_K_M"),)
    grown_j = _total(after, "jarvis_energy_joules_total") - _total(
        before, "jarvis_energy_joules_total"
    )
    assert energy["energy_j"] is not None and energy["energy_j"] > 0
    # The counters hold each source's joules as the reply's energy field gives them.
    assert grown_j == pytest.approx(sum(s["energy_j"] for s in energy["sources"]))
    for source in energy["sources"]:
        labels = tuple(
            sorted({**dict(model), "source": source["source"], "method": source["method"]}.items())
        )
        assert after[("jarvis_energy_joules_total", labels)] >= source["energy_j"]
    usage = reply.json()["usage"]
    assert (
        _total(after, "jarvis_completion_tokens_total")
        - _total(before, "jarvis_completion_tokens_total")
        == usage["completion_tokens"]
    )
    assert (
        _total(after, "jarvis_prompt_tokens_total") - _total(before, "jarvis_prompt_tokens_total")
        == usage["prompt_tokens"]
    )
    finish = reply.json()["choices"][0]["finish_reason"]
    request_labels = {**dict(model), "endpoint": "/v1/completions", "finish_reason": finish}
    requests = ("jarvis_requests_total", tuple(sorted(request_labels.items())))
    assert after[requests] - before.get(requests, 0.0) == 1
    assert (
        after[("jarvis_request_duration_seconds_count", model)]
        - before.get(("jarvis_request_duration_seconds_count", model), 0.0)
        == 1
    )
    assert after[("jarvis_time_to_first_token_seconds_count", model)] >= 1
    # The reply's energy was published after its end: one delay, positive, about a refresh
    # (RAPL's or the estimate's here; a few seconds would mean the meter waited for something).
    delays = ("jarvis_energy_delay_seconds_count", model)
    assert after[delays] - before.get(delays, 0.0) == 1
    delay_s = after[("jarvis_energy_delay_seconds_sum", model)] - before.get(
        ("jarvis_energy_delay_seconds_sum", model), 0.0
    )
    assert 0 <= delay_s < 2.0
    assert after[("jarvis_requests_in_flight", model)] == 0

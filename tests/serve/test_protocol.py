"""The OpenAI wire format: request bodies to engine requests, energy to the `energy` field."""

import pytest

from openjarvis.power.types import SourceEnergy, WindowEnergy
from openjarvis.runtime.types import ChatMessage, ChatRequest, EnergyEstimate, GenerationRequest
from openjarvis.serve.protocol import BadRequest, energy_field, parse_request

WINDOW = WindowEnergy(
    label="r",
    start_s=10.0,
    end_s=12.0,
    scope="system",
    method="estimate",
    energy_j=30.0,
    net_energy_j=12.0,
    null_reason=None,
    sources=(SourceEnergy("estimate:cpu", "cpu", "estimate", 30.0, 12.0, 9.0),),
)


def test_chat_body_becomes_a_chat_request() -> None:
    parsed = parse_request(
        {
            "model": "x",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
                },
            ],
            "max_completion_tokens": 7,
            "stop": "END",
            "temperature": None,
            "response_format": {"type": "json_object"},
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        chat=True,
    )
    assert parsed.request == ChatRequest(
        (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi there")),
        max_tokens=7,
        stop=("END",),
        temperature=1.0,  # null is the API's default, as absent is
        json_schema={"type": "object"},
    )
    assert parsed.stream and parsed.include_usage and parsed.id.startswith("chatcmpl-")


def test_completions_body_becomes_a_generation_request() -> None:
    parsed = parse_request({"prompt": ["def f():"], "temperature": 0, "seed": 3}, chat=False)
    assert parsed.request == GenerationRequest("def f():", None, temperature=0.0, seed=3)
    assert not parsed.stream and parsed.id.startswith("cmpl-")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text content"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "'n' is not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "positive integer"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "a number"),
        (
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
            "json",
        ),
        # Both once raised a TypeError or AttributeError: a 500 instead of a 400.
        ({"messages": [{"role": "user", "content": "x"}], "stop": 5}, "'stop' must be"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema", "json_schema": "x"},
            },
            "with a schema",
        ),
    ],
)
def test_unusable_bodies_are_bad_requests(body: dict[str, object], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_request(body, chat=True)


def test_energy_field_from_the_meter_window() -> None:
    energy = energy_field(WINDOW, None)
    assert (energy["energy_j"], energy["net_energy_j"], energy["method"]) == (
        30.0,
        12.0,
        "estimate",
    )
    assert energy["duration_s"] == 2.0
    assert energy["sources"] == [
        {
            "source": "estimate:cpu",
            "domain": "cpu",
            "method": "estimate",
            "energy_j": 30.0,
            "net_energy_j": 12.0,
            "null_reason": None,
        }
    ]


def test_an_estimate_replaces_the_local_window() -> None:
    estimate = EnergyEstimate("estimate:cloud:frontier", 5.0, "class frontier")
    energy = energy_field(WINDOW, estimate)
    assert (energy["energy_j"], energy["net_energy_j"], energy["method"]) == (5.0, None, "estimate")
    assert [s["source"] for s in energy["sources"]] == ["estimate:cloud:frontier"]  # type: ignore[attr-defined]
    assert energy["basis"] == "class frontier"

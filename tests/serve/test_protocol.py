"""The OpenAI wire format: request bodies to engine requests, energy to the `energy` field."""

import dataclasses
import json

from openjarvis.power.types import SourceEnergy, WindowEnergy
from openjarvis.runtime.types import ChatMessage, ChatRequest, EnergyEstimate, GenerationRequest
from openjarvis.serve.protocol import ChatBody, CompletionBody, energy_field, parse_request

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
SHARED = dataclasses.replace(WINDOW, shared=True, mean_batch=12.5)


def test_chat_body_becomes_a_chat_request() -> None:
    body = ChatBody.model_validate_json(
        json.dumps(
            {
                "model": "x",
                "messages": [
                    {"role": "developer", "content": "Be brief."},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Hi "},
                            {"type": "text", "text": "there"},
                        ],
                    },
                ],
                "max_completion_tokens": 7,
                "stop": "END",
                "temperature": None,
                "response_format": {"type": "json_object"},
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
    )
    parsed = parse_request(body)
    assert parsed.request == ChatRequest(
        (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi there")),
        max_tokens=7,
        stop=("END",),
        temperature=1.0,  # null is the API's default, as absent is
        json_schema={"type": "object"},
    )
    assert parsed.chat and parsed.stream and parsed.include_usage
    assert parsed.id.startswith("chatcmpl-")


def test_completions_body_becomes_a_generation_request() -> None:
    body = CompletionBody.model_validate_json(
        '{"prompt": ["def f():"], "temperature": 0, "seed": 3}'
    )
    parsed = parse_request(body)
    assert parsed.request == GenerationRequest("def f():", None, temperature=0.0, seed=3)
    assert not parsed.chat and not parsed.stream and parsed.id.startswith("cmpl-")


def test_a_json_schema_is_passed_on() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body = ChatBody.model_validate(
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            },
        }
    )
    assert parse_request(body).request.json_schema == schema


def test_energy_field_from_the_meter_window() -> None:
    energy = energy_field(WINDOW, None)
    assert (energy["energy_j"], energy["net_energy_j"], energy["method"]) == (
        30.0,
        12.0,
        "estimate",
    )
    assert energy["duration_s"] == 2.0
    assert (energy["shared"], energy["mean_batch"]) == (False, None)
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
    assert [s["source"] for s in energy["sources"]] == ["estimate:cloud:frontier"]
    assert energy["basis"] == "class frontier"


def test_a_shared_window_says_so_with_its_mean_batch() -> None:
    energy = energy_field(SHARED, None)
    assert (energy["shared"], energy["mean_batch"]) == (True, 12.5)

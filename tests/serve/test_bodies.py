"""Bodies the server cannot use get a 4xx in OpenAI's error shape naming the field, never a 500;
over HTTP, against the batching fake (the engine is never reached)."""

from collections.abc import Iterator

import httpx
import pytest

from openjarvis.serve import EnergyServer, running_server
from tests.serve.batching_fake import FakeBatchingEngine

KEY = "k"
USER = [{"role": "user", "content": "x"}]


@pytest.fixture(scope="module")
def server() -> Iterator[EnergyServer]:
    with running_server(FakeBatchingEngine(), None, api_key=KEY) as running:
        yield running


def _post(server: EnergyServer, path: str, content: bytes | str) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    return httpx.post(f"{server.url}{path}", content=content, headers=headers, timeout=10)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ('{"messages": [}', None, "not valid JSON"),
        ("", None, "not valid JSON"),
        ("[1, 2]", None, "must be a JSON object"),
        ("{}", "messages", "Field required"),
        ('{"messages": []}', "messages", "at least 1 item"),
        ('{"messages": [{"role": "tool", "content": "x"}]}', "messages.0.role", "'user'"),
        ('{"messages": [{"content": "x"}]}', "messages.0.role", "Field required"),
        ('{"messages": [{"role": "user", "content": 5}]}', "messages.0.content", "text parts"),
        (
            '{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
            "messages.0.content",
            "only text content parts",
        ),
        ('{"messages": "hi"}', "messages", "valid array"),
        (
            '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            "max_tokens",
            "greater than or equal to 1",
        ),
        ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}', "max_tokens", ""),
        (
            '{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
            "temperature",
            "valid number",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}], "temperature": 5}',
            "temperature",
            "less than or equal to 2",
        ),
        ('{"messages": [{"role": "user", "content": "x"}], "stop": 5}', "stop", "list of strings"),
        (
            '{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}',
            "response_format.type",
            "json_schema",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}],'
            ' "response_format": {"type": "json_schema", "json_schema": "x"}}',
            "response_format.json_schema",
            "",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}], "response_format": '
            '{"type": "json_schema"}}',
            "response_format.json_schema",
            "needs json_schema.schema",
        ),
        ('{"messages": [{"role": "user", "content": "x"}], "n": 2}', "n", "'n' is not supported"),
        (
            '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
            "tools",
            "'tools' is not supported",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "stream",
            "valid boolean",
        ),
    ],
)
def test_chat_bodies_are_refused_naming_the_field(
    server: EnergyServer, body: str, param: str | None, message: str
) -> None:
    response = _post(server, "/chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert message in error["message"]
    if param is not None:
        assert param in error["message"]  # named in the words a client shows, too


@pytest.mark.parametrize(
    ("body", "param"),
    [('{"prompt": ["a", "b"]}', "prompt"), ('{"prompt": 3}', "prompt"), ("{}", "prompt")],
)
def test_completion_bodies_are_refused_naming_the_field(
    server: EnergyServer, body: str, param: str
) -> None:
    response = _post(server, "/completions", body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_unknown_fields_are_ignored_and_a_good_body_is_answered(server: EnergyServer) -> None:
    body = '{"prompt": "hi", "max_tokens": 3, "top_p": 0.9, "user": "me", "stop": ["\\n"]}'
    response = _post(server, "/completions", body)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3


def test_key_routes_and_methods_answer_in_the_error_shape(server: EnergyServer) -> None:
    unauthorised = httpx.post(f"{server.url}/completions", json={"prompt": "x"})
    assert unauthorised.status_code == 401
    assert unauthorised.json()["error"]["type"] == "authentication_error"
    headers = {"authorization": f"Bearer {KEY}"}
    missing = httpx.get(f"{server.url}/nothing", headers=headers)
    assert missing.status_code == 404 and "/v1/nothing" in missing.json()["error"]["message"]
    wrong_method = httpx.get(f"{server.url}/completions", headers=headers)
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"]
    assert httpx.get(f"{server.url[:-3]}/health").json() == {"status": "ok"}


def test_an_authorization_header_without_bearer_is_refused(server: EnergyServer) -> None:
    """`Authorization: KEY` is no bearer token: refused, though the key is right."""
    for header in (KEY, f"Basic {KEY}"):
        refused = httpx.post(
            f"{server.url}/completions", json={"prompt": "x"}, headers={"authorization": header}
        )
        assert refused.status_code == 401
        assert refused.json()["error"]["message"] == (
            "the Authorization header must read `Bearer KEY`"
        )
    accepted = httpx.post(
        f"{server.url}/completions",
        json={"prompt": "x", "max_tokens": 1},
        headers={"authorization": f"bearer {KEY}"},  # the scheme is case-insensitive
    )
    assert accepted.status_code == 200


def test_another_models_name_gets_openais_404_and_the_served_names_are_taken(
    server: EnergyServer,
) -> None:
    unknown = _post(server, "/completions", '{"model": "gpt-4o", "prompt": "x"}')
    assert unknown.status_code == 404
    assert unknown.json()["error"] == {
        "message": "The model `gpt-4o` does not exist; this server serves `fake-batching` "
        "(GET /v1/models)",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    # Its name in any case, a path to its file (as `--model PATH` clients send), or none.
    for model in ("fake-batching", "FAKE-Batching", "/models/fake-batching.gguf", None):
        body = {"prompt": "x", "max_tokens": 1, **({"model": model} if model else {})}
        answered = httpx.post(
            f"{server.url}/completions",
            json=body,
            headers={"authorization": f"Bearer {KEY}"},
            timeout=10,
        )
        assert answered.status_code == 200, (model, answered.text)

"""HTTP for cloud engines: server-sent events over httpx, retries with backoff on 429 and 5xx,
timeouts, and errors turned into one-line UserErrors that never contain the API key.
"""

import itertools
import json
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from openjarvis.errors import UserError

__all__ = ["CloudHttp", "ServerEvent"]

_RETRIED_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}  # 529: Anthropic "overloaded"
_BACKOFF_CAP_S = 30.0


@dataclass(frozen=True, slots=True)
class ServerEvent:
    name: str | None  # the `event:` field; OpenAI-style streams send none
    data: dict[str, Any]  # parsed JSON


class CloudHttp:
    """One HTTP client per engine. `secret` is removed from every message it raises."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        *,
        secret: str | None,
        key_hint: str,
        timeout_s: float,
        max_retries: int,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._secret = secret
        self._key_hint = key_hint  # how to set the key, for 401 messages
        self._max_retries = max_retries
        self._sleep = sleep
        # The read timeout bounds the wait between two bytes, not a whole long generation.
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._client = httpx.Client(headers=headers, timeout=timeout)
        self.server_header: str | None = None  # the `server` header of the last reply, if any

    def get_json(self, path: str) -> Any:
        """GET `path` once (no retries: a probe) and return its JSON; UserError on any failure."""
        url = f"{self.base_url}{path}"
        try:
            response = self._client.get(url)
        except httpx.HTTPError as error:
            raise UserError(f"GET {url} failed: {self._clean(str(error)) or 'refused'}") from None
        self.server_header = response.headers.get("server", self.server_header)
        if response.status_code >= 400:
            raise UserError(f"GET {url} answered {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise UserError(f"GET {url} sent a body that is not JSON") from None

    def close(self) -> None:
        self._client.close()

    def _clean(self, text: str) -> str:
        text = " ".join(text.split())[:300]
        return text.replace(self._secret, "***") if self._secret else text

    @contextmanager
    def events(self, path: str, body: dict[str, object]) -> Iterator[Iterator[ServerEvent]]:
        """POST `body` and yield the response's events; retries happen before the first byte."""
        url = f"{self.base_url}{path}"
        for attempt in range(self._max_retries + 1):
            try:
                with self._client.stream("POST", url, json=body) as response:
                    self.server_header = response.headers.get("server", self.server_header)
                    if response.status_code in _RETRIED_STATUS and attempt < self._max_retries:
                        delay_s = _retry_after_s(response) or _backoff_s(attempt)
                        response.close()
                        self._sleep(delay_s)
                        continue
                    if response.status_code >= 400:
                        response.read()
                        raise self._status_error(response, attempt + 1)
                    yield _parse_events(response)
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                if attempt < self._max_retries:
                    self._sleep(_backoff_s(attempt))
                    continue
                raise UserError(
                    f"cannot reach {self.base_url} ({self._clean(str(error)) or 'refused'}) "
                    f"after {attempt + 1} tries; check --base-url and that the server runs"
                ) from None
            except httpx.TimeoutException:
                raise UserError(
                    f"{self.base_url} sent nothing for longer than the timeout; raise --timeout "
                    "or check the server"
                ) from None
            except httpx.HTTPError as error:
                raise UserError(
                    f"the connection to {self.base_url} failed: {self._clean(str(error))}"
                ) from None

    def _status_error(self, response: httpx.Response, tries: int) -> UserError:
        status = response.status_code
        if status in (401, 403):
            return UserError(f"{self.base_url} refused the API key ({status}); {self._key_hint}")
        detail = _error_message(response)
        if status in _RETRIED_STATUS:
            return UserError(
                f"{self.base_url} kept failing ({status}: {self._clean(detail)}) after {tries} "
                "tries; try again later"
            )
        return UserError(f"{self.base_url} rejected the request ({status}): {self._clean(detail)}")


def _backoff_s(attempt: int) -> float:
    # Full jitter keeps many clients that failed together from retrying together.
    return random.uniform(0, min(_BACKOFF_CAP_S, 0.5 * 2**attempt))


def _retry_after_s(response: httpx.Response) -> float | None:
    try:
        return min(_BACKOFF_CAP_S, max(0.0, float(response.headers.get("retry-after", ""))))
    except ValueError:
        return None


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return response.text or response.reason_phrase
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error or response.reason_phrase)


def _parse_events(response: httpx.Response) -> Iterator[ServerEvent]:
    """Server-sent events: `event:` and `data:` lines, a blank line ends one; [DONE] ends all."""
    name: str | None = None
    data: list[str] = []
    # The final "" ends an event that the server left unterminated.
    for line in itertools.chain(response.iter_lines(), [""]):
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            payload = "\n".join(data)
            if payload == "[DONE]":
                return
            try:
                yield ServerEvent(name, json.loads(payload))
            except json.JSONDecodeError:
                raise UserError(
                    f"{response.url.host} sent an event that is not JSON: {payload[:80]!r}"
                ) from None
            name, data = None, []

"""`jarvis serve`: an OpenAI-compatible HTTP server over any engine, each reply with its energy.

FastAPI on uvicorn, as Python's OpenAI-compatible servers are built. Requests run at once up to
min(--max-concurrency, the engine's concurrency), each in its own worker thread and meter window
(serve/generation.py); more wait in a bounded line, and beyond it get 429 (serve/admission.py).
A client that leaves is noticed as vLLM's server does (a task awaiting `http.disconnect` beside
the handler; Starlette's StreamingResponse does the same once a stream has begun), and its
engine generator is closed, which frees the sequence.
"""

import asyncio
import hmac
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from openjarvis.engine_kinds import LOCAL_ENGINE_KINDS
from openjarvis.errors import UserError
from openjarvis.power import Meter
from openjarvis.power.claims import Claim
from openjarvis.power.reuse import PrefillPrice
from openjarvis.power.types import GpuSelection, Scope
from openjarvis.runtime.cloud import measured_here
from openjarvis.runtime.heap import frozen_heap
from openjarvis.runtime.types import Completion, Engine, StreamChunk
from openjarvis.serve.admission import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_QUEUE,
    Admission,
    Overloaded,
    check_limits,
)
from openjarvis.serve.generation import Finished, Generation, Item
from openjarvis.serve.metrics import CONTENT_TYPE, ServeMetrics
from openjarvis.serve.protocol import (
    BadRequest,
    ChatBody,
    CompletionBody,
    EnergyField,
    ParsedRequest,
    chunk_body,
    completion_body,
    parse_request,
    serves_model,
)
from openjarvis.store import RequestLogRecord, Store, log_request

__all__ = ["EnergyServer", "running_server"]

_MAX_BODY_BYTES = 32 << 20
_T = TypeVar("_T")


class ApiError(Exception):
    """Answered with `status` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code


def _error(
    status: int, message: str, kind: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    headers = {"retry-after": "1"} if status == 429 else None
    return JSONResponse(body, status_code=status, headers=headers)


def _invalid_body(error: ValidationError) -> ApiError:
    """The first problem, naming its field as a dotted path (`messages.0.role`)."""
    first = error.errors(include_url=False)[0]
    param = ".".join(str(part) for part in first["loc"]) or None
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "json_invalid":
        message = f"the body is not valid JSON ({first['ctx']['error']})"
    elif param is None:
        message = "the body must be a JSON object"
    else:
        message = f"'{param}': {message}"
    more = error.error_count() - 1
    return ApiError(
        400, message + (f" (and {more} more)" if more else ""), "invalid_request_error", param
    )


def _event(body: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _text_events(parsed: ParsedRequest, model: str) -> Callable[[str], bytes]:
    """A stream's text chunk as an event, for any text: the chunk `chunk_body` makes, encoded
    once with a placeholder, then only each text is (a chunk per token: at 64 streams the
    whole chunk's encoding took a sixth of the server's interpreter). The chunks of a stream
    share its `created` time, as OpenAI's do."""
    placeholder = "\x00"  # json.dumps escapes it; no id or model name holds one
    head, *rest = _event(chunk_body(parsed, model, placeholder)).split(
        json.dumps(placeholder).encode()
    )
    assert len(rest) == 1, "the placeholder stands once in the chunk"
    tail = rest[0]
    return lambda text: head + json.dumps(text).encode() + tail


def _texts(batch: list[Item]) -> list[StreamChunk]:
    """The batch's chunks that carry text (Finished comes only last)."""
    return [item for item in batch if isinstance(item, StreamChunk) and item.text]


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(request: Request, work: Coroutine[Any, Any, _T]) -> _T | None:
    """Run `work`, cancelling it (None) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task in done:
        return task.result()
    with suppress(asyncio.CancelledError):
        await task  # let it unwind: its cleanup frees the slot and the engine
    return None


class _Stopping(Exception):
    """The server is shutting down while a stream is in flight."""


class _EventStream(StreamingResponse):
    """Server-sent events that call `end` however the response ends: finished, failed, or cut
    short by a client that left (perhaps before the first event was read)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], end: Callable[[], None]) -> None:
        super().__init__(events, headers={"cache-control": "no-cache"})
        self._end = end

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._end()


class EnergyServer:
    """The engine, the meter, the store and the admission behind the HTTP routes."""

    def __init__(
        self,
        engine: Engine,
        meter: Meter,
        store: Store | None,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        check_limits(max_concurrency, max_queue)
        self.engine = engine
        self.meter = meter
        meter.follow(engine.ledger)  # a batching engine's steps split the energy they share
        self.store = store  # None: requests are not logged (--no-log)
        # Sources of the meter's scope that another measurement held when the server started
        # (source -> who): replies' energy then includes that measurement's draw.
        self.shared_with: dict[str, str] = {}
        # An engine of concurrency 1 takes requests in turn, so their windows never overlap; a
        # batching engine's overlap, and the meter splits them by the work each did.
        self.admission = Admission(min(max_concurrency, engine.concurrency), max_queue)
        self._api_key = api_key
        self.prefill_price = PrefillPrice()  # prices the prefill a cached prefix saved
        self._generations: set[Generation] = set()
        self._generations_lock = threading.Lock()
        # Set on the server's loop when it shuts down: streams end with an error event and
        # [DONE] instead of being cut (a client error, and tracebacks from the ASGI server).
        self._stopping = False  # set on the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self.metrics = ServeMetrics(engine.model_name, in_flight=lambda: len(self._generations))
        try:
            self._socket = socket.create_server((host, port))
        except OSError as error:  # create_server appends the address to strerror: use errno
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise UserError(
                f"cannot listen on {host}:{port} ({reason}); pass another --port"
            ) from None
        self.app = self._routes()
        config = uvicorn.Config(
            self.app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=2
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._socket.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> None:
        """Serve from a background thread; returns once the server accepts requests."""
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [self._socket]}, name="jarvis-serve"
        )
        self._thread.start()
        while not self._uvicorn.started:
            if not self._thread.is_alive():
                raise RuntimeError("the HTTP server stopped while starting; see stderr")
            time.sleep(0.01)

    def shutdown(self) -> None:
        """Stop serving; generations still running are cancelled and awaited, so that the
        engine can be closed safely afterwards. Streams in flight end first, with an error
        event and [DONE]."""
        if self._loop is not None:
            with suppress(RuntimeError):  # the loop has already closed
                self._loop.call_soon_threadsafe(self._stop_streams)
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self._socket.close()
        with self._generations_lock:
            running = list(self._generations)
        for generation in running:
            generation.cancel()
        for generation in running:
            generation.join()

    def _authorise(self, request: Request) -> None:
        if self._api_key is None:
            return
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, given = header.strip().partition(" ")
            if scheme.lower() != "bearer":  # `Authorization: KEY` is no bearer token
                raise ApiError(
                    401, "the Authorization header must read `Bearer KEY`", "authentication_error"
                )
        else:
            given = request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.strip().encode(), self._api_key.encode()):
            raise ApiError(401, "missing or wrong API key", "authentication_error")

    # Routes --------------------------------------------------------------------------------

    def _routes(self) -> FastAPI:
        app = FastAPI(title="jarvis serve", docs_url=None, redoc_url=None)

        @app.exception_handler(ApiError)
        async def api_error(request: Request, error: ApiError) -> JSONResponse:
            return _error(error.status, str(error), error.kind, error.param, error.code)

        @app.exception_handler(HTTPException)
        async def http_error(request: Request, error: HTTPException) -> JSONResponse:
            kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
            return _error(error.status_code, f"{error.detail}: {request.url.path}", kind)

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/metrics")
        async def metrics(request: Request) -> Response:
            self._authorise(request)  # with --api-key, Prometheus sends it as a bearer token
            return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

        @app.get("/v1/models")
        async def models(request: Request) -> dict[str, object]:
            self._authorise(request)
            model = {
                "id": self.engine.model_name,
                "object": "model",
                "created": 0,
                "owned_by": "openjarvis",
            }
            return {"object": "list", "data": [model]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await self._answer(request, ChatBody, "/v1/chat/completions")

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await self._answer(request, CompletionBody, "/v1/completions")

        return app

    async def _answer(
        self, request: Request, model: type[ChatBody | CompletionBody], endpoint: str
    ) -> Response:
        self._authorise(request)
        if int(request.headers.get("content-length") or 0) > _MAX_BODY_BYTES:
            raise ApiError(413, "the body is over 32 MiB", "invalid_request_error")
        try:
            received = model.model_validate_json(await request.body())
            parsed = parse_request(received)
        except ValidationError as error:
            raise _invalid_body(error) from None
        except BadRequest as error:
            raise ApiError(400, str(error), "invalid_request_error", error.param) from None
        served = self.engine.model_name
        if not serves_model(received.model, served):  # as OpenAI and vLLM answer another model
            raise ApiError(
                404,
                f"The model `{received.model}` does not exist; this server serves `{served}` "
                "(GET /v1/models)",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        started_at = datetime.now(UTC)
        try:
            if parsed.stream:
                first = await _unless_client_leaves(
                    request, self._begin(parsed, endpoint, started_at)
                )
                if first is None:
                    return Response(status_code=499)  # nobody reads it
                generation, batch = first
                return _EventStream(self._events(generation, batch), lambda: self._end(generation))
            done = await _unless_client_leaves(request, self._whole(parsed, endpoint, started_at))
            if done is None:
                return Response(status_code=499)
            body = completion_body(parsed, self.engine.model_name, done.completion, done.energy)
            return JSONResponse(body)
        except Overloaded as error:
            raise ApiError(429, str(error), "rate_limit_error") from None
        except UserError as error:  # the engine refused the request (e.g. the context is full)
            raise ApiError(400, str(error), "invalid_request_error") from None
        except Exception:
            traceback.print_exc(file=sys.stderr)  # a bug: keep its traceback for the report
            raise ApiError(500, "internal error; see the server's stderr", "server_error") from None

    async def _begin(
        self, parsed: ParsedRequest, endpoint: str, started_at: datetime
    ) -> tuple[Generation, list[Item]]:
        """Wait for a slot, start the generation and wait for its first items (errors before
        them still become a plain HTTP error)."""
        admission = self.admission
        await admission.acquire()
        try:
            generation = Generation(
                self.engine,
                self.meter,
                parsed,
                engine_free=admission.release_soon,
                finished=lambda c, e, d: self._log(endpoint, parsed, c, e, d, started_at),
            )
            with self._generations_lock:
                self._generations.add(generation)
            generation.start()
        except BaseException:
            admission.release()
            raise
        try:
            return generation, await generation.next_batch()
        except BaseException:
            generation.cancel()
            self._forget(generation)
            raise

    async def _whole(self, parsed: ParsedRequest, endpoint: str, started_at: datetime) -> Finished:
        generation, batch = await self._begin(parsed, endpoint, started_at)
        try:
            while not isinstance(batch[-1], Finished):
                batch = await generation.next_batch()
            return batch[-1]
        finally:
            self._end(generation)

    async def _events(self, generation: Generation, first: list[Item]) -> AsyncIterator[bytes]:
        """The stream's events, those of a batch of chunks in one write; Starlette stops
        reading them when the client disconnects."""
        parsed, model = generation.parsed, self.engine.model_name
        self._loop = asyncio.get_running_loop()
        try:
            # The role comes first.
            events = [_event(chunk_body(parsed, model, ""))] if parsed.chat else []
            text_event = _text_events(parsed, model)
            batch = first
            while not isinstance(finished := batch[-1], Finished):
                events += [text_event(c.text) for c in _texts(batch)]
                if events:
                    yield b"".join(events)
                events = []
                batch = await self._next_unless_stopping(generation)
            events += [text_event(c.text) for c in _texts(batch)]
            completion, energy = finished.completion, finished.energy
            reason = completion.finish_reason
            events.append(_event(chunk_body(parsed, model, "", reason, energy=energy)))
            if parsed.include_usage:
                events.append(_event(chunk_body(parsed, model, None, None, completion, energy)))
            yield b"".join(events)
        except UserError as error:  # the headers are gone: the error travels as an event
            yield _event({"error": {"message": str(error), "type": "invalid_request_error"}})
        except _Stopping:
            message = "the server is shutting down; the reply was cut short"
            yield _event({"error": {"message": message, "type": "server_error"}})
        except Exception:
            traceback.print_exc(file=sys.stderr)
            message = "internal error; see the server's stderr"
            yield _event({"error": {"message": message, "type": "server_error"}})
        yield b"data: [DONE]\n\n"

    async def _next_unless_stopping(self, generation: Generation) -> list[Item]:
        """The generation's next items, or _Stopping once the server shuts down."""
        if self._stopping:
            raise _Stopping
        return await generation.next_batch()

    def _stop_streams(self) -> None:
        """On the loop, at shutdown: every stream's next wait raises _Stopping (one awaited
        queue per stream, rather than a second task per batch to watch for this)."""
        self._stopping = True
        with self._generations_lock:
            streams = [g for g in self._generations if g.parsed.stream]
        for generation in streams:
            generation.interrupt(_Stopping())

    def _end(self, generation: Generation) -> None:
        generation.cancel()  # a no-op once finished; frees the engine if the client left
        self._forget(generation)

    def _forget(self, generation: Generation) -> None:
        with self._generations_lock:
            self._generations.discard(generation)

    def _log(
        self,
        endpoint: str,
        parsed: ParsedRequest,
        completion: Completion,
        energy: EnergyField,
        energy_delay_s: float | None,
        started_at: datetime,
    ) -> None:
        self.metrics.observe(endpoint, completion, energy, energy_delay_s)
        prefill_j = energy.get("prefill_energy_j")
        self.prefill_price.observe(completion.prompt_tokens, completion.cached_tokens, prefill_j)
        if self.store is None:
            return
        record = RequestLogRecord(
            endpoint=endpoint,
            model_name=self.engine.model_name,
            engine=self.engine.kind,
            stream=parsed.stream,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            finish_reason=completion.finish_reason,
            wall_s=completion.wall_s,
            ttft_s=completion.ttft_s,
            decode_tokens_per_s=completion.decode_tokens_per_s,
            energy_j=energy["energy_j"],
            net_energy_j=energy["net_energy_j"],
            energy_method=energy["method"],
            energy_scope=energy["scope"],
            energy_null_reason=energy["null_reason"],
            energy_sources=list(energy["sources"]),
            shared=energy["shared"],
            mean_batch=energy["mean_batch"],
            cost_usd=completion.cost_usd,
            cached_tokens=completion.cached_tokens,
            prefill_energy_j=prefill_j,
            prefill_saved_j=self.prefill_price.saved_j(completion.cached_tokens),
            started_at=started_at,
        )
        log_request(self.store, record)


@contextmanager
def running_server(
    engine: Engine,
    store: Store | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    scope: Scope = "system",
    idle_seconds: float = 0.0,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    max_queue: int = DEFAULT_MAX_QUEUE,
) -> Iterator[EnergyServer]:
    """A server in a background thread with its own meter, for `jarvis serve`, tests and benches.

    The meter reads the GPUs the engine runs on, not every visible one (docs/energy.md, "Scope").
    It keeps no history: a server runs for days and never asks for the total of its windows."""
    # A server on this machine behind this one says not which GPUs it uses: all visible count.
    beside = measured_here(engine) and engine.kind not in LOCAL_ENGINE_KINDS
    gpus: GpuSelection = "all" if beside else engine.devices
    with Meter.discover(scope=scope, gpus=gpus, keep_history=False) as meter:
        # The server claims the sources it meters (power/claims.py), so that an `ipw measure`
        # started beside it is told; one already measuring is reported, not refused.
        local = measured_here(engine)
        claim = meter.claim(f"jarvis serve on {engine.model_name}") if local else Claim()
        try:
            if idle_seconds > 0:
                meter.measure_idle(idle_seconds)
            server = EnergyServer(
                engine,
                meter,
                store,
                host=host,
                port=port,
                api_key=api_key,
                max_concurrency=max_concurrency,
                max_queue=max_queue,
            )
            server.shared_with = dict(claim.taken)
            # What start-up built lives as long as the server: no collection walks it
            # (a full one stopped every request for up to 0.2 s under load).
            with frozen_heap():
                server.start()
                try:
                    yield server
                finally:
                    server.shutdown()
        finally:
            claim.release()

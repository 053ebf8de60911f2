"""`jarvis serve`: an OpenAI-compatible HTTP server over any engine, each reply with its energy.

Built on the standard library's ThreadingHTTPServer: one model answers one request at a time
(one llama.cpp context; and whole-device energy windows must not overlap, or a joule would be
charged twice), so an async framework would buy nothing here and would cost a dependency.
"""

import hmac
import itertools
import json
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import socket
from typing import Any

from openjarvis.errors import UserError
from openjarvis.power import Meter
from openjarvis.power.claims import Claim
from openjarvis.power.types import Scope
from openjarvis.runtime.engines import LOCAL_ENGINE_KINDS
from openjarvis.runtime.types import Completion, Engine
from openjarvis.serve.protocol import (
    BadRequest,
    EnergyField,
    ParsedRequest,
    chunk_body,
    completion_body,
    energy_field,
    parse_request,
)
from openjarvis.store import RequestLogRecord, Store, log_request

__all__ = ["EnergyServer", "running_server"]

_MAX_BODY_BYTES = 32 << 20
_ENDPOINTS = {"/v1/chat/completions": True, "/v1/completions": False}  # path -> chat?


class EnergyServer:
    """The engine, the meter and the store behind the HTTP handler; requests take turns."""

    def __init__(
        self,
        engine: Engine,
        meter: Meter,
        store: Store | None,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
    ) -> None:
        self.engine = engine
        self.meter = meter
        self.store = store  # None: requests are not logged (--no-log)
        # Sources of the meter's scope that another measurement held when the server started
        # (source -> who): replies' energy then includes that measurement's draw.
        self.shared_with: dict[str, str] = {}
        self._api_key = api_key
        self._turn = threading.Lock()
        try:
            self.httpd = _HttpServer((host, port), _Handler)
        except OSError as error:
            raise UserError(
                f"cannot listen on {host}:{port} ({error.strerror}); pass another --port"
            ) from None
        self.httpd.app = self

    @property
    def url(self) -> str:
        host, port = self.httpd.socket.getsockname()[:2]  # server_address, typed as str | bytes
        return f"http://{host}:{port}/v1"

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def authorised(self, headers: dict[str, str]) -> bool:
        if self._api_key is None:
            return True
        given = headers.get("authorization", "").removeprefix("Bearer ").strip()
        given = given or headers.get("x-api-key", "")
        return hmac.compare_digest(given.encode(), self._api_key.encode())

    def answer(self, handler: "_Handler", parsed: ParsedRequest, endpoint: str) -> None:
        # Each request is logged before its reply ends: a client that has the reply finds it.
        # The engine is held only while it generates: the window's energy resolves once the
        # counters have refreshed past its end (about one NVML refresh, ~0.1 s), and the next
        # request does not wait for that.
        started_at = datetime.now(UTC)
        if parsed.stream:
            self._stream(
                handler, parsed, lambda c, e: self._log(endpoint, parsed, c, e, started_at)
            )
            return
        with self._turn, self.meter.window(parsed.id) as window:
            completion = self.engine.generate(parsed.request)
        energy = energy_field(window.result, completion.energy_estimate)
        self._log(endpoint, parsed, completion, energy, started_at)
        model = self.engine.model_name
        handler.send_json(200, completion_body(parsed, model, completion, energy))

    def _stream(
        self,
        handler: "_Handler",
        parsed: ParsedRequest,
        log: Callable[[Completion, EnergyField], None],
    ) -> None:
        """Stream the reply; a client that leaves early gets nothing logged (no completion)."""
        model = self.engine.model_name
        completion: Completion | None = None
        self._turn.acquire()
        holding = True  # the engine: released once generation ends, before the energy resolves
        try:
            chunks = self.engine.stream(parsed.request)
        except BaseException:
            self._turn.release()
            raise
        try:
            with self.meter.window(parsed.id) as window:
                first = next(chunks)  # errors here still become a plain 400 reply
                handler.start_stream()
                if parsed.chat:
                    handler.send_event(chunk_body(parsed, model, ""))  # the role comes first
                try:
                    for chunk in itertools.chain([first], chunks):
                        if chunk.text:
                            handler.send_event(chunk_body(parsed, model, chunk.text))
                        completion = chunk.completion or completion
                except UserError as error:  # headers are gone: the error travels as an event
                    handler.send_event({"error": {"message": str(error), "type": "server_error"}})
                    handler.end_stream()
                    return
            assert completion is not None, "every stream ends with its completion"
            chunks.close()
            self._turn.release()  # the engine is free; this reply waits for its energy alone
            holding = False
            energy = energy_field(window.result, completion.energy_estimate)
            finish = chunk_body(parsed, model, "", completion.finish_reason, energy=energy)
            handler.send_event(finish)
            if parsed.include_usage:
                handler.send_event(chunk_body(parsed, model, None, None, completion, energy))
            log(completion, energy)
            handler.end_stream()
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            chunks.close()  # frees the engine when a client leaves early
            if holding:
                self._turn.release()

    def _log(
        self,
        endpoint: str,
        parsed: ParsedRequest,
        completion: Completion,
        energy: EnergyField,
        started_at: datetime,
    ) -> None:
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
            cost_usd=completion.cost_usd,
            started_at=started_at,
        )
        log_request(self.store, record)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    app: EnergyServer  # set once the server is built

    def handle_error(self, request: socket | tuple[bytes, socket], client_address: Any) -> None:
        # A client that hangs up on a kept-alive connection is normal, not a server error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection
    server_version = "jarvis-serve"

    @property
    def app(self) -> EnergyServer:
        assert isinstance(self.server, _HttpServer)
        return self.server.app

    def log_message(self, format: str, *args: object) -> None:
        pass  # the request log is the store; stderr stays quiet

    def send_json(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, message: str, kind: str) -> None:
        self.send_json(status, {"error": {"message": message, "type": kind, "code": None}})

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _send_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def send_event(self, body: dict[str, object]) -> None:
        self._send_chunk(b"data: " + json.dumps(body).encode() + b"\n\n")

    def end_stream(self) -> None:
        self._send_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _headers(self) -> dict[str, str]:
        return {name.lower(): value for name, value in self.headers.items()}

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif not self.app.authorised(self._headers()):
            self.send_error_json(401, "missing or wrong API key", "authentication_error")
        elif self.path.rstrip("/") == "/v1/models":
            model = {
                "id": self.app.engine.model_name,
                "object": "model",
                "created": 0,
                "owned_by": "openjarvis",
            }
            self.send_json(200, {"object": "list", "data": [model]})
        else:
            self.send_error_json(404, f"no route {self.path}", "not_found_error")

    def do_POST(self) -> None:
        chat = _ENDPOINTS.get(self.path.rstrip("/"))
        if not self.app.authorised(self._headers()):
            self.send_error_json(401, "missing or wrong API key", "authentication_error")
            return
        if chat is None:
            self.send_error_json(404, f"no route {self.path}", "not_found_error")
            return
        length = int(self.headers.get("content-length") or 0)
        if not 0 < length <= _MAX_BODY_BYTES:
            self.send_error_json(400, "a JSON body with content-length is required", "invalid")
            return
        try:
            parsed = parse_request(json.loads(self.rfile.read(length)), chat)
            self.app.answer(self, parsed, self.path.rstrip("/"))
        except (BadRequest, UserError, json.JSONDecodeError) as error:
            self.send_error_json(400, str(error), "invalid_request_error")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left; nothing to answer
        except Exception:
            traceback.print_exc(file=sys.stderr)  # a bug: keep its traceback for the report
            self.send_error_json(500, "internal error; see the server's stderr", "server_error")


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
) -> Iterator[EnergyServer]:
    """A server in a background thread with its own meter, for `jarvis serve`, tests and benches.

    The meter reads the GPUs the engine runs on, not every visible one (docs/energy.md, "Scope")."""
    with Meter.discover(scope=scope, gpus=engine.devices) as meter:
        # The server claims the sources it meters (power/claims.py), so that an `ipw measure`
        # started beside it is told; one already measuring is reported, not refused.
        local = engine.kind in LOCAL_ENGINE_KINDS
        claim = meter.claim(f"jarvis serve on {engine.model_name}") if local else Claim()
        try:
            if idle_seconds > 0:
                meter.measure_idle(idle_seconds)
            server = EnergyServer(engine, meter, store, host=host, port=port, api_key=api_key)
            server.shared_with = dict(claim.taken)
            thread = threading.Thread(target=server.serve_forever, name="jarvis-serve", daemon=True)
            thread.start()
            try:
                yield server
            finally:
                server.shutdown()
                thread.join()
        finally:
            claim.release()

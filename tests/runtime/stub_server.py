"""A scripted HTTP server on 127.0.0.1 for the cloud engine's tests: the network edge.

Each request takes the next scripted reply (status, headers, SSE events or a JSON body) and is
recorded with its headers and JSON body, so tests can check what the engine sent. A GET is
answered from `gets` by path (404 for a path it lacks; the requests list records POSTs only).
"""

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Reply", "StubServer", "sse", "stub_server"]


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def sse(*events: Mapping[str, object], names: tuple[str, ...] = (), done: bool = True) -> Reply:
    """A 200 reply streaming `events` as server-sent events (with `event:` names if given)."""
    lines = []
    for index, event in enumerate(events):
        if names:
            lines.append(f"event: {names[index]}")
        lines += [f"data: {json.dumps(event)}", ""]
    if done:
        lines += ["data: [DONE]", ""]
    return Reply(200, "\n".join(lines).encode() + b"\n", {"content-type": "text/event-stream"})


@dataclass
class StubServer:
    url: str
    replies: list[Reply]
    # (path, headers, JSON body) of each POST
    requests: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    gets: dict[str, Reply] = field(default_factory=dict)


@contextmanager
def stub_server(replies: list[Reply], gets: dict[str, Reply] | None = None) -> Iterator[StubServer]:
    stub = StubServer("", list(replies), gets=dict(gets or {}))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(stub.gets.get(self.path, Reply(404, b'{"error": "not found"}')))

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            stub.requests.append((self.path, dict(self.headers.items()), body))
            self._answer(stub.replies.pop(0))

        def _answer(self, reply: Reply) -> None:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep test output clean

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    stub.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()

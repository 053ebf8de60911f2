"""The OpenAI-compatible HTTP server (`jarvis serve`) over any engine, with per-request energy.

Start one with `running_server(engine, store)`; the wire format lives in `protocol`, admission
(concurrency and the waiting line) in `admission`, a request's worker thread in `generation`.
The server (FastAPI, uvicorn) is imported on first use, so the CLI can read the defaults of
`admission` without loading the web stack.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openjarvis.serve.server import EnergyServer, running_server

__all__ = ["EnergyServer", "running_server"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from openjarvis.serve import server

        return getattr(server, name)
    raise AttributeError(f"module 'openjarvis.serve' has no attribute {name!r}")

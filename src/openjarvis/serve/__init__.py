"""The OpenAI-compatible HTTP server (`jarvis serve`) over any engine, with per-request energy.

Start one with `running_server(engine, store)`; the wire format lives in `protocol`.
"""

from openjarvis.serve.server import EnergyServer, running_server

__all__ = ["EnergyServer", "running_server"]

"""The server leaves what start-up built out of the collector's full passes while it serves
(runtime/heap.py): one such pass stopped every request for up to 0.2 s on the H200."""

import gc

import httpx

from openjarvis.serve import running_server
from tests.serve.batching_fake import FakeBatchingEngine


def test_the_start_up_heap_is_frozen_while_the_server_serves_and_given_back_after() -> None:
    assert gc.get_freeze_count() == 0
    with running_server(FakeBatchingEngine(), None) as server:
        assert gc.get_freeze_count() > 0
        reply = httpx.get(f"{server.url}/models", timeout=10)
        assert reply.status_code == 200
    assert gc.get_freeze_count() == 0

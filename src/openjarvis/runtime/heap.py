"""The start-up heap, out of the garbage collector's way while a process serves.

By the time `jarvis serve`, `ipw measure`'s task phase or the torch engine's core starts its
work, start-up has built a large heap: torch's modules, the tokenizer's tables, compiled
graphs. CPython's full collection walks every object it tracks, and on the H200 one stopped
every thread of the server for 87-207 ms in the middle of a 64-client load (docs/benchmarks.md),
which is what a reply's energy then waited for. The objects alive when the work starts live
about as long as it does: `gc.freeze()` moves them where no collection walks (vLLM's API server
does the same after its start-up; SGLang around its graph capture). Objects made afterwards
are collected as before, and everything is given back to the collector when the work ends.

While the work goes on, the young generation is also collected less often: CPython collects it
once 700 more objects are tracked than freed, and with the heap frozen a 64-client load on the
H200 still ran 725 young collections, 936 ms in all, in a 15-second level; with the threshold
at `YOUNG_THRESHOLD` it ran one (17 ms). The energy's delay to a reply did not fall with them
(docs/benchmarks.md, 2026-12-03).
"""

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["YOUNG_THRESHOLD", "frozen_heap"]

YOUNG_THRESHOLD = 20_000

# The blocks open now (a count of our own: a library may have frozen objects before the first).
_open = 0
_lock = threading.Lock()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Leave every object alive now out of the collector's passes until the block ends, and
    collect the young generation less often meanwhile. Inside another such block, the outer
    one gives the heap back (`gc.unfreeze` gives back everything at once); a heap that was
    frozen before the outer block began (by a library) is left frozen."""
    global _open
    with _lock:
        _open += 1
        outermost = _open == 1
        if outermost:  # what the outermost block gives back at its end
            thresholds = gc.get_threshold()
            frozen_before = gc.get_freeze_count() > 0
            gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            if outermost:
                gc.set_threshold(*thresholds)
                if not frozen_before:
                    gc.unfreeze()

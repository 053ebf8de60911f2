"""`frozen_heap` inside another gives the heap back only when the outer one ends."""

import gc

from openjarvis.runtime.heap import frozen_heap


def test_an_inner_block_leaves_the_outer_ones_heap_frozen() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        with frozen_heap():
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0

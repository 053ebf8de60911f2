"""`frozen_heap` inside another gives the heap back only when the outer one ends."""

import gc

from openjarvis.runtime.heap import YOUNG_THRESHOLD, frozen_heap


def test_an_inner_block_leaves_the_outer_ones_heap_frozen() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        with frozen_heap():
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_the_young_generation_is_collected_less_often_while_working_and_as_before_after() -> None:
    before = gc.get_threshold()
    with frozen_heap():
        assert gc.get_threshold()[0] == max(before[0], YOUNG_THRESHOLD)
        assert gc.get_threshold()[1:] == before[1:]
        with frozen_heap():
            assert gc.get_threshold()[0] == max(before[0], YOUNG_THRESHOLD)
        assert gc.get_threshold()[0] == max(before[0], YOUNG_THRESHOLD)
    assert gc.get_threshold() == before


def test_a_heap_a_library_froze_before_leaves_the_young_threshold_raised_and_stays_frozen() -> None:
    """The block's own count says which block is the outermost, not the collector's freeze
    count: torch or another library may have frozen objects before the server started."""
    before = gc.get_threshold()
    gc.freeze()  # as a library would at import
    try:
        frozen = gc.get_freeze_count()
        with frozen_heap():
            assert gc.get_threshold()[0] == max(before[0], YOUNG_THRESHOLD)
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() >= frozen  # the library's objects are not given back
    finally:
        gc.unfreeze()

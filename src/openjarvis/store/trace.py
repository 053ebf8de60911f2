"""Power traces packed for storage: samples of one source become float64 arrays in chunks.

Packing is little-endian on every machine, so databases merge between architectures.
"""

import sys
from array import array
from collections.abc import Iterator, Sequence
from itertools import pairwise, repeat
from typing import Any

from openjarvis.records import PowerSampleRecord

__all__ = [
    "TRACE_CHUNK_SAMPLES",
    "PowerSeries",
    "pack_chunks",
    "series_to_samples",
    "sort_by_time",
    "unpack_chunk",
]

TRACE_CHUNK_SAMPLES = 8192  # 128 KiB of arrays a row: small rows, few of them


def _to_bytes(values: array) -> bytes:
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


def _from_bytes(data: bytes) -> array:
    values = array("d")
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    return values


def pack_chunks(run_id: str, samples: Sequence[PowerSampleRecord]) -> Iterator[dict[str, Any]]:
    """Rows of power_trace_chunk for `samples`, grouped by source, each source's order kept."""
    by_source: dict[str, list[PowerSampleRecord]] = {}
    for sample in samples:
        by_source.setdefault(sample.source, []).append(sample)
    for source, group in by_source.items():
        # Arrays built from whole lists: a third faster than appending sample by sample.
        times = array("d", [sample.time_s for sample in group])
        watts = array("d", [sample.power_w for sample in group])
        for start in range(0, len(times), TRACE_CHUNK_SAMPLES):
            chunk_times = times[start : start + TRACE_CHUNK_SAMPLES]
            yield {
                "run_id": run_id,
                "source": source,
                "samples": len(chunk_times),
                "start_s": min(chunk_times),
                "times_s": _to_bytes(chunk_times),
                "power_w": _to_bytes(watts[start : start + TRACE_CHUNK_SAMPLES]),
            }


# One source's trace: seconds since the run started and watts, as float64 arrays.
PowerSeries = tuple[array, array]


def unpack_chunk(source: str, times_s: bytes, power_w: bytes) -> PowerSeries:
    times, watts = _from_bytes(times_s), _from_bytes(power_w)
    if len(times) != len(watts):
        raise ValueError(
            f"corrupt power trace chunk of {source}: {len(times)} times, {len(watts)} W"
        )
    return times, watts


def sort_by_time(times: array, watts: array) -> PowerSeries:
    """The series in time order: as it is when chunks were added in order (checked in one
    pass), else sorted (stable: equal times keep their order)."""
    if all(a <= b for a, b in pairwise(times)):
        return times, watts
    order = sorted(range(len(times)), key=times.__getitem__)
    return array("d", (times[i] for i in order)), array("d", (watts[i] for i in order))


def series_to_samples(series: dict[str, PowerSeries]) -> list[PowerSampleRecord]:
    """Every source's samples as records, in the order of the dict and of each series."""
    return [
        sample
        for source, (times, watts) in series.items()
        for sample in map(PowerSampleRecord, repeat(source, len(times)), times, watts)
    ]

"""Timing helper shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timings(fn: Callable[[int], object], repeats: int) -> tuple[float, float]:
    """(median, best) seconds of `repeats` calls of ``fn(i)``. Shared machines only ever add time, so
    the best is the cleaner figure of the code itself; the median is what a user sees on a busy
    machine."""
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)

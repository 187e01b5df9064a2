"""Wall and CPU time of one call, as the benchmarks record them."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wall_and_cpu(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, its wall seconds and this process's CPU seconds (on a shared machine, or as one process of a
    launch, the CPU time is the fairer measure: the load changes between calls)."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu

"""Time as the experiments measure and show it: a call's wall and CPU time (what the benchmarks record), and
:class:`Progress`, the line a long stage prints as it works through known units of work, with an estimate of the
time left."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, ContextManager, Iterator, TypeVar

T = TypeVar("T")

#: seconds between two progress lines of a loop whose units of work finish faster than that
PROGRESS_EVERY = 15.0


def wall_and_cpu(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, its wall seconds and this process's CPU seconds (on a shared machine, or as one process of a
    launch, the CPU time is the fairer measure: the load changes between calls)."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def format_duration(seconds: float) -> str:
    """A duration as a progress line shows it: ``45s``, ``1m05s``, ``2h03m`` (whole seconds, rounded)."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _to_stderr(line: str) -> None:
    # the stage lines go to stderr (experiments.runtime.run_folder.StageTimer): progress goes with them
    print(line, file=sys.stderr, flush=True)


class Progress:
    """How far a stage has come through ``total`` known units of work, and when it will be done.

    The stage calls :meth:`advance` as each unit ends (a circuit method, a stability run, a learning step, a
    merge); the first advance after ``every`` seconds without a line, and the last one, print::

          methods: 2/5, elapsed 10m12s, ETA 15m18s
          methods: 5/5, elapsed 25m40s

    The estimate assumes each unit left takes as long as the mean unit so far (elapsed / done). Units that turn
    out to need no work (a run whose result is reused) are taken off the total with :meth:`skip`, so that their
    zero cost does not shorten the estimate. Plain lines, one at a time (no bar that redraws itself), so they
    read the same in a terminal and in a log file.

    ``clock`` (seconds, default :func:`time.perf_counter`) and ``write`` (where a line goes, default stderr, beside
    the stage lines) are what a test replaces.
    """

    def __init__(self, total: int, label: str, *, every: float = PROGRESS_EVERY,
                 clock: Callable[[], float] = time.perf_counter, write: Callable[[str], None] = _to_stderr):
        self.total, self.label, self.every = int(total), label, every
        self.clock, self.write = clock, write
        self.done = 0
        self.started = self._last_line = clock()

    def advance(self, n: int = 1) -> None:
        """``n`` more units done; print a line if ``every`` seconds have passed since the last one, or at the end."""
        self.done += n
        now = self.clock()
        if self.done >= self.total or now - self._last_line >= self.every:
            self._last_line = now
            self.write(self.line(now))

    def skip(self, n: int = 1) -> None:
        """``n`` units that needed no work: taken off the total, not counted as done (no line is printed)."""
        self.total -= n

    def line(self, now: float | None = None) -> str:
        """``  label: done/total, elapsed 1m05s, ETA 3m20s`` (no ETA before the first unit or after the last)."""
        elapsed = (self.clock() if now is None else now) - self.started
        text = f"  {self.label}: {self.done}/{self.total}, elapsed {format_duration(elapsed)}"
        if 0 < self.done < self.total:
            text += f", ETA {format_duration(elapsed / self.done * (self.total - self.done))}"
        return text

    def counting(self, stage: Callable[[str], ContextManager]) -> Callable[[str], ContextManager[None]]:
        """The stage opener ``stage`` (e.g. ``Run.stage``) that also advances this progress as each stage it opens
        ends: for a library loop that opens one stage per unit of work (``compare_methods(..., stage=)``)."""

        @contextmanager
        def opened(name: str) -> Iterator[None]:
            with stage(name):
                yield
            self.advance()

        return opened

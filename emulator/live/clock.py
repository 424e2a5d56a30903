"""The local rank's clock in a live run: wall time, or a virtual time that only accounts.

A live run has one timeline, the local rank's, in seconds since the run began.

- ``wall``: local time is the wall clock. Waiting for emulated communication
  sleeps until the emulated completion time.
- ``virtual``: local time = wall time elapsed − emulator overhead + skew, where
  skew is the sum of every emulated wait. Nothing sleeps: the clock jumps to the
  completion time instead, so a run is as fast as its compute, and the time it
  reports is what the iteration would take on the emulated cluster. Time spent
  inside the emulator itself (costing a collective, copying mirror data) is
  overhead and is hidden from the virtual clock (``hidden()``), as a real
  collective library would do that work on its own stream.

Every change of the offset (local − wall) is kept, so a wall timestamp (from the
PyTorch profiler) maps back onto the local timeline (``local_of_wall``).
"""
from __future__ import annotations

import bisect
import time
from contextlib import contextmanager
from typing import Iterator

MODES = ("wall", "virtual")


class Clock:
    """``now()`` on the local timeline; ``advance_to(t)`` blocks (or jumps) until ``t``."""

    def __init__(self, mode: str = "wall") -> None:
        if mode not in MODES:
            raise ValueError(f"clock: expected one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.t0 = time.perf_counter()
        self.offset = 0.0  # local − (wall − t0): skew minus hidden overhead (virtual only)
        self.hidden_s = 0.0  # emulator overhead removed from the virtual clock
        self._changes_wall: list[float] = [0.0]  # wall (since t0) of each offset change
        self._changes_offset: list[float] = [0.0]
        self._frozen: float | None = None  # wall at the start of a hidden block (virtual)

    def wall(self) -> float:
        """Wall seconds since the run began."""
        return time.perf_counter() - self.t0

    def now(self) -> float:
        """Local time; inside a hidden block of the virtual clock it stands still (bar waits)."""
        return (self.wall() if self._frozen is None else self._frozen) + self.offset

    def _shift(self, delta: float) -> None:
        self.offset += delta
        self._changes_wall.append(self.wall())
        self._changes_offset.append(self.offset)

    def advance_to(self, t: float) -> float:
        """Block until local time ``t``; return how long the local rank was blocked."""
        gap = t - self.now()
        if gap <= 0:
            return 0.0
        if self.mode == "virtual":
            self._shift(gap)
        else:
            time.sleep(gap)
            while self.now() < t:  # sleep may wake a little early on some systems
                pass
        return gap

    @contextmanager
    def hidden(self) -> Iterator[None]:
        """Run emulator work whose wall time must not count as the rank's compute (virtual clock)."""
        if self.mode != "virtual" or self._frozen is not None:
            yield
            return
        self._frozen = self.wall()
        try:
            yield
        finally:
            spent = self.wall() - self._frozen
            self._frozen = None
            self.hidden_s += spent
            self._shift(-spent)

    def local_of_wall(self, wall_s: float) -> float:
        """The local time of a wall instant (seconds since t0), with the offset in force then."""
        i = bisect.bisect_right(self._changes_wall, wall_s) - 1
        return wall_s + self._changes_offset[max(i, 0)]

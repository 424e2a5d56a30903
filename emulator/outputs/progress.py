"""Progress: the one progress display of the command line, a tqdm bar on stderr.

Two things report progress: ``emulator run`` (simulated time and events of one
long simulation, shown only once it has run for ``RUN_DELAY_S``) and the studies
(points done of a sweep or search, with rate and ETA). Both draw through tqdm
(``points_bar``, ``RunProgress``) on stderr only, so no output file and no
stdout line changes. A bar is drawn only when stderr is a terminal, unless asked
with ``EMULATOR_PROGRESS=1``; ``EMULATOR_PROGRESS=0`` turns it off on a terminal
too. Off a terminal, a forced bar writes at most one line every ``LOG_EVERY_S``.
"""
from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # tqdm is imported where a bar is made: a run without one (--json, a pipe) skips it
    from tqdm import tqdm

RUN_DELAY_S = 2.0  # a run quicker than this shows no bar at all
TTY_EVERY_S = 0.2  # redraws on a terminal at most this often
LOG_EVERY_S = 5.0  # lines written to a file or pipe at most this often (EMULATOR_PROGRESS=1)


def wanted(stream: IO[str] | None = None) -> bool:
    """Whether to draw: ``EMULATOR_PROGRESS`` (1 on, 0 off) if set, else whether the stream is a terminal."""
    asked = os.environ.get("EMULATOR_PROGRESS", "").strip()
    if asked:
        return asked not in ("0", "false", "no", "off")
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _bar(stream: IO[str] | None, **kwargs: Any) -> tqdm[Any]:
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    tty = bool(isatty and isatty())
    return tqdm(file=stream, disable=not wanted(stream), mininterval=TTY_EVERY_S if tty else LOG_EVERY_S,
                dynamic_ncols=tty, leave=True, **kwargs)


def points_bar(total: int, label: str, stream: IO[str] | None = None) -> tqdm[Any]:
    """A sweep's or search's bar: ``label done/total points``, rate and ETA. Use ``reset(total=)``,
    ``update(1)`` per finished point, and ``close()``."""
    return _bar(stream, total=total, desc=label, unit="point")


class RunProgress:
    """The simulation's progress callback ``(simulated time s, events)``: a bar of events,
    simulated milliseconds and events/s, drawn only after ``delay_s`` of wall time."""

    def __init__(self, delay_s: float | None = None, stream: IO[str] | None = None) -> None:
        # no bar at all where none is drawn (tqdm's disabled bar draws nothing either)
        self.bar = _bar(stream, desc="simulating", unit=" events", unit_scale=True,
                        delay=RUN_DELAY_S if delay_s is None else delay_s) if wanted(stream) else None
        self.events = 0

    def __call__(self, now: float, events: int) -> None:
        if self.bar is None or self.bar.disable:
            return
        self.bar.set_postfix_str(f"simulated {now * 1e3:,.3f} ms", refresh=False)
        self.bar.update(events - self.events)
        self.events = events

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

"""Exposed communication per kind: which parallelism's traffic the iteration waits for.

The summary's ``exposed_comm`` (metrics.py) is, per rank, the time covered by some transfer
interval [xfer_s, end_s] and by no compute span (the optimizer step and the host ``cpu`` lane
are not compute). Here that time is split by the kind of communication, the rank's lane as
the Gantt chart names it (``tp``, ``cp``, ``ep``, ``pp``, ``dp``, ``zero``; gantt.lane): cut the
rank's timeline at every span boundary; each piece covered by no compute span and by
transfers of k lanes gives 1/k of its length to each of them. So the lanes of a rank add
up to its exposed communication exactly, and the mean over the simulated ranks (each stands
for the same number of copies) adds up to the summary's ``exposed_comm``.

Example: compute [0, 4), a ``tp`` transfer [3, 6), a ``dp`` transfer [5, 8): [4, 5) is tp's
alone (1), [5, 6) is shared (½ each), [6, 8) is dp's (2): tp 1.5, dp 2.5, together the
exposed 4 = |[3, 8)| − |[3, 4)|.

Pure: spans in, seconds out (numpy only).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np

from emulator.outputs.gantt import lane
from emulator.program import COPY_STREAMS, OFF_SM_STREAMS
from emulator.spans import Span


def _cover(starts: list[float], ends: list[float], cuts: np.ndarray) -> np.ndarray:
    """For each piece [cuts[i], cuts[i+1]): whether an interval [starts, ends) covers it."""
    depth = np.zeros(len(cuts), dtype=np.int64)
    np.add.at(depth, np.searchsorted(cuts, starts), 1)
    np.add.at(depth, np.searchsorted(cuts, ends), -1)
    return np.cumsum(depth)[:-1] > 0


def rank_exposure(spans: Iterable[Span]) -> dict[str, float]:
    """One rank's exposed communication by lane (seconds, over all its spans)."""
    compute: tuple[list[float], list[float]] = ([], [])
    lanes: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for s in spans:
        if s.kind == "compute" and s.stream not in COPY_STREAMS:  # a host copy is communication (d2h, h2d lanes)
            if s.end_s > s.start_s and s.stream not in OFF_SM_STREAMS and s.category != "optimizer":
                compute[0].append(s.start_s)
                compute[1].append(s.end_s)
        elif s.end_s > s.xfer_s:
            mine = lanes[lane(s.stream)]
            mine[0].append(s.xfer_s)
            mine[1].append(s.end_s)
    if not lanes:
        return {}
    points = [*compute[0], *compute[1]] + [t for a, b in lanes.values() for t in (*a, *b)]
    cuts = np.unique(np.asarray(points, dtype=float))
    width = np.diff(cuts)
    free = ~_cover(*compute, cuts)
    covers = {name: _cover(a, b, cuts) for name, (a, b) in sorted(lanes.items())}
    active = np.sum([c for c in covers.values()], axis=0)
    share = np.where(free & (active > 0), width / np.maximum(active, 1), 0.0)
    return {name: float(np.sum(share[c])) for name, c in covers.items()}


def exposure_by_lane(spans: Iterable[Span], iterations: int = 1) -> dict[str, float]:
    """Exposed communication per lane, per iteration, averaged over the simulated ranks (the ranks
    that have spans); lanes in the order tp, cp, ep, pp, dp, zero, then any other by name."""
    by_rank: dict[int, list[Span]] = defaultdict(list)
    for s in spans:
        by_rank[s.rank].append(s)
    if not by_rank:
        return {}
    total: dict[str, float] = defaultdict(float)
    for mine in by_rank.values():
        for name, t in rank_exposure(mine).items():
            total[name] += t
    n = len(by_rank) * max(1, iterations)
    order = ("tp", "cp", "ep", "pp", "dp", "zero")
    names = sorted(total, key=lambda k: (order.index(k) if k in order else len(order), k))
    return {k: total[k] / n for k in names}

"""Metrics: throughput, FLOP rates and the time breakdown, from spans only.

Breakdown of the iteration time T, per simulated rank, then averaged over ranks
(each simulated rank stands for the same number of copies):

- ``compute``: the union of compute spans (the optimizer step excluded, and the
  host-side ``cpu`` lane of imported traces, which is not GPU work);
- ``exposed_comm``: the union of transfer intervals [xfer_s, end_s] of
  communication not hidden under compute;
- ``bubble``: time with neither compute nor communication, when pp > 1
  (the pipeline bubble, including waits for other stages);
- ``other``: the optimizer step, and idle time when pp = 1 (waiting for
  stragglers, launch gaps).

compute + exposed_comm + bubble + other = T exactly.

FLOP rates: model TFLOP/s per GPU = model FLOPs / (T · gpus), MFU = that / peak;
HFU counts the recomputed work (hardware FLOPs).
"""
from __future__ import annotations

from dataclasses import dataclass

from emulator.spans import Span


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [a, b) intervals."""
    if not intervals:
        return 0.0
    intervals.sort()
    total = 0.0
    cur_a, cur_b = intervals[0]
    for a, b in intervals[1:]:
        if a > cur_b:
            total += cur_b - cur_a
            cur_a, cur_b = a, b
        elif b > cur_b:
            cur_b = b
    return total + (cur_b - cur_a)


@dataclass(frozen=True)
class Breakdown:
    compute: float
    exposed_comm: float
    bubble: float
    other: float

    def as_dict(self) -> dict[str, float]:
        return {"compute": self.compute, "exposed_comm": self.exposed_comm, "bubble": self.bubble,
                "other": self.other}


def breakdown(spans: list[Span], period: float, pipelined: bool, iterations: int = 1) -> Breakdown:
    """Per-iteration breakdown averaged over the simulated ranks (see module doc)."""
    per_rank: dict[int, tuple[list, list, list]] = {}
    for s in spans:
        bucket = per_rank.get(s.rank)
        if bucket is None:
            bucket = per_rank[s.rank] = ([], [], [])
        if s.kind == "compute" and (s.end_s <= s.start_s or s.stream == "cpu"):
            continue
        if s.kind == "compute":
            (bucket[2] if s.category == "optimizer" else bucket[0]).append((s.start_s, s.end_s))
        elif s.end_s > s.xfer_s:
            bucket[1].append((s.xfer_s, s.end_s))
    if not per_rank:
        return Breakdown(0.0, 0.0, 0.0, period)
    total = [0.0, 0.0, 0.0, 0.0]
    span_total = period * iterations
    for comp, comm, opt in per_rank.values():
        c = union_length(list(comp))
        cc = union_length(comp + comm)
        busy = union_length(comp + comm + opt)
        idle = max(0.0, span_total - busy)
        total[0] += c
        total[1] += cc - c
        total[2] += idle if pipelined else 0.0
        total[3] += (busy - cc) + (0.0 if pipelined else idle)
    n = len(per_rank) * iterations
    return Breakdown(*(x / n for x in total))

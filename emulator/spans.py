"""Spans: the flat, immutable records of what ran where and when.

Everything downstream (metrics, memory-free reports, CSV, Perfetto, Gantt) reads
spans only, never the live simulator. ``start_s`` is when the op started on its
stream; for communication ``xfer_s`` is when the transfer itself began (after the
rendezvous with the slowest member), so ``xfer_s − start_s`` is waiting.
"""
from __future__ import annotations

from typing import NamedTuple

CSV_COLUMNS = ("op_id", "rank", "stream", "kind", "name", "start_s", "end_s", "bytes", "flops",
               "microbatch", "stage")


class Span(NamedTuple):
    """One op's record (a named tuple: immutable, small, cheap to make by the million)."""

    op_id: int
    rank: int
    stream: str
    kind: str
    name: str
    start_s: float
    end_s: float
    bytes: float
    flops: float
    microbatch: int
    stage: int
    category: str = ""
    xfer_s: float = 0.0  # communication: when the transfer began
    layer: int = -1

    @property
    def duration(self) -> float:  # noqa: D102
        return self.end_s - self.start_s

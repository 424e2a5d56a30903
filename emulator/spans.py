"""Spans: the flat, immutable records of what ran where and when.

Everything downstream (metrics, memory-free reports, CSV, Perfetto, Gantt) reads
spans only, never the live simulator. ``start_s`` is when the op started on its
stream; for communication ``xfer_s`` is when the transfer itself began (after the
rendezvous with the slowest member), so ``xfer_s − start_s`` is waiting.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Iterator, NamedTuple

CSV_COLUMNS = ("op_id", "rank", "stream", "kind", "name", "start_s", "end_s", "bytes", "flops",
               "microbatch", "stage")


_STATIC = ("stream", "kind", "name", "bytes", "flops", "microbatch", "stage", "category", "layer")


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


class SpanTable(Sequence):
    """The spans of a run as a read-only sequence of Span, made on access.

    The engine keeps per-op times in flat lists and the static fields once per
    *template* op (an unfolded run's ranks share their representatives' ops:
    ``emulator.folding.Stamped``). Copy k of template op t is entry k·T + t: its
    op id is ``ids[t] + k·stride`` and its rank ``rank_maps[k][ranks[t]]``.
    Materialising 21M Span tuples would cost ~5 GB; iterating makes them on the fly
    (C-level ``map``/``zip``, ~0.15 µs each).
    """

    def __init__(self, static: list[tuple], ids: list[int], ranks: list[int], rank_maps: list[dict[int, int] | None],
                 stride: int, start: Sequence[float], end: Sequence[float], xfer: Sequence[float]) -> None:
        # static[t] = (stream, kind, name, bytes, flops, microbatch, stage, category, layer)
        self._cols: list[tuple] | None = None  # the static fields as columns, made when first needed
        self._static = static
        self._ids, self._ranks, self._maps, self._stride = ids, ranks, rank_maps, stride
        self._start, self._end, self._xfer = start, end, xfer
        self._T = len(ids)

    def __len__(self) -> int:
        return self._T * len(self._maps)

    def _copy(self, k: int) -> tuple[list[int], list[int]]:
        off, m = k * self._stride, self._maps[k]
        ids = self._ids if not off else [x + off for x in self._ids]
        ranks = self._ranks if m is None else [m[r] for r in self._ranks]
        return ids, ranks

    def __iter__(self) -> Iterator[Span]:
        T = self._T
        stream, kind, name, nbytes, flops, mb, stage, cat, layer = self._columns()
        new = tuple.__new__
        for k in range(len(self._maps)):
            ids, ranks = self._copy(k)
            a, b = k * T, (k + 1) * T
            rows = zip(ids, ranks, stream, kind, name, self._start[a:b], self._end[a:b], nbytes, flops, mb, stage,
                       cat, self._xfer[a:b], layer)
            yield from map(new, repeat(Span), rows)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return list(self)[index]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("span index out of range")
        k, t = divmod(index, self._T)
        st = self._static[t]
        m = self._maps[k]
        return Span(self._ids[t] + k * self._stride, self._ranks[t] if m is None else m[self._ranks[t]], st[0], st[1],
                    st[2], self._start[index], self._end[index], st[3], st[4], st[5], st[6], st[7], self._xfer[index],
                    st[8])

    def column(self, name: str) -> tuple:
        """One static field (``stream``, ``kind``, ``category``, ...) of each *template* op; span
        i has the value of template op i mod T (``copies`` copies of the template)."""
        if self._cols is not None:
            return self._cols[_STATIC.index(name)]
        i = _STATIC.index(name)
        return tuple(st[i] for st in self._static)

    def _columns(self) -> list[tuple]:
        if self._cols is None:
            self._cols = list(zip(*self._static)) if self._static else [()] * 9
        return self._cols

    @property
    def copies(self) -> int:  # noqa: D102
        return len(self._maps)

    def ranks(self) -> list[int]:
        """The rank of every span, in order (without making the spans)."""
        out: list[int] = []
        for k in range(len(self._maps)):
            out.extend(self._copy(k)[1])
        return out

    def times(self) -> tuple[Sequence[float], Sequence[float], Sequence[float]]:
        """The start, end and transfer-start time of every span, in order."""
        return self._start, self._end, self._xfer

    def rank_count(self) -> int:
        """How many distinct ranks have spans (without making them)."""
        return len({r if m is None else m[r] for m in self._maps for r in set(self._ranks)})

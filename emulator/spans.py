"""Spans: the flat, immutable records of what ran where and when.

Everything downstream (metrics, memory-free reports, CSV, Perfetto, Gantt) reads
spans only, never the live simulator. ``start_s`` is when the op started on its
stream; for communication ``xfer_s`` is when the transfer itself began (after the
rendezvous with the slowest member), so ``xfer_s − start_s`` is waiting.

May import: nothing of the emulator (the bottom layer).
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Iterator, NamedTuple, Protocol

CSV_COLUMNS = ("op_id", "rank", "stream", "kind", "name", "start_s", "end_s", "bytes", "flops",
               "microbatch", "stage")


STATIC = ("stream", "kind", "name", "bytes", "flops", "microbatch", "stage", "category", "layer")


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


class StaticFields(Protocol):
    """What a SpanTable reads the fixed fields of its *template* ops from, column by column:
    ``column(name)`` for each name of ``STATIC`` and for ``id`` and ``rank``."""

    def __len__(self) -> int: ...

    def column(self, name: str) -> Sequence: ...


class SpanTable(Sequence):
    """The spans of a run as a read-only sequence of Span, made on access.

    The engine keeps per-op times in flat lists and the static fields once per
    *template* op (an unfolded run's ranks share their representatives' ops:
    ``emulator.run.folding.Stamped``). Copy k of template op t is entry k·T + t: its
    op id is ``ids[t] + k·stride`` and its rank ``rank_maps[k][ranks[t]]``.
    Materialising 21M Span tuples would cost ~5 GB; iterating makes them on the fly
    (C-level ``map``/``zip``, ~0.15 µs each). The static fields are read from the ops
    column by column, each when first needed (the metrics need three of the nine; a row
    tuple per op cost ~130 B of the 1.4 GB of a 1.84M-op run).
    """

    def __init__(self, static: StaticFields, rank_maps: list[dict[int, int] | None], stride: int,
                 start: Sequence[float], end: Sequence[float], xfer: Sequence[float]) -> None:
        self._source = static
        self._cols: dict[str, Sequence] = {}
        self._maps, self._stride = rank_maps, stride
        self._start, self._end, self._xfer = start, end, xfer
        self._T = len(static)

    @property
    def _ids(self) -> Sequence[int]:
        return self.column("id")

    @property
    def _ranks(self) -> Sequence[int]:
        return self.column("rank")

    def __len__(self) -> int:
        return self._T * len(self._maps)

    def _copy(self, k: int) -> tuple[Sequence[int], Sequence[int]]:
        off, m = k * self._stride, self._maps[k]
        ids = self._ids if not off else [x + off for x in self._ids]
        ranks = self._ranks if m is None else [m[r] for r in self._ranks]
        return ids, ranks

    def __iter__(self) -> Iterator[Span]:
        T = self._T
        stream, kind, name, nbytes, flops, mb, stage, cat, layer = (self.column(c) for c in STATIC)
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
        st = [self.column(c)[t] for c in STATIC]
        m = self._maps[k]
        return Span(self._ids[t] + k * self._stride, self._ranks[t] if m is None else m[self._ranks[t]], st[0], st[1],
                    st[2], self._start[index], self._end[index], st[3], st[4], st[5], st[6], st[7], self._xfer[index],
                    st[8])

    def column(self, name: str) -> Sequence:
        """One static field (``stream``, ``kind``, ``category``, ..., or ``id``, ``rank``) of each
        *template* op; span i has the value of template op i mod T (``copies`` copies of it)."""
        col = self._cols.get(name)
        if col is None:
            col = self._cols[name] = self._source.column(name)
        return col

    @property
    def copies(self) -> int:  # noqa: D102
        return len(self._maps)

    def ranks(self) -> list[int]:
        """The rank of every span, in order (without making the spans)."""
        out: list[int] = []
        for k in range(len(self._maps)):
            out.extend(self._copy(k)[1])
        return out

    def copy_ranks(self) -> list[dict[int, int] | None] | None:
        """Per copy, its world rank of each template rank (None: the same rank); None where two
        copies share a world rank."""
        template = set(self._ranks)
        seen: set[int] = set()
        for m in self._maps:
            mine = template if m is None else {m[r] for r in template}
            if seen & mine:
                return None
            seen |= mine
        return list(self._maps)

    def times(self) -> tuple[Sequence[float], Sequence[float], Sequence[float]]:
        """The start, end and transfer-start time of every span, in order."""
        return self._start, self._end, self._xfer

    def rank_count(self) -> int:
        """How many distinct ranks have spans (without making them)."""
        ranks = set(self._ranks)  # once, not per copy
        return len({r if m is None else m[r] for m in self._maps for r in ranks})

    def ids(self) -> list[int]:
        """The op id of every span, in order (without making the spans)."""
        out: list[int] = []
        for k in range(len(self._maps)):
            out.extend(self._copy(k)[0])
        return out


def by_rank(spans: Sequence[Span]) -> list[Span]:
    """The spans ordered by (rank, start_s, op_id), the order of spans.csv and trace.json. A
    SpanTable is ordered on its columns (``numpy.lexsort``, stable as ``sorted`` is), with no key
    tuple per span: 1.8M spans in about a second, where ``sorted`` took three."""
    if not isinstance(spans, SpanTable):
        return sorted(spans, key=lambda s: (s.rank, s.start_s, s.op_id))
    import numpy as np

    start = np.asarray(spans.times()[0], dtype=float)[:len(spans)]
    order = np.lexsort((np.asarray(spans.ids()), start, np.asarray(spans.ranks())))
    rows = list(spans)
    return [rows[i] for i in order.tolist()]

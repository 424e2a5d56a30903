"""Metrics: throughput, FLOP rates and the time breakdown, from spans only.

Breakdown of the iteration time T, per simulated rank, then averaged over ranks
(each simulated rank stands for the same number of copies):

- ``compute``: the union of compute spans (the optimizer step excluded, and the
  host-side ``cpu`` lane of imported traces, which is not GPU work);
- ``exposed_comm``: the union of transfer intervals [xfer_s, end_s] of
  communication not hidden under compute (the copies to and from host memory of activation offloading,
  streams ``d2h`` and ``h2d``, count as communication);
- ``bubble``: time with neither compute nor communication, when pp > 1
  (the pipeline bubble, including waits for other stages);
- ``other``: the optimizer step, and idle time when pp = 1 (waiting for
  stragglers, launch gaps).

compute + exposed_comm + bubble + other = T exactly, for the average and for every
rank (``per_rank``; outputs/ranks.py expands it over a fold's copies).

FLOP rates: model TFLOP/s per GPU = model FLOPs / (T · gpus), MFU = that / peak;
HFU counts the recomputed work (hardware FLOPs).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from emulator.program import COPY_STREAMS, OFF_SM_STREAMS
from emulator.spans import Span, SpanTable


def union_length(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray) -> float:
    """Length of the union of the intervals [starts[i], ends[i]) (vectorised: sort by start,
    a running maximum of the ends, a new segment wherever a start passes it).

    Only the starts' order matters: intervals with one start fall in one segment in any order
    (the later ones start at most at the running maximum), whose end is their greatest end. So
    starts already in order (a stream's kernels) are not sorted again, and the rest are sorted
    by a stable sort, which merges the already-sorted runs of a rank's streams in linear time
    (it was a two-key lexsort: 0.7 ms against 0.18 ms for 35k spans; the same result, bit for bit)."""
    if len(starts) == 0:
        return 0.0
    seg_start, seg_end = _segments(np.asarray(starts, dtype=float), np.asarray(ends, dtype=float))
    return float(np.sum(seg_end - seg_start))


def _segments(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals [a, b) (not empty) as disjoint segments, in order: (their starts, their ends)
    (``union_length``'s merge)."""
    if not (a[1:] >= a[:-1]).all():
        order = np.argsort(a, kind="stable")
        a, b = a[order], b[order]
    reach = np.maximum.accumulate(b)
    new = np.empty(len(a), dtype=bool)
    new[0] = True
    new[1:] = a[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    return a[firsts], np.maximum.reduceat(b, firsts)


@dataclass(frozen=True)
class Breakdown:
    compute: float
    exposed_comm: float
    bubble: float
    other: float

    def as_dict(self) -> dict[str, float]:
        return {"compute": self.compute, "exposed_comm": self.exposed_comm, "bubble": self.bubble,
                "other": self.other}


def _buckets(spans: Iterable[Span]) -> dict[int, list[array]] | dict[int, list[np.ndarray]]:
    """Per rank, six flat arrays: compute, communication and optimizer starts and ends."""
    if isinstance(spans, SpanTable):
        return _table_buckets(spans)
    per_rank: dict[int, list[array]] = {}
    for s in spans:
        b = per_rank.get(s.rank)
        if b is None:
            b = per_rank[s.rank] = [array("d") for _ in range(6)]
        if s.kind == "compute" and s.stream not in COPY_STREAMS:
            if s.end_s <= s.start_s or s.stream in OFF_SM_STREAMS:
                continue
            i = 4 if s.category == "optimizer" else 0
            b[i].append(s.start_s)
            b[i + 1].append(s.end_s)
        elif s.end_s > s.xfer_s:
            b[2].append(s.xfer_s)
            b[3].append(s.end_s)
    return per_rank


def _table_buckets(table: SpanTable, stream: str | tuple[str, ...] | None = None) -> dict[int, list[np.ndarray]]:
    """``_buckets`` of a SpanTable, from its columns (numpy; the same arrays, in the same order,
    as the loop over its spans gives: ranks in order of first appearance, spans in order). With
    ``stream``, only the communication on that stream, and the ranks in order of their first
    compute (optimizer aside) or kept communication span (as ``stream_time``'s loop meets them).

    A stamped program's copies run on ranks of their own, and a copy's spans are the template's
    (shifted by k·T): its ranks are grouped once, on the template's column, for every copy."""
    n = len(table)
    if not n:
        return {}
    kind = np.array(table.column("kind"), dtype=object)
    cpu = np.array([s in OFF_SM_STREAMS for s in table.column("stream")], dtype=bool)
    opt = np.array([c == "optimizer" for c in table.column("category")], dtype=bool)
    copy = np.array([s in COPY_STREAMS for s in table.column("stream")], dtype=bool)  # host copies: communication
    is_compute = np.tile((kind == "compute") & ~copy, table.copies)
    cpu, opt = np.tile(cpu, table.copies), np.tile(opt, table.copies)
    start, end, xfer = (np.frombuffer(a, dtype=float) if isinstance(a, array) else np.asarray(a, dtype=float)
                        for a in table.times())
    keep_c = is_compute & (end > start) & ~cpu
    keep_m = ~is_compute & (end > xfer)
    if stream is not None:
        wanted = (stream,) if isinstance(stream, str) else stream
        keep_m &= np.tile(np.array([s in wanted for s in table.column("stream")], dtype=bool), table.copies)
    copies = table.copy_ranks()
    if copies is None:  # copies sharing a rank: group the whole table as one
        ranks, copies, T = np.asarray(table.ranks(), dtype=np.int64), [None], n
    else:
        ranks, T = np.asarray(table.column("rank"), dtype=np.int64), n // len(copies)
    by_rank = np.argsort(ranks, kind="stable")  # each rank's spans together, in their order
    values, first, counts = np.unique(ranks, return_index=True, return_counts=True)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    out: dict[int, list[np.ndarray]] = {}
    met: dict[int, int] = {}  # rank → the index of its first compute or kept communication span
    for k, world in enumerate(copies):
        for v in np.argsort(first):  # ranks in order of first appearance
            mine = by_rank[bounds[v]:bounds[v + 1]]
            if k:
                mine = mine + k * T
            c = mine[keep_c[mine] & ~opt[mine]]
            o = mine[keep_c[mine] & opt[mine]]
            m = mine[keep_m[mine]]
            rank = int(values[v])
            rank = rank if world is None else world[rank]
            out[rank] = [start[c], end[c], xfer[m], end[m], start[o], end[o]]
            if len(c) or len(m):
                met[rank] = int(min(c[:1].tolist() + m[:1].tolist()))
    if stream is None:
        return out
    return {rank: out[rank] for rank in sorted(met, key=met.__getitem__)}


def _rank_parts(bucket: list[array] | list[np.ndarray], span_total: float,
                pipelined: bool) -> tuple[float, float, float, float]:
    """(compute, exposed_comm, bubble, other) of one rank over all iterations."""
    cs, ce, ms, me, os_, oe = (np.asarray(a, dtype=float) for a in bucket)
    c = union_length(cs, ce)
    cc = union_length(np.concatenate((cs, ms)), np.concatenate((ce, me)))
    busy = union_length(np.concatenate((cs, ms, os_)), np.concatenate((ce, me, oe)))
    idle = max(0.0, span_total - busy)
    return c, cc - c, idle if pipelined else 0.0, (busy - cc) + (0.0 if pipelined else idle)


Totals = dict[int, tuple[float, float, float, float]]  # rank → its four parts over all iterations


def rank_totals(spans: Iterable[Span], period: float, pipelined: bool, iterations: int = 1) -> Totals:
    """Each simulated rank's (compute, exposed_comm, bubble, other) over all iterations, by rank:
    the one pass over the spans that :func:`mean_breakdown` and :func:`per_rank` share."""
    span_total = period * iterations  # in the spans' order of ranks: the mean sums them in that order
    return {rank: _rank_parts(bucket, span_total, pipelined) for rank, bucket in _buckets(spans).items()}


def mean_breakdown(totals: Totals, period: float, iterations: int = 1) -> Breakdown:
    """Per-iteration breakdown averaged over the simulated ranks (see module doc)."""
    if not totals:
        return Breakdown(0.0, 0.0, 0.0, period)
    total = [0.0, 0.0, 0.0, 0.0]
    for parts in totals.values():
        for i, part in enumerate(parts):
            total[i] += part
    n = len(totals) * iterations
    return Breakdown(*(x / n for x in total))


def per_rank(totals: Totals, iterations: int = 1) -> dict[int, Breakdown]:
    """The per-iteration breakdown of each simulated rank (each adds up to the iteration time)."""
    return {rank: Breakdown(*(x / iterations for x in parts)) for rank, parts in sorted(totals.items())}


def breakdown(spans: Iterable[Span], period: float, pipelined: bool, iterations: int = 1) -> Breakdown:
    """Per-iteration breakdown averaged over the simulated ranks (see module doc)."""
    return mean_breakdown(rank_totals(spans, period, pipelined, iterations), period, iterations)


def layer_time(spans: Iterable[Span], kind_of: dict[int, str], iterations: int = 1) -> dict[str, float]:
    """Seconds per iteration of the compute stream's kernels of each layer kind (``kind_of``: a layer's index to
    its kind; other layers are left out), averaged over the simulated ranks that run any of them. Seconds of
    kernels, not of the wall: kernels that overlap count each."""
    total: dict[str, float] = {}
    ranks: set[int] = set()
    for s in spans:
        kind = kind_of.get(s.layer)
        if kind is None or s.kind != "compute" or s.stream != "compute" or s.category == "optimizer":
            continue
        total[kind] = total.get(kind, 0.0) + (s.end_s - s.start_s)
        ranks.add(s.rank)
    n = max(1, len(ranks)) * max(1, iterations)
    return {k: total[k] / n for k in sorted(total)}


def stream_time(spans: Iterable[Span], stream: str | tuple[str, ...], iterations: int = 1) -> tuple[float, float]:
    """(busy, exposed) seconds per iteration of the communication on ``stream`` (the MoE dispatch's "ep"; or on
    any of several, as one: the offload copies' "d2h" and "h2d"),
    averaged over the simulated ranks that use it: busy is the union of its transfers, exposed the part
    of it under no compute span (so exposed ≤ the breakdown's exposed_comm). (0, 0) if no rank uses it."""
    if isinstance(spans, SpanTable):  # from the columns: the same arrays, in the same order, as the loop's
        return _stream_time([b[:4] for b in _table_buckets(spans, stream).values()], iterations)
    per: dict[int, list[list[float]]] = {}
    for s in spans:
        if s.kind == "compute" and s.stream not in COPY_STREAMS:
            if s.end_s > s.start_s and s.stream not in OFF_SM_STREAMS and s.category != "optimizer":
                per.setdefault(s.rank, [[], [], [], []])
                per[s.rank][0].append(s.start_s)
                per[s.rank][1].append(s.end_s)
        elif (s.stream == stream if isinstance(stream, str) else s.stream in stream) and s.end_s > s.xfer_s:
            per.setdefault(s.rank, [[], [], [], []])
            per[s.rank][2].append(s.xfer_s)
            per[s.rank][3].append(s.end_s)
    return _stream_time([[np.asarray(x, dtype=float) for x in b] for b in per.values()], iterations)


def _stream_time(per: list[list[np.ndarray]], iterations: int) -> tuple[float, float]:
    """``stream_time`` of each rank's compute (starts, ends) and the stream's transfers (starts, ends)."""
    busy = exposed = 0.0
    users = 0
    for cs, ce, ms, me in per:
        if not len(ms):
            continue
        users += 1
        c = union_length(cs, ce)
        busy += union_length(ms, me)
        exposed += union_length(np.concatenate((cs, ms)), np.concatenate((ce, me))) - c
    if not users:
        return 0.0, 0.0
    return busy / users / iterations, exposed / users / iterations


def host_time(spans: Iterable[Span], iterations: int = 1) -> tuple[float, float]:
    """(issuing, waited) seconds per iteration of the host's issuing (the ``cpu`` spans of a generated
    workload: workload/host.py), averaged over the simulated ranks that have them. Issuing is the union
    of those spans; waited, the GPU's idle time that ends just as one of them ends, counted within it:
    the GPU resumed the moment the host had issued its next work, so it was waiting for the host.
    (0, 0) where no rank has any."""
    host = _host_spans(spans)
    if not host:
        return 0.0, 0.0
    gpu = _buckets(spans)
    issuing = waited = 0.0
    for rank, (hs, he) in host.items():
        issuing += union_length(hs, he)
        b = gpu.get(rank)
        if b is not None:
            starts = np.concatenate([np.asarray(b[i], dtype=float) for i in (0, 2, 4)])
            ends = np.concatenate([np.asarray(b[i], dtype=float) for i in (1, 3, 5)])
            waited += _waited(hs, he, starts, ends)
    return issuing / len(host) / iterations, waited / len(host) / iterations


def _host_spans(spans: Iterable[Span]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each rank's host spans (stream ``cpu``, category ``host``; not a job's wait for its start): (starts, ends)."""
    per: dict[int, tuple[list[float], list[float]]] = {}
    if isinstance(spans, SpanTable):
        streams, cats = spans.column("stream"), spans.column("category")
        t = np.array([i for i, (s, c) in enumerate(zip(streams, cats)) if s == "cpu" and c == "host"], dtype=np.int64)
        if not len(t):
            return {}
        idx = (np.arange(spans.copies, dtype=np.int64)[:, None] * len(streams) + t[None, :]).ravel()
        start, end, _xfer = (np.asarray(a, dtype=float) for a in spans.times())
        ranks = np.asarray(spans.ranks(), dtype=np.int64)[idx]
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for r in np.unique(ranks):
            mine = idx[ranks == r]
            out[int(r)] = (start[mine], end[mine])
        return out
    for s in spans:
        if s.stream == "cpu" and s.category == "host":
            a, b = per.setdefault(s.rank, ([], []))
            a.append(s.start_s)
            b.append(s.end_s)
    return {r: (np.asarray(a, dtype=float), np.asarray(b, dtype=float)) for r, (a, b) in per.items()}


def _waited(hs: np.ndarray, he: np.ndarray, gs: np.ndarray, ge: np.ndarray) -> float:
    """The GPU's idle time (outside the busy intervals [gs, ge)) that ends exactly at a host span's end
    (``he``), counted from the start of the host's busy run that span ends (back-to-back host spans are
    one run: the host was issuing throughout); each resumption of the GPU counted once."""
    if not len(gs):
        return 0.0
    seg_start, seg_end = _segments(gs, ge)
    run_start, _run_end = _segments(hs, he)
    busy_from = run_start[np.searchsorted(run_start, he, side="right") - 1]  # the run each span ends in
    j = np.searchsorted(seg_start, he, side="left")
    jj = np.minimum(j, len(seg_start) - 1)
    hit = (j < len(seg_start)) & np.isclose(seg_start[jj], he, rtol=1e-12, atol=1e-15)
    prev = np.where(jj > 0, seg_end[np.maximum(jj - 1, 0)], 0.0)
    wait = np.where(hit, he - np.maximum(prev, busy_from), 0.0)
    best: dict[int, float] = {}
    for k in np.flatnonzero(hit & (wait > 0)):
        best[int(jj[k])] = max(best.get(int(jj[k]), 0.0), float(wait[k]))
    return float(sum(best[k] for k in sorted(best)))

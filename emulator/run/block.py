"""Blocks: the times of a block's parts, and a run's spans with its blocks opened.

A block op (``Op.parts``, ``emulator.program.Part``) stands for a run of one unit's ops. The
engine runs it as one op where nothing but its start decides when its parts run: its kernels on
a GPU they have alone, its collectives *private* (``emulator.run.engine``). Part p then starts at
``start + s[p]`` and ends at ``start + e[p]``, where (s, e) are worked out here once per block
and GPU from the parts' durations, by the IR's own rules: a part starts when the parts it
depends on and the part before it on its stream have ended. What came before the block on any
of its streams ended by its start (the builder makes blocks only of units whose communication
ends within them), so the first part starts at 0.

The times are those of the ops run one by one, but for rounding: an op there ends at its
absolute start plus its duration, here at the block's start plus a sum taken from 0 (a few ulps
of the run's time).
"""
from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Callable

from emulator.program import Op, Part

Offsets = tuple[tuple[float, ...], tuple[float, ...]]  # each part's (start, end) after the block's start


def offsets(parts: Sequence[Part], durations: Sequence[float]) -> Offsets:
    """Each part's start and end after its block's start, for parts that take ``durations``."""
    starts: list[float] = []
    ends: list[float] = []
    last: dict[str, int] = {}  # stream → its latest part
    for p, part in enumerate(parts):
        s = 0.0
        for d in part.deps:
            if ends[d] > s:
                s = ends[d]
        prev = last.get(part.stream)
        if prev is not None and ends[prev] > s:
            s = ends[prev]
        starts.append(s)
        ends.append(s + durations[p])
        last[part.stream] = p
    return tuple(starts), tuple(ends)


_OWN = ("rank", "microbatch", "stage", "layer")  # a part's is its block op's
_PART = ("stream", "bytes", "flops", "category", "collective", "group", "duration", "costed")  # a part's own


def _label(op: Op | Part) -> str:
    return op.kind.label


class OpenedFields:
    """The static fields of spans (``emulator.spans.StaticFields``) of ops whose blocks are opened:
    a block op gives one entry per part, a plain op its own (a span's ``kind`` is the kind's label,
    its ``name`` the op's name, else its collective, else that label)."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.n = sum(len(op.parts) or 1 for op in ops)

    def __len__(self) -> int:
        return self.n

    def column(self, name: str) -> tuple[object, ...]:  # noqa: D102
        out: list[Any] = []
        add, extend = out.append, out.extend
        if name == "id":
            for op in self.ops:
                n = len(op.parts)
                if n:
                    extend(range(op.id - n + 1, op.id + 1))
                else:
                    add(op.id)
        elif name == "name":
            for op in self.ops:
                if op.parts:
                    prefix = op.name
                    extend([prefix + p.name for p in op.parts])
                else:
                    add(op.name or op.collective or op.kind.label)
        elif name in _OWN:
            own = attrgetter(name)
            for op in self.ops:
                n = len(op.parts)
                if n:
                    extend([own(op)] * n)
                else:
                    add(own(op))
        else:  # a part's own field: the same for every op of one block, worked out once per block
            if name not in _PART and name != "kind":
                raise KeyError(name)
            get: Callable[[Any], Any] = _label if name == "kind" else attrgetter(name)
            seen: dict[int, list[Any]] = {}
            for op in self.ops:
                parts = op.parts
                if parts:
                    vals = seen.get(id(parts))
                    if vals is None:
                        vals = seen[id(parts)] = [get(p) for p in parts]
                    extend(vals)
                else:
                    add(get(op))
        return tuple(out)


def opened_times(ops: list[Op], rel: dict[int, Offsets], start: Sequence[float], end: Sequence[float],
                 xfer: Sequence[float], copies: int = 1) -> tuple[Any, Any, Any]:
    """The start, end and transfer-start time of every op with blocks opened (as ``OpenedFields``):
    part p of block op t ran from ``start[t] + s[p]`` to ``start[t] + e[p]`` (``rel[t]``), its
    transfer, for a collective, from its start (a private collective waits for no one). Float64
    numpy arrays. The offsets are gathered from one pool of each distinct block's (s, e), never as a
    float object per part (5.6M parts of GPT 530B).

    With ``copies``, the times are those of ``copies`` copies of ``ops``, one after the other (a
    stamped program's: ``start[k·len(ops) + t]``); the opened layout is worked out once for all."""
    import numpy as np

    n = len(ops)
    counts = np.ones(n, dtype=np.int64)
    base = np.zeros(n, dtype=np.int64)  # a block op's first offset in the pool
    pool_s: list[float] = []
    pool_e: list[float] = []
    at: dict[int, int] = {}  # id of a block's offsets → where they start in the pool
    for t, r in rel.items():
        b = at.get(id(r))
        if b is None:
            b = at[id(r)] = len(pool_s)
            pool_s.extend(r[0])
            pool_e.extend(r[1])
        base[t] = b
        counts[t] = len(r[0])
    is_block = np.zeros(n, dtype=bool)
    is_block[list(rel)] = True
    # per opened entry: its op (rep), whether it is a part, and (for a part) its offsets' place in the
    # pool; in place where it can be, as these arrays are one entry per part
    rep = np.repeat(np.arange(n, dtype=np.int64), counts)
    index = np.arange(len(rep), dtype=np.int64)
    index -= (np.cumsum(counts) - counts)[rep]  # the entry's place within its op
    index += base[rep]
    part = np.flatnonzero(is_block[rep])  # the entries that are parts
    rel_s = np.asarray(pool_s or [0.0])[index[part]]
    rel_e = np.asarray(pool_e or [0.0])[index[part]]
    del index
    shift = np.zeros(len(rep))  # a part's start after its block's; 0.0 (exact) for the other ops
    shift[part] = rel_s
    m = len(rep)
    starts, ends, xfers = (np.empty(m * copies, dtype=np.float64) for _ in range(3))
    cols = [np.asarray(c, dtype=np.float64) for c in (start, end, xfer)]
    # gathered into place (``take`` with ``out``): a temporary of each copy's size costs its page
    # faults, which were most of the time (0.4 s of GPT 530B's 5.6M entries)
    for k in range(copies):
        a, b = k * m, (k + 1) * m
        s, e, x = starts[a:b], ends[a:b], xfers[a:b]
        for col, o in zip(cols, (s, e, x)):
            np.take(col[k * n:(k + 1) * n], rep, out=o)
        e[part] = s[part] + rel_e  # s holds the block's start here
        s += shift
        x[part] = s[part]
    return starts, ends, xfers

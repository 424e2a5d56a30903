"""Wiring: the static facts the engine reads of a program's template ops, worked out once.

Each function takes the template ops (``emulator.run.engine``: a stamped program's
representatives, or a plain program's ops) and returns flat arrays indexed by op position:
who follows whom, each op's call number on its communicator, and which compute ops share
their GPU. ``OpFields`` reads the span fields of the same ops column by column.
"""
from __future__ import annotations

from array import array
from operator import attrgetter

from emulator.program import COLLECTIVE, COMPUTE, OFF_SM_STREAMS, Op


class OpFields:
    """The static fields of spans, read from the template ops column by column
    (``emulator.spans.StaticFields``): a span's ``kind`` is the op kind's label, its ``name``
    the op's name, else its collective, else that label."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops

    def __len__(self) -> int:
        return len(self.ops)

    def column(self, name: str) -> tuple[object, ...]:  # noqa: D102
        if name == "kind":
            return tuple(op.kind.label for op in self.ops)
        if name == "name":
            return tuple(op.name or op.collective or op.kind.label for op in self.ops)
        return tuple(map(attrgetter(name), self.ops))


def by_source(src: array[int], dst: array[int], n: int) -> tuple[array[int], array[int]]:
    """Edges (src[e] → dst[e]) grouped by source, each source's in edge order: (off, to), with
    the successors of op t at ``to[off[t]:off[t + 1]]``."""
    import numpy as np

    s = np.frombuffer(src, dtype=np.int64) if len(src) else np.zeros(0, dtype=np.int64)
    d = np.frombuffer(dst, dtype=np.int64) if len(dst) else np.zeros(0, dtype=np.int64)
    order = np.argsort(s, kind="stable")
    off = array("q", np.concatenate(([0], np.cumsum(np.bincount(s, minlength=n)))).astype(np.int64).tobytes())
    to = array("q", d[order].tobytes())
    return off, to


def _positions(ops: list[Op]) -> dict[int, int] | None:
    """Each op id's position in ``ops``; None where the ids are the positions (the builder numbers its ops 0, 1,
    2, ... in list order)."""
    ids = [op.id for op in ops]
    return None if ids == list(range(len(ops))) else dict(zip(ids, range(len(ops))))


def wire(ops: list[Op]) -> tuple[array[int], array[int], list[int]]:
    """Successors of each template op, as flat arrays (op t's are ``to[off[t]:off[t + 1]]``, in
    program order), and its count of prerequisites (deps + stream predecessor).

    Flat arrays, not a list per op: 16 B an op and edge, where the lists cost ~130 B an op
    (235 MB of a 1.84M-op run)."""
    n = len(ops)
    index = _positions(ops)
    src, dst = array("q"), array("q")  # the edges prerequisite → op, in program order
    wait = [0] * n
    last_on_stream: dict[tuple[int, str], int] = {}
    for i, op in enumerate(ops):
        deps = op.deps
        for d in deps:
            src.append(d if index is None else index[d])
            dst.append(i)
        key = (op.rank, op.stream)
        prev = last_on_stream.get(key)
        if prev is None:
            wait[i] = len(deps)
        else:
            src.append(prev)
            dst.append(i)
            wait[i] = len(deps) + 1
        last_on_stream[key] = i
    return (*by_source(src, dst, n), wait)


# Streams whose ops the host issues in program order, from the training loop itself: the compute stream, and the
# host's own time. Every other stream's op is issued by a hook the moment its last prerequisite is issued.
ISSUED_IN_PLACE = frozenset({"compute", "cpu"})
# The longest key of ``issue_order`` (hooks on hooks on ...): it bounds the keys' memory on a long chain of
# hooked ops, each on the one before (deeper ones are placed right behind their prerequisite, not after it).
MAX_HOOK_DEPTH = 8


def issue_order(ops: list[Op], ranks: frozenset[int] | None = None) -> array[int]:
    """Per template op, the next GPU op its rank issues (-1 for the last). Host ops (stream ``cpu``) take no
    place in the GPU's queue; ``ranks``: the ranks with one queue (None: all), the others' ops get -1.

    The host issues compute ops in program order. Any other op it issues from a hook, as soon as it has issued
    the op's last prerequisite (its deps and its stream's previous op): a gradient bucket's reduce-scatter right
    after the backward that fills the bucket (Megatron-Core's ``register_grad_ready``), wherever the builder
    wrote it; ops hooked on the same one keep their program order. An op with no deps stays where it was
    written. Each op gets a key of program positions, compared as tuples: a compute op's, or a dep-less one's,
    is its own position; a hooked op's is its last prerequisite's key with its own position after it (past
    ``MAX_HOOK_DEPTH`` hooks on hooks, the prerequisite's last position replaced by its own: right behind it,
    no deeper). A prerequisite's key is always lower, so the order is a topological one, and a single queue
    adds no cycle to the program."""
    n = len(ops)
    index = _positions(ops)
    last_on_stream: dict[tuple[int, str], int] = {}
    keys: list[tuple[int, ...]] = [()] * n
    for i, op in enumerate(ops):
        prev = last_on_stream.get((op.rank, op.stream))
        last_on_stream[(op.rank, op.stream)] = i
        if op.stream in ISSUED_IN_PLACE or not op.deps:
            keys[i] = (i,)
            continue
        pre = [d if index is None else index[d] for d in op.deps] + ([prev] if prev is not None else [])
        top = keys[max(pre, key=keys.__getitem__)]
        keys[i] = (*top, i) if len(top) < MAX_HOOK_DEPTH else (*top[:-1], i)
    out = array("q", [-1]) * n
    by_rank: dict[int, list[int]] = {}
    mine = (i for i, op in enumerate(ops) if op.stream != "cpu" and (ranks is None or op.rank in ranks))
    for i in sorted(mine, key=keys.__getitem__):
        by_rank.setdefault(ops[i].rank, []).append(i)
    for order in by_rank.values():
        for a, b in zip(order, order[1:]):
            out[a] = b
    return out


def call_numbers(ops: list[Op]) -> array[int]:
    """Per template op, its call number on its (rank, group) communicator, in program order
    (-1 for other ops). NCCL matches the calls of a communicator in the order each rank
    issues them (every rank must call its collectives on a communicator in the same order;
    NCCL user guide, "Collective Operations"); a framework issues them in program order,
    whichever stream (``zero``, ``dp``) they later run on. Matching by arrival order
    would pair a ZeRO-3 all-gather with a reduce-scatter as soon as ranks fall out of
    lock-step. A copy's ops are its template's, so the number holds for every copy."""
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    out = array("q", [-1]) * len(ops)
    for t, op in enumerate(ops):
        if op.kind is COLLECTIVE:
            key = (op.rank, op.group)
            out[t] = seen.get(key, 0)
            seen[key] = out[t] + 1
    return out


def compute_streams(ops: list[Op]) -> dict[int, set[str]]:
    """Per rank, the streams its GPU compute ops run on (host ops, stream ``cpu``, are not the GPU's)."""
    streams: dict[int, set[str]] = {}
    for op in ops:
        if op.kind is COMPUTE and op.stream not in OFF_SM_STREAMS:
            streams.setdefault(op.rank, set()).add(op.stream)
    return streams


def sharing(ops: list[Op]) -> bytearray:
    """Per template op: a GPU compute op of a rank whose compute runs on more than one stream.
    Those ops share their GPU (``emulator.devices.sharing``); every other compute op runs at
    full speed on the fast path (a rank with one compute stream never runs two kernels at once).
    Host ops (stream ``cpu``, imported traces) are the CPU's time, not the GPU's."""
    streams = compute_streams(ops)
    return bytearray(op.kind is COMPUTE and op.stream not in OFF_SM_STREAMS and len(streams[op.rank]) > 1 for op in ops)

"""The IR: a per-rank DAG of operations (a Program).

Every front end (the transformer workload builder, the trace importers, the live
backend) produces this one shape; the engine consumes nothing else. It is the
same idea as an MLCommons Chakra execution trace.

Semantics (DESIGN.md, "The IR"):
- an op starts when all of its ``deps`` are done *and* the previous op of the same
  rank on the same ``stream`` is done (streams are in-order lanes, like CUDA
  streams); program order on a stream is the order of ``Program.ops``;
- a collective starts when every simulated member of its ``group`` has issued it;
  the k-th collective a rank issues on a group matches the k-th of every other
  member (NCCL's rule);
- a send and a recv match on (src, dst, tag), first in first out, and both
  complete when the last byte arrives.

Units are SI: seconds, bytes, FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product
from typing import Iterator

COMPUTE = "compute"
COLLECTIVE = "collective"
SEND = "send"
RECV = "recv"
KINDS = (COMPUTE, COLLECTIVE, SEND, RECV)
COLLECTIVE_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")
COMM_KINDS = (COLLECTIVE, SEND, RECV)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of one rank.

    ``bytes`` is HBM traffic for a compute op and the payload for communication.
    For collectives it is the nccl-tests buffer size S: the all-reduce buffer, the
    all-gather *output*, the reduce-scatter *input*, the all-to-all send buffer,
    the broadcast buffer.
    """

    id: int
    rank: int
    kind: str
    stream: str = "compute"
    deps: tuple[int, ...] = ()
    name: str = ""
    duration: float | None = None  # s; a fixed-duration compute op
    flops: float = 0.0
    bytes: float = 0.0
    category: str = ""  # fwd | bwd | recompute | optimizer | comm | ...
    collective: str = ""  # one of COLLECTIVE_OPS, for kind == collective
    group: tuple[int, ...] = ()  # member ranks (world numbering), sorted
    root: int = -1  # broadcast root (world rank)
    peer: int = -1  # send: destination, recv: source
    tag: int = 0
    microbatch: int = -1
    stage: int = -1
    layer: int = -1


@dataclass(frozen=True, slots=True)
class Fold:
    """A symmetry of the rank grid, for symmetry folding (DESIGN.md, "Speed").

    Ranks are laid out row-major on a grid of shape ``shape`` (the last axis the
    fastest). Along every axis marked in ``folded``, translating a rank's
    coordinate (mod the axis size) gives a rank that runs an identical program on
    an identical part of the network. Only ranks whose folded coordinates are all
    0 are simulated; each stands for ``copies`` ranks.
    """

    shape: tuple[int, ...]
    folded: tuple[bool, ...]

    @property
    def copies(self) -> int:
        n = 1
        for size, f in zip(self.shape, self.folded):
            if f:
                n *= size
        return n

    def coords(self, rank: int) -> list[int]:
        out = []
        for size in reversed(self.shape):
            out.append(rank % size)
            rank //= size
        return out[::-1]

    def rank(self, coords: list[int]) -> int:
        r = 0
        for size, c in zip(self.shape, coords):
            r = r * size + c
        return r

    def is_representative(self, rank: int) -> bool:
        return all(c == 0 for c, f in zip(self.coords(rank), self.folded) if f)

    def translations(self) -> Iterator[tuple[int, ...]]:
        """Every offset vector of the folded axes (zeros on the other axes)."""
        ranges = [range(s) if f else range(1) for s, f in zip(self.shape, self.folded)]
        return product(*ranges)

    def translate(self, rank: int, offset: tuple[int, ...]) -> int:
        c = self.coords(rank)
        return self.rank([(x + o) % s for x, o, s in zip(c, offset, self.shape)])

    def translate_all(self, ranks: list[int]) -> list[list[int]]:
        """``ranks`` under every translation, in the order of ``translations()`` (vectorised:
        one row per translation)."""
        import numpy as np

        shape = np.array(self.shape, dtype=np.int64)
        strides = np.ones(len(shape), dtype=np.int64)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        r = np.array(ranks, dtype=np.int64)
        coords = (r[:, None] // strides[None, :]) % shape[None, :]  # (n, axes)
        offsets = np.array(list(self.translations()), dtype=np.int64).reshape(-1, len(shape))  # (T, axes)
        moved = (coords[None, :, :] + offsets[:, None, :]) % shape[None, None, :]  # (T, n, axes)
        return (moved @ strides).tolist()


@dataclass
class Program:
    """The per-rank op DAG of one training iteration (or one trace).

    ``ops`` holds the ops of the simulated ranks only; with a ``fold`` those are
    the representatives, and every other rank is a translate of one of them.
    ``meta`` carries workload facts for the reports (model FLOPs per iteration,
    tokens per iteration, ...), never anything the engine needs.
    """

    ranks: int
    ops: list[Op]
    fold: Fold | None = None
    meta: dict = field(default_factory=dict)

    def repeated(self, n: int) -> "Program":
        """``n`` back-to-back iterations: each rank's iteration k+1 starts on every
        stream only after all its streams finished iteration k."""
        if n <= 1:
            return self
        stride = max((op.id for op in self.ops), default=0) + 1
        last: dict[tuple[int, str], int] = {}
        first: dict[tuple[int, str], int] = {}
        for op in self.ops:
            last[(op.rank, op.stream)] = op.id
            first.setdefault((op.rank, op.stream), op.id)
        tails: dict[int, list[int]] = {}
        for (rank, _s), oid in last.items():
            tails.setdefault(rank, []).append(oid)
        heads = set(first.values())
        out: list[Op] = []
        for k in range(n):
            off = k * stride
            for op in self.ops:
                deps = tuple(d + off for d in op.deps)
                if k and op.id in heads:
                    deps += tuple(t + off - stride for t in tails[op.rank])
                out.append(replace(op, id=op.id + off, deps=deps))
        return Program(self.ranks, out, self.fold, dict(self.meta))

    def simulated_ranks(self) -> list[int]:
        return sorted({op.rank for op in self.ops})

    def validate(self) -> None:
        """Check ids, deps and references; raise ValueError naming the first bad op.

        Dependencies may point forward in the list (a trace need not be sorted);
        a cycle is not an error here: the engine reports it as a deadlock.
        """
        ids: set[int] = set()
        for op in self.ops:
            if op.id in ids:
                raise ValueError(f"op {op.id}: duplicate id")
            ids.add(op.id)
        for op in self.ops:
            if op.kind not in KINDS:
                raise ValueError(f"op {op.id}: kind {op.kind!r} is not one of {', '.join(KINDS)}")
            if not 0 <= op.rank < self.ranks:
                raise ValueError(f"op {op.id}: rank {op.rank} outside 0..{self.ranks - 1}")
            for d in op.deps:
                if d not in ids:
                    raise ValueError(f"op {op.id}: dependency {d} is not an op of this program")
            if op.kind == COLLECTIVE:
                if op.collective not in COLLECTIVE_OPS:
                    known = ", ".join(COLLECTIVE_OPS)
                    raise ValueError(f"op {op.id}: collective {op.collective!r} is not one of {known}")
                if op.rank not in op.group:
                    raise ValueError(f"op {op.id}: rank {op.rank} is not in its group {list(op.group)}")
                if any(not 0 <= g < self.ranks for g in op.group):
                    raise ValueError(f"op {op.id}: group {list(op.group)} has a rank outside 0..{self.ranks - 1}")
            if op.kind in (SEND, RECV):
                if not 0 <= op.peer < self.ranks or op.peer == op.rank:
                    raise ValueError(f"op {op.id}: peer {op.peer} is not another rank in 0..{self.ranks - 1}")
            if op.bytes < 0 or op.flops < 0 or (op.duration is not None and op.duration < 0):
                raise ValueError(f"op {op.id}: negative bytes, flops or duration")

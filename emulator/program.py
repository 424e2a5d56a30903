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
  complete when the last byte arrives;
- with one hardware queue a GPU (``parallel.cuda_device_max_connections: 1``), an op is
  also launched only once the op its rank issued before it has been launched: compute ops
  are issued in program order, any other op right after its last prerequisite
  (``emulator.run.wiring.issue_order``).

Units are SI: seconds, bytes, FLOPs.

May import: emulator.meta (the facts a Program carries).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum
from itertools import product
from typing import Any, Iterator, Sequence

from emulator.meta import ProgramMeta

__all__ = ["OpKind", "COMPUTE", "COLLECTIVE", "SEND", "RECV", "KINDS", "COMM_KINDS", "COLLECTIVE_OPS", "OFF_SM_STREAMS",
           "COPY_STREAMS", "SYNC_STREAMS", "Op", "Part", "block_ops", "Fold", "FoldRefused", "Program", "ProgramMeta"]

# Streams whose compute ops take no SMs and no GPU slowdown: the host's own time (``cpu``, imported traces) and
# the copy engines' transfers to and from pinned host memory (``d2h``, ``h2d``: activation offloading). They
# neither share the GPU with its kernels nor count as its compute.
OFF_SM_STREAMS = frozenset({"cpu", "d2h", "h2d"})
# Of those, the copies: the time breakdown counts them as communication (with the host), not compute.
COPY_STREAMS = frozenset({"d2h", "h2d"})
# Streams of the step's gradient and parameter synchronisation (Megatron-Core's DDP buckets on ``dp``, ZeRO's
# parameter all-gathers on ``zero``, HSDP's outer level on ``hsdp``): once an iteration, not every micro-batch.
SYNC_STREAMS = frozenset({"dp", "zero", "hsdp"})


class OpKind(IntEnum):
    """What an op does. Its text form (``label``: "compute", "collective", "send", "recv")
    is the one every output and trace format uses; ``str()`` and f-strings give it too.
    Trace readers turn a label into a kind with :meth:`parse`.
    """

    COMPUTE = 0
    COLLECTIVE = 1
    SEND = 2
    RECV = 3

    @property
    def label(self) -> str:
        """The lowercase name, as written in spans, traces and reports."""
        return _LABELS[self]

    @classmethod
    def parse(cls, text: str) -> OpKind:
        """The kind whose label is ``text``; ValueError naming the known labels otherwise."""
        kind = _BY_LABEL.get(text)
        if kind is None:
            raise ValueError(f"kind {text!r} is not one of {', '.join(_LABELS)}")
        return kind

    def __str__(self) -> str:
        return _LABELS[self]

    def __format__(self, spec: str) -> str:
        return format(_LABELS[self], spec)



_LABELS: tuple[str, ...] = tuple(k.name.lower() for k in OpKind)  # indexed by value
_BY_LABEL: dict[str, OpKind] = {k.name.lower(): k for k in OpKind}

COMPUTE = OpKind.COMPUTE
COLLECTIVE = OpKind.COLLECTIVE
SEND = OpKind.SEND
RECV = OpKind.RECV
KINDS: tuple[OpKind, ...] = (COMPUTE, COLLECTIVE, SEND, RECV)
COMM_KINDS: tuple[OpKind, ...] = (COLLECTIVE, SEND, RECV)
COLLECTIVE_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")

# MoE token dispatch collectives whose traffic depends on the routing (emulator/network/dispatch.py builds
# their flows): "<kind>:<direction>:<k=v,...>", kind all_to_all_v (NCCL all-to-all-v with per-pair sizes)
# or a flex backend (deepep, hybridep), direction in (dispatch: towards the experts) or out (combine: back).
DISPATCH_KINDS = ("all_to_all_v", "deepep", "hybridep")


def is_collective(op: str) -> bool:
    """A collective the fabric knows: one of COLLECTIVE_OPS or a dispatch collective."""
    return op in COLLECTIVE_OPS or parse_dispatch_op(op) is not None


def dispatch_op(kind: str, direction: str, **params: float) -> str:
    """The collective name of a routing-dependent dispatch (``parse_dispatch_op`` reads it back)."""
    return f"{kind}:{direction}:" + ",".join(f"{k}={v:.9g}" for k, v in sorted(params.items()))


def is_token_exchange(op: str) -> bool:
    """Whether collective ``op`` exchanges tokens among a group, each rank with every other: a MoE token
    dispatch or combine (``DISPATCH_KINDS``), or a plain ``all_to_all`` (the alltoall dispatcher's where
    every rank receives the mean, as with its capacity padding). Its plan of many flows recurs every
    micro-batch: the fabric runs it ahead of the clock where its links are free (``Fabric._run_ahead``)."""
    return op == "all_to_all" or parse_dispatch_op(op) is not None


def runs_ahead(op: str, stream: str, members: int) -> bool:
    """Whether the fabric may run collective ``op`` on ``stream``, of ``members`` simulated members of its group,
    ahead of the clock where its links are free (``Fabric._run_ahead``): a token exchange (``is_token_exchange``),
    or a layer's collective of a group the fold maps onto itself (one simulated member: a context-parallel
    all-gather over nodes, GLM-5.1's). Its plan's flows would each cost events and solves, every micro-batch, where
    its run alone is worked out once per plan and size. Not the step's gradient and parameter collectives
    (``SYNC_STREAMS``): each runs once an iteration, in sizes of its own, beside the backward that wakes it, so its
    run alone costs more than it saves (DeepSeek-V3 on 4,096 H100 ran about 10% slower with them)."""
    return is_token_exchange(op) or (members == 1 and stream not in SYNC_STREAMS)


def parse_dispatch_op(op: str) -> tuple[str, str, dict[str, float]] | None:
    """(kind, direction, params) of a dispatch collective's name; None for any other collective."""
    kind, sep, rest = op.partition(":")
    if not sep or kind not in DISPATCH_KINDS:
        return None
    direction, _, items = rest.partition(":")
    params = {k: float(v) for k, v in (item.split("=") for item in items.split(",") if item)}
    return kind, direction, params


@dataclass(frozen=True, slots=True)
class Part:
    """One op of a *block* (``Op.parts``): the op the workload builder would have emitted on its
    own, less what the block op holds for all of its parts (rank, micro-batch, stage, layer, and the
    start of the name).

    A block is a run of ops of one unit (a layer's forward or backward in one task) that starts with
    a compute op and ends with one, whose communications are collectives that end within it. Its
    parts are its ops in program order: part p has the id ``block.id − (len(parts) − 1) + p`` (the
    block op's own id is its last part's), the first waits for the block op's ``deps``, every other
    for the earlier parts in ``deps`` (their indexes), and each also for the op before it on its
    stream, as any op. ``Program.expanded`` gives the ops back; the engine runs a block as one op
    where its collectives are private (``emulator.run.engine``), which spares building, wiring and
    advancing every kernel of a deep pipeline (issue #13).
    """

    kind: OpKind
    stream: str
    name: str  # after the block op's name (its unit's prefix)
    duration: float | None
    flops: float
    bytes: float
    category: str
    collective: str = ""
    group: tuple[int, ...] = ()
    deps: tuple[int, ...] = ()  # the earlier parts it waits for (their indexes), sorted
    costed: tuple[float, ...] = ()


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
    kind: OpKind
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
    # compute ops the workload builder costed: seconds of ``duration`` from measured, interpolated
    # and roofline kernels (devices/kernels.py); () when the duration came from elsewhere (a trace).
    # Report metadata, not part of what the op does: left out of equality (trace round trips).
    costed: tuple[float, ...] = field(default=(), compare=False)
    # a block's ops (``Part``), () for a plain op: the ops it stands for are ``Program.expanded``'s
    parts: tuple[Part, ...] = field(default=(), compare=False)


def _fast_init(op: Op, id: int, rank: int, kind: OpKind, stream: str, deps: tuple[int, ...], name: str,
               duration: float | None, flops: float, bytes: float, category: str, collective: str,
               group: tuple[int, ...], root: int, peer: int, tag: int, microbatch: int, stage: int, layer: int,
               costed: tuple[float, ...], parts: tuple[Part, ...]) -> None:
    """``Op.__init__``: the dataclass's own, made cheaper (issue #13, "Build fast").

    A frozen dataclass's generated ``__init__`` sets each of the 19 fields with
    ``object.__setattr__(self, name, value)``, ~3 µs an op; the builder makes 1.8M ops for a
    64-rank GPT 1T. This one sets each slot through its member descriptor's ``__set__``,
    bound once (~1 µs). The signature and defaults are the generated ones (copied below), and
    the op stays frozen: assigning an attribute still raises FrozenInstanceError.
    """
    _S_id(op, id)
    _S_rank(op, rank)
    _S_kind(op, kind)
    _S_stream(op, stream)
    _S_deps(op, deps)
    _S_name(op, name)
    _S_duration(op, duration)
    _S_flops(op, flops)
    _S_bytes(op, bytes)
    _S_category(op, category)
    _S_collective(op, collective)
    _S_group(op, group)
    _S_root(op, root)
    _S_peer(op, peer)
    _S_tag(op, tag)
    _S_microbatch(op, microbatch)
    _S_stage(op, stage)
    _S_layer(op, layer)
    _S_costed(op, costed)
    _S_parts(op, parts)


_OP_FIELDS = tuple(Op.__dataclass_fields__)
_S_id, _S_rank, _S_kind, _S_stream, _S_deps, _S_name, _S_duration, _S_flops, _S_bytes, _S_category, _S_collective, \
    _S_group, _S_root, _S_peer, _S_tag, _S_microbatch, _S_stage, _S_layer, _S_costed, _S_parts = \
    (Op.__dict__[f].__set__ for f in _OP_FIELDS)  # the slots' member descriptors, in field order
# the same parameters, in the same order, with the same defaults, as the generated __init__
assert _fast_init.__code__.co_varnames[1:1 + len(_OP_FIELDS)] == _OP_FIELDS
_fast_init.__defaults__ = Op.__init__.__defaults__
_fast_init.__qualname__ = "Op.__init__"
setattr(Op, "__init__", _fast_init)


_PartRow = tuple[OpKind, str, str, "float | None", float, float, str, str, tuple[int, ...], tuple[float, ...],
                 tuple[int, ...]]


def block_ops(block: Op, memo: dict[int, tuple[tuple[Part, ...], list[_PartRow]]] | None = None) -> list[Op]:
    """The ops block op ``block`` stands for (``Part``), with their ids, deps and full names.

    ``memo`` keeps each distinct parts tuple's fields as rows (blocks of one shape share their parts:
    DeepSeek-V3 1024's 817k parts come from 37 tuples), so that an op is made from one row."""
    parts = block.parts
    hit = None if memo is None else memo.get(id(parts))
    if hit is None:
        rows = [(q.kind, q.stream, q.name, q.duration, q.flops, q.bytes, q.category, q.collective, q.group, q.costed,
                 q.deps) for q in parts]
        if memo is not None:
            memo[id(parts)] = (parts, rows)  # the entry holds its parts: their id stays theirs
    else:
        rows = hit[1]
    base = block.id - len(parts) + 1
    rank, name, mb, stage, layer = block.rank, block.name, block.microbatch, block.stage, block.layer
    out: list[Op] = []
    add = out.append
    i = base
    deps = block.deps  # the first part's
    for kind, stream, pname, duration, flops, nbytes, category, collective, group, costed, rel in rows:
        if i != base:
            deps = (base + rel[0],) if len(rel) == 1 else tuple([base + d for d in rel])
        add(Op(i, rank, kind, stream, deps, name + pname, duration, flops, nbytes, category, collective, group, -1,
               -1, 0, mb, stage, layer, costed))
        i += 1
    return out


def _check_block(op: Op) -> None:
    """A block op's parts: a compute op first and last, collectives of its rank, deps on earlier parts."""
    parts = op.parts
    if op.kind is not COMPUTE or parts[0].kind is not COMPUTE or parts[-1].kind is not COMPUTE:
        raise ValueError(f"op {op.id}: a block must be a compute op whose first and last parts are compute")
    for p, part in enumerate(parts):
        if part.kind is COLLECTIVE and (not is_collective(part.collective) or op.rank not in part.group):
            raise ValueError(f"op {op.id}: part {p} is not a collective of rank {op.rank}")
        if part.kind is not COMPUTE and part.kind is not COLLECTIVE:
            raise ValueError(f"op {op.id}: part {p} is a {part.kind.label} (a block holds compute and collectives)")
        if any(not 0 <= d < p for d in part.deps):
            raise ValueError(f"op {op.id}: part {p} depends on a part that is not before it")


class FoldRefused(Exception):
    """A fold checked in effect (``Fold.checked``) found a copy that is not symmetric to its
    representative; the run is then made rank by rank."""


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
    # some folded translations are symmetries in effect only, not automorphisms of the network
    # (emulator.run.folding): every collective and transfer checks that its copies' latencies equal
    # its own, and raises FoldRefused where they do not
    checked: bool = False

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

    def representative(self, rank: int) -> int:
        """The simulated rank that ``rank`` is a translate of (its folded coordinates set to 0)."""
        return self.rank([0 if f else c for c, f in zip(self.coords(rank), self.folded)])

    def is_representative(self, rank: int) -> bool:
        return all(c == 0 for c, f in zip(self.coords(rank), self.folded) if f)

    def translations(self) -> Iterator[tuple[int, ...]]:
        """Every offset vector of the folded axes (zeros on the other axes)."""
        ranges = [range(s) if f else range(1) for s, f in zip(self.shape, self.folded)]
        return product(*ranges)

    def translate(self, rank: int, offset: tuple[int, ...]) -> int:
        c = self.coords(rank)
        return self.rank([(x + o) % s for x, o, s in zip(c, offset, self.shape)])

    def translate_all(self, ranks: list[int], fixed: Sequence[bool] = ()) -> list[list[int]]:
        """``ranks`` under every translation, in the order of ``translations()`` (vectorised:
        one row per translation). Axes marked in ``fixed`` are left out (offset 0 only)."""
        import numpy as np

        shape, strides = self._grid()
        r = np.array(ranks, dtype=np.int64)
        coords = (r[:, None] // strides[None, :]) % shape[None, :]  # (n, axes)
        keep = tuple(f and not (i < len(fixed) and fixed[i]) for i, f in enumerate(self.folded))
        ranges = [range(s) if k else range(1) for s, k in zip(self.shape, keep)]
        offsets = np.array(list(product(*ranges)), dtype=np.int64).reshape(-1, len(shape))  # (T, axes)
        moved = (coords[None, :, :] + offsets[:, None, :]) % shape[None, None, :]  # (T, n, axes)
        rows: list[list[int]] = (moved @ strides).tolist()  # numpy types tolist() as Any
        return rows

    def orbit(self, ranks: list[int], key: int, ordered: bool) -> list[list[int]]:
        """The rows of :meth:`translate_all` that can differ in their first ``key`` ranks.

        A folded axis along which one unit step maps those ``key`` ranks onto themselves
        (as a set, or rank by rank when ``ordered``) maps them onto themselves by any
        offset; translations commute, so leaving such axes out still reaches every
        distinct image, first occurrences in the same order as the full enumeration.
        This is what keeps a data-parallel group that spans the whole fold linear in its
        size: an 8,192-member group had 8,192 × 8,192 rows before.
        """
        import numpy as np

        shape, strides = self._grid()
        head = np.array(ranks[:key], dtype=np.int64)
        coords = (head[:, None] // strides[None, :]) % shape[None, :]
        fixed = []
        for axis, folded in enumerate(self.folded):
            if not folded or self.shape[axis] == 1:
                fixed.append(folded)
                continue
            step = coords.copy()
            step[:, axis] = (step[:, axis] + 1) % self.shape[axis]
            moved = step @ strides
            fixed.append(bool(np.array_equal(moved, head)) if ordered
                         else bool(np.array_equal(np.sort(moved), np.sort(head))))
        return self.translate_all(ranks, fixed)

    def _grid(self) -> tuple[Any, Any]:
        """(shape, row-major strides) as int64 arrays."""
        import numpy as np

        shape = np.array(self.shape, dtype=np.int64)
        strides = np.ones(len(shape), dtype=np.int64)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        return shape, strides


@dataclass
class Program:
    """The per-rank op DAG of one training iteration (or one trace).

    ``ops`` holds the ops of the simulated ranks only; with a ``fold`` those are
    the representatives, and every other rank is a translate of one of them.
    ``meta`` carries facts for the reports (the workload's FLOPs and tokens per
    iteration, or what a trace measured: ``emulator.meta``), never anything the
    engine needs.
    """

    ranks: int
    ops: list[Op]
    fold: Fold | None = None
    meta: ProgramMeta = field(default_factory=ProgramMeta)
    iterations: int = 1  # iterations the ops already hold (each step built with its own drawn MoE loads)

    def repeated(self, n: int) -> "Program":
        """``n`` back-to-back iterations: each rank's iteration k+1 starts on every
        stream only after all its streams finished iteration k; itself where it holds its iterations."""
        if n <= 1 or self.iterations > 1:
            return self
        return chained([self] * n)

    def expanded(self) -> "Program":
        """The same program with every block op (``Op.parts``) replaced by the ops it stands for;
        itself when it has none."""
        if not any(op.parts for op in self.ops):
            return self
        out: list[Op] = []
        memo: dict[int, tuple[tuple[Part, ...], list[_PartRow]]] = {}
        for op in self.ops:
            if op.parts:
                out.extend(block_ops(op, memo))
            else:
                out.append(op)
        return Program(self.ranks, out, self.fold, self.meta)

    def simulated_ranks(self) -> list[int]:
        """The ranks that have ops, in order."""
        return sorted({op.rank for op in self.ops})

    def distinct_ops(self) -> list[Op]:
        """The ops that are costed apart: every op here; a stamped program's template
        (its copies repeat the template's ops, ``emulator.run.folding.Stamped``)."""
        return self.ops

    def validate(self) -> None:
        """Check ids, deps and references; raise ValueError naming the first bad op.

        Dependencies may point forward in the list (a trace need not be sorted);
        a cycle is not an error here: the engine reports it as a deadlock.
        """
        ids: set[int] = set()
        blocks: set[tuple[int, int]] = set()  # (parts, rank) checked: a builder's blocks share their parts
        for op in self.ops:
            if op.id in ids:
                raise ValueError(f"op {op.id}: duplicate id")
            ids.add(op.id)
        for op in self.ops:
            if op.kind.__class__ is not OpKind:  # a hand-made Op given a label or a number
                raise ValueError(f"op {op.id}: kind {op.kind!r} is not one of {', '.join(_LABELS)} (an OpKind)")
            if not 0 <= op.rank < self.ranks:
                raise ValueError(f"op {op.id}: rank {op.rank} outside 0..{self.ranks - 1}")
            for d in op.deps:
                if d not in ids:
                    raise ValueError(f"op {op.id}: dependency {d} is not an op of this program")
            if op.kind is COLLECTIVE:
                if not is_collective(op.collective):
                    known = ", ".join(COLLECTIVE_OPS)
                    raise ValueError(f"op {op.id}: collective {op.collective!r} is not one of {known}")
                if op.rank not in op.group:
                    raise ValueError(f"op {op.id}: rank {op.rank} is not in its group {list(op.group)}")
                if min(op.group) < 0 or max(op.group) >= self.ranks:  # the group holds op.rank: not empty
                    raise ValueError(f"op {op.id}: group {list(op.group)} has a rank outside 0..{self.ranks - 1}")
            if op.kind is SEND or op.kind is RECV:
                if not 0 <= op.peer < self.ranks or op.peer == op.rank:
                    raise ValueError(f"op {op.id}: peer {op.peer} is not another rank in 0..{self.ranks - 1}")
            if op.bytes < 0 or op.flops < 0 or (op.duration is not None and op.duration < 0):
                raise ValueError(f"op {op.id}: negative bytes, flops or duration")
            if op.parts and (op.kind is not COMPUTE or (id(op.parts), op.rank) not in blocks):
                _check_block(op)
                blocks.add((id(op.parts), op.rank))


def chained(steps: Sequence[Program]) -> Program:
    """Programs of one scenario's iterations back to back (the same ranks, streams and op ids in each, as
    its steps are built): each rank's step k+1 starts on every stream only after all its streams finished
    step k. Step k's ids and deps are shifted by k·stride."""
    first = steps[0]
    stride = max(max((op.id for op in p.ops), default=0) for p in steps) + 1
    out: list[Op] = []
    tails: dict[int, list[int]] = {}
    for k, step in enumerate(steps):
        heads, ends = _ends(step.ops)
        off = k * stride
        for op in step.ops:
            deps = tuple(d + off for d in op.deps)
            if k and op.id in heads:
                deps += tuple(t + off - stride for t in tails[op.rank])
            out.append(replace(op, id=op.id + off, deps=deps))
        tails = ends
    return Program(first.ranks, out, first.fold, first.meta, len(steps))


def _ends(ops: Sequence[Op]) -> tuple[set[int], dict[int, list[int]]]:
    """(the first op of each (rank, stream), each rank's last ops of its streams)."""
    last: dict[tuple[int, str], int] = {}
    first: dict[tuple[int, str], int] = {}
    for op in ops:
        last[(op.rank, op.stream)] = op.id
        first.setdefault((op.rank, op.stream), op.id)
    tails: dict[int, list[int]] = {}
    for (rank, _s), oid in last.items():
        tails.setdefault(rank, []).append(oid)
    return set(first.values()), tails

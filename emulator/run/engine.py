"""The engine: runs each simulated rank's program on SimPy over the fabric.

It owns the op semantics of the IR (``emulator.program``): dependencies, in-order
streams, the rendezvous of collectives (the calls of a communicator match in program
order, as NCCL matches them in issue order, whatever stream each runs on), send/recv
matching by (src, dst, tag), the sharing of one GPU by compute ops on several of its
streams (``emulator.devices.sharing``; a rank with one compute stream keeps the fast
path below), and deadlock detection. It records one Span per op (``emulator.spans.SpanTable``).

Hot path notes: ops are indexed by position; each op keeps a counter of unmet
prerequisites (its deps plus the previous op on its stream), in flat arrays; no SimPy process
or Resource is created per op. *Timed* ops — a compute op on a GPU it has alone, and a
private collective (``_private``: its links carry nothing else, one member is simulated) —
depend on nothing but their start, so ``_advance`` finishes them as soon as their start is
known, ahead of the clock, and hands their end to their successors (``ready_at``); only ops
that meet other ranks or share something (collectives, sends, receives, shared GPUs) wait
for the clock, by one timeout per distinct start time. The results are those of running
every op on the clock, to the last bit: a private collective ends at its start plus its
duration alone, where the fabric sums its steps at the run's absolute time (2.6e-12 of its
length at t ≈ 8 s; a contended fabric can carry that to 4.8e-10 of a 4:1 fat-tree's
iteration). With far fewer events: GPT 1T on 512 A100 (64 ranks simulated,
1.84M ops) 3.88M → 0.26M events. Before this, compute ops ending at one time shared one
timeout, which cut an unfolded 1024-GPU run from 16.6M to 3.6M events.

Templates: a ``Stamped`` program (``emulator.run.folding``: every rank simulated,
given as the representatives' ops plus the translations that copy them) is run
without materialising its copies. Static facts (kind, successors, initial
prerequisite count, duration) are kept once per template op t; copy k's op is
entry k·T + t of the flat per-op lists (start, end, xfer, waiting). Deps never
leave a rank, so successors of a copy are the template's, shifted by k·T. A plain
Program is the one-copy case. This removed the 21M-Op unfold, most of the wiring
and validation, and the Span list, of a 1024-GPU unfolded run. A Stamped program may
also keep a fold (``folding.restamp``: data-parallel replicas whose fold in effect was
refused, each simulated, with their tensor-parallel peers still folded): each copy then
has private collectives of its own, and its blocks run as one op where every copy's
block collectives take as long as the template's (``_copies_alike``). GPT 530B on
2,520 A100: one build of 35 ranks instead of two (the second of 315), 1.44 GB → 0.57 GB,
23.8 → 11.5 s, the same iteration time to the last bit.
"""
from __future__ import annotations

from array import array
from collections.abc import Iterable
from operator import attrgetter
from typing import Any, Callable

import simpy

from emulator.devices.gpu import Gpu
from emulator.devices.sharing import SharedGpu
from emulator.errors import EmulatorError, ReportError
from emulator.network.collectives import CollectiveModel, PlanKey
from emulator.network.fabric import Alone, Fabric, alone, delay_to
from emulator.network.flows import Plan
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Fold, Op, Program
from emulator.run.block import Offsets, OpenedFields, offsets, opened_times
from emulator.run.folding import Stamped, back
from emulator.spans import SpanTable

# Events between two calls of the progress callback. It is also the length of the inner
# loop that calls SimPy's step(), so counting events costs nothing per event. Chosen with
# the engine (not tuned): at about 1 µs per event it reports every ~0.05 s of wall time,
# often enough for the CLI's progress line, rarely enough to cost nothing.
PROGRESS_EVERY = 50_000

BLOCK = 4  # the engine's kind of a block op (Op.parts), beside the OpKind values

GroupKey = tuple[int, tuple[int, ...]]  # (world rank, its group), of one copy
P2PKey = tuple[int, int, int]  # (dst, src, tag) as the receiver sees it


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


def _by_source(src: array[int], dst: array[int], n: int) -> tuple[array[int], array[int]]:
    """Edges (src[e] → dst[e]) grouped by source, each source's in edge order: (off, to), with
    the successors of op t at ``to[off[t]:off[t + 1]]``."""
    import numpy as np

    s = np.frombuffer(src, dtype=np.int64) if len(src) else np.zeros(0, dtype=np.int64)
    d = np.frombuffer(dst, dtype=np.int64) if len(dst) else np.zeros(0, dtype=np.int64)
    order = np.argsort(s, kind="stable")
    off = array("q", np.concatenate(([0], np.cumsum(np.bincount(s, minlength=n)))).astype(np.int64).tobytes())
    to = array("q", d[order].tobytes())
    return off, to


class DeadlockError(ReportError):
    """The program can never finish: some ops wait for something that never comes."""


class Engine:
    """Runs a Program; ``run()`` returns the spans and the event count."""

    def __init__(self, program: Program, collectives: CollectiveModel, capacity: list[float],
                 gpus: dict[int, Gpu], progress: Callable[[float, int], None] | None = None,
                 blocks: bool = True) -> None:
        self.program = program
        self.env = simpy.Environment()
        self.fabric = Fabric(self.env, capacity)
        self.gpus = gpus
        self.progress = progress
        self.fold = program.fold
        # every rank is simulated unless folded away (a rank with no ops still must join its groups)
        self.simulated = set(program.simulated_ranks()) if self.fold else set(range(program.ranks))
        self.tops: list[Op]
        self._stamp: Fold | None
        self._shifts: list[tuple[int, ...] | None]
        if isinstance(program, Stamped):
            self.tops = program.template
            self._stamp, self._shifts, self.stride = program.stamp, list(program.translations), program.stride
        else:
            self.tops = program.ops
            self._stamp, self._shifts, self.stride = None, [None], 0
        self._rmaps: list[dict[int, int] | None] = [None if s is None or not any(s) else {} for s in self._shifts]
        self._gmaps: list[dict[tuple[int, ...], tuple[int, ...]]] = [{} for _ in self._shifts]
        self._ckeys: list[dict[GroupKey, GroupKey]] = [{} for _ in self._shifts]
        self.model = collectives
        self._alone: dict[tuple[object, ...], Alone] = {}  # (collective, group, root, bytes) → run alone
        keys = self._plan_keys()
        collectives.prepare(keys, capacity)
        groups_ok = self._private_groups(keys)
        # GPUs whose compute slows while their communication is resident (catalog comm_overlap_slowdown)
        self.overlap = {r: g.spec.comm_overlap_slowdown for r, g in gpus.items()
                        if g.spec is not None and g.spec.comm_overlap_slowdown > 1.0}
        if self.overlap or not all(groups_ok.values()) or any(op.kind is SEND for op in self.tops):
            self.fabric.set_slack(collectives.slack)  # else no flow ever reaches the fabric: none to find
        if any(op.parts for op in self.tops) and not self._blocks_hold(groups_ok, blocks):
            self.tops = Program(program.ranks, self.tops).expanded().ops  # run their ops one by one
        self.T = len(self.tops)
        n = self.T * len(self._shifts)
        self.n = n
        # plain ints (OpKind values) for the hot path: an int compares in C, the enum in Python; a
        # block op is BLOCK
        self.kind: list[int] = [BLOCK if op.parts else int(op.kind) for op in self.tops]
        self.off, self.to, wait = self._wire()
        # the same successors as a tuple per op, for the hot loops: iterating a tuple makes no int
        # objects, where a slice of the array makes the slice and an int per entry (~0.1 µs an op)
        to = self.to
        self.succ = [tuple(to[a:b]) for a, b in zip(self.off, self.off[1:])]
        self.call = self._call_numbers()
        self.shares = self._sharing()
        self._gpu_share: dict[int, SharedGpu] = {}  # world rank → its running kernels (sharing ranks only)
        self._share_version: dict[int, int] = {}
        # flat arrays, not lists: no float object per op, and nothing for the garbage collector
        # to traverse (a full collection walking four 21M-entry lists cost ~1/3 of a 1024-GPU run)
        self.waiting = array("q", wait) * len(self._shifts)
        self.start = array("d", [-1.0]) * n
        self.xfer = array("d", [0.0]) * n
        self.end = array("d", [-1.0]) * n
        self.ready_at = array("d", [0.0]) * n  # the latest end among an op's finished prerequisites
        self.events = 0
        self._rdv: dict[tuple[tuple[int, ...], int], list[int]] = {}  # (group, call #) → ops that arrived
        self._p2p: dict[P2PKey, list[list[int]]] = {}  # [waiting sends, waiting recvs]
        self._later_at: dict[float, list[int]] = {}  # start time → ops whose start was decided early
        self._expected: dict[tuple[int, ...], int] = {}
        self.private = bytearray(op.kind is COLLECTIVE and groups_ok[op.group] for op in self.tops)
        self._solo: list[dict[int, Alone]] = [{} for _ in self._shifts]  # per copy: private op → its run alone
        self._kreplays: dict[tuple[int, int], list[tuple[float, Alone]]] = {}  # (copy, block's runs) → on its links
        self._rel: dict[int, Offsets] = {}  # block op → its parts' times after its start
        self._replays: dict[int, list[tuple[float, Alone]]] = {}  # block op → its collectives' (start, run alone)
        self._blocks: dict[tuple[object, ...], tuple[float, Offsets, list[tuple[float, Alone]]]] = {}
        self.durs = self._durations()
        self._resident: dict[int, int] = {}  # GPU → its communication ops resident now
        self._counted: set[int] = set()  # the comm ops counted there
        if self.overlap:  # compute then depends on what else runs: every GPU kernel goes through SharedGpu
            self.shares = bytearray(op.kind is COMPUTE and op.stream != "cpu" for op in self.tops)
            self.private = bytearray(self.T)
        self.timed = bytearray(op.kind is COMPUTE and not sh for op, sh in zip(self.tops, self.shares))
        self._pkey, self._ppair = self._p2p_keys()
        # per block op, the index of its shape (its collectives' runs); per copy and shape, their bytes
        shapes: dict[int, int] = {}
        self._shape = array("q", [-1]) * self.T
        for t, runs in self._replays.items():
            self._shape[t] = shapes.setdefault(id(runs), len(shapes))
        self._moved: list[list[list[tuple[int, float]] | None]] = [[None] * len(shapes) for _ in self._shifts]
        # per copy: the sends or recvs waiting for their match, by template key; each send pair's plan
        self._pwait: list[dict[P2PKey, list[Any]]] = [{} for _ in self._shifts]
        npairs = max(self._ppair, default=-1) + 1
        self._pplan: list[list[tuple[Plan, Any] | None]] = [[None] * npairs for _ in self._shifts]

    # -- copies ------------------------------------------------------------------
    def _tr(self, k: int, r: int) -> int:
        """Rank ``r`` of the template, in copy ``k``."""
        m = self._rmaps[k]
        if m is None or r < 0:
            return r
        x = m.get(r)
        if x is None:
            stamp, shift = self._stamp, self._shifts[k]
            assert stamp is not None and shift is not None  # a map exists only for a moving copy
            x = m[r] = stamp.translate(r, shift)
        return x

    def _group(self, k: int, g: tuple[int, ...]) -> tuple[int, ...]:
        """Group ``g`` of the template, in copy ``k`` (sorted)."""
        if self._rmaps[k] is None:
            return g
        m = self._gmaps[k]
        x = m.get(g)
        if x is None:
            x = m[g] = tuple(sorted(self._tr(k, r) for r in g))
        return x

    def op_id(self, i: int) -> int:
        """The program's id of flat op ``i``."""
        k, t = divmod(i, self.T)
        return self.tops[t].id + k * self.stride

    def rank(self, i: int) -> int:
        """The world rank of flat op ``i``."""
        k, t = divmod(i, self.T)
        return self._tr(k, self.tops[t].rank)

    # -- preparation -------------------------------------------------------------
    def _wire(self) -> tuple[array[int], array[int], list[int]]:
        """Successors of each template op, as flat arrays (op t's are ``to[off[t]:off[t + 1]]``, in
        program order), and its count of prerequisites (deps + stream predecessor).

        Flat arrays, not a list per op: 16 B an op and edge, where the lists cost ~130 B an op
        (235 MB of a 1.84M-op run)."""
        ops = self.tops
        n = len(ops)
        ids = [op.id for op in ops]
        # the builder numbers its ops 0, 1, 2, ... in list order: an id is then its position
        index: dict[int, int] | None = None if ids == list(range(n)) else dict(zip(ids, range(n)))
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
        return (*_by_source(src, dst, n), wait)

    def _call_numbers(self) -> array[int]:
        """Per template op, its call number on its (rank, group) communicator, in program order
        (-1 for other ops). NCCL matches the calls of a communicator in the order each rank
        issues them (every rank must call its collectives on a communicator in the same order;
        NCCL user guide, "Collective Operations"); a framework issues them in program order,
        whichever stream (``zero``, ``dp``) they later run on. Matching by arrival order
        instead paired a ZeRO-3 all-gather with a reduce-scatter as soon as ranks fell out of
        lock-step (issue #17). A copy's ops are its template's, so the number holds for every copy."""
        seen: dict[tuple[int, tuple[int, ...]], int] = {}
        out = array("q", [-1]) * len(self.tops)
        for t, op in enumerate(self.tops):
            if op.kind is COLLECTIVE:
                key = (op.rank, op.group)
                out[t] = seen.get(key, 0)
                seen[key] = out[t] + 1
        return out

    def _sharing(self) -> bytearray:
        """Per template op: a GPU compute op of a rank whose compute runs on more than one stream.
        Those ops share their GPU (``emulator.devices.sharing``); every other compute op runs at
        full speed on the fast path (a rank with one compute stream never runs two kernels at once).
        Host ops (stream ``cpu``, imported traces) are the CPU's time, not the GPU's."""
        streams: dict[int, set[str]] = {}
        for op in self.tops:
            if op.kind is COMPUTE and op.stream != "cpu":
                streams.setdefault(op.rank, set()).add(op.stream)
        return bytearray(op.kind is COMPUTE and op.stream != "cpu" and len(streams[op.rank]) > 1 for op in self.tops)

    def _durations(self) -> list[array[float]]:
        """Per copy, the duration of each template op (a block's: its last part's end after its
        start); copies whose ranks have the same slowdowns share one list."""
        gpus = self.gpus
        ranks = sorted({op.rank for op in self.tops})
        cache: dict[tuple[float, ...], array[float]] = {}
        out = []
        for k in range(len(self._shifts)):
            sig = tuple(gpus[self._tr(k, r)].slowdown if self._tr(k, r) in gpus else 1.0 for r in ranks)
            d = cache.get(sig)
            if d is None:
                d = cache[sig] = array("d", [self._block(t, op) if op.parts else
                                             gpus[self._tr(k, op.rank)].compute_time(op) if op.kind is COMPUTE
                                             else 0.0 for t, op in enumerate(self.tops)])
            out.append(d)
        return out

    def _block(self, t: int, op: Op) -> float:
        """The duration of block op ``t`` (its parts' times are kept for its spans, and its
        collectives' runs alone for their bytes: ``_advance``, copy by copy: ``_replays_of``). Every
        copy's parts take as long as the template's (``_copies_alike``)."""
        gpu = self.gpus[op.rank]
        key = (id(op.parts), gpu.slowdown)
        hit = self._blocks.get(key)
        if hit is None:
            solo: list[Alone | None] = []
            durations = []
            for part in op.parts:
                if part.kind is COMPUTE:
                    assert part.duration is not None  # the builder costs every kernel
                    solo.append(None)
                    durations.append(part.duration * gpu.slowdown)  # as Gpu.compute_time
                else:
                    a = self._alone_run(part.collective, part.group, -1, part.bytes)
                    solo.append(a)
                    durations.append(a.duration)
            rel = offsets(op.parts, durations)
            runs = [(s, a) for s, a in zip(rel[0], solo) if a is not None]
            hit = self._blocks[key] = (rel[1][-1], rel, runs)
        self._rel[t], self._replays[t] = hit[1], hit[2]
        return hit[0]

    def _plan_keys(self) -> list[PlanKey]:
        """Every (collective, group, root) the run will ask the model for, in a fixed order."""
        base: set[PlanKey] = set()
        for op in self.tops:
            if op.kind is COLLECTIVE:
                base.add((op.collective, op.group, op.root))
            elif op.kind is SEND:
                base.add(("p2p", (op.rank, op.peer), op.rank))
            elif op.parts:
                for part in op.parts:
                    if part.kind is COLLECTIVE:
                        base.add((part.collective, part.group, -1))
        keys: set[PlanKey] = set()
        tr = self._tr
        for k in range(len(self._shifts)):
            for c, g, r in base:
                g2 = tuple(tr(k, x) for x in g) if c == "p2p" else self._group(k, g)
                keys.add((c, g2, tr(k, r)))
        return sorted(keys, key=repr)

    def _private_groups(self, keys: list[PlanKey]) -> dict[tuple[int, ...], bool]:
        """Per group, whether its collectives are *private*: ones the fabric would run exactly as
        they run alone, so that their duration is fixed (``emulator.network.fabric.alone``, once
        per size).

        That holds when (1) one member of its group is simulated (the rest are folded copies), so
        it starts as that member issues it; (2) no plan of the run but its group's own uses any of
        its links (compressed links: a link compression kept stands for all it merged), so no
        other flow shares them; (3) the group's collectives run on one stream, so they never
        share them with each other. Tensor-parallel collectives on a node's NVLink are the usual
        case. Each copy of a stamped program must meet them with its own group (a run with every
        member simulated has none; ``folding.restamp``'s copies, whose tensor-parallel peers stay
        folded, have their own)."""
        streams: dict[tuple[int, ...], set[str]] = {}
        for op in self.tops:
            if op.kind is COLLECTIVE:
                streams.setdefault(op.group, set()).add(op.stream)
            elif op.parts:
                for part in op.parts:
                    if part.kind is COLLECTIVE:
                        streams.setdefault(part.group, set()).add(part.stream)
        shared = ()  # the owner of a link that more than one communicator or transfer uses
        owner: dict[int, object] = {}
        links_of: dict[tuple[int, ...], set[int]] = {}
        for c, g, r in keys:
            who: object = g if c != "p2p" else ("p2p", g)
            used = links_of.setdefault(g, set()) if c != "p2p" else set()
            for plan in self.model.plans(c, g, r):
                for phase in plan:
                    for f in phase:
                        for link in f.links:
                            used.add(link)
                            if owner.setdefault(link, who) != who:
                                owner[link] = shared

        def alone_in(g: tuple[int, ...]) -> bool:
            simulated = sum(1 for r in g if r in self.simulated)
            return simulated == 1 and all(owner[link] == g for link in links_of.get(g, ()))

        copies = range(len(self._shifts))
        return {g: len(ss) == 1 and all(alone_in(self._group(k, g)) for k in copies) for g, ss in streams.items()}

    def _blocks_hold(self, groups_ok: dict[tuple[int, ...], bool], allowed: bool) -> bool:
        """Whether the block ops can run as one op each: their collectives are private, their
        kernels have their GPU alone (one compute stream, no ``comm_overlap_slowdown``), and
        (``allowed``) no timed fault changes links mid-run. Else they run op by op."""
        if not allowed or self.overlap:
            return False
        compute: dict[int, set[str]] = {}
        for op in self.tops:
            if op.kind is COMPUTE and op.stream != "cpu":
                compute.setdefault(op.rank, set()).add(op.stream)
        return all(groups_ok[p.group] and len(compute[op.rank]) == 1
                   for op in self.tops if op.parts for p in op.parts if p.kind is COLLECTIVE) and self._copies_alike()

    def _copies_alike(self) -> bool:
        """Whether every block collective takes each copy as long as the template's (its parts' times,
        ``_block``, are then every copy's): copies on like links, as ``folding.restamp``'s are."""
        if len(self._shifts) == 1:
            return True
        seen: set[tuple[str, tuple[int, ...], float]] = set()
        for op in self.tops:
            for p in op.parts:
                key = (p.collective, p.group, p.bytes)
                if p.kind is COLLECTIVE and key not in seen:
                    seen.add(key)
                    d = self._alone_run(p.collective, p.group, -1, p.bytes).duration
                    if any(self._alone_run(p.collective, self._group(k, p.group), -1, p.bytes).duration != d
                           for k in range(1, len(self._shifts))):
                        return False
        return True

    def _alone_run(self, collective: str, group: tuple[int, ...], root: int, nbytes: float) -> Alone:
        """A collective run alone on the idle fabric (cached by its key and size)."""
        key = (collective, group, root, nbytes)
        solo = self._alone.get(key)
        if solo is None:
            plan = self.model.collective(collective, group, root, nbytes)
            solo = self._alone[key] = alone(plan, nbytes, self.fabric.capacity)
        return solo

    def _private_time(self, k: int, t: int, at: float) -> float:
        """The duration of private collective ``t`` (``_private``) of copy ``k`` started at ``at``.
        Its bytes go on its links, and the fabric's listeners see the load changes it makes, at their
        times."""
        solos = self._solo[k]
        solo = solos.get(t)
        if solo is None:
            op = self.tops[t]
            solo = solos[t] = self._alone_run(op.collective, self._group(k, op.group), self._tr(k, op.root), op.bytes)
        self._replay(solo, at)
        return solo.duration

    def _replays_of(self, k: int, t: int) -> list[tuple[float, Alone]]:
        """Block ``t``'s collectives in copy ``k`` ≠ 0: the template's times, on the copy's links."""
        runs = self._replays[t]
        key = (k, id(runs))
        hit = self._kreplays.get(key)
        if hit is None:
            parts = [p for p in self.tops[t].parts if p.kind is COLLECTIVE]
            hit = self._kreplays[key] = [(dt, self._alone_run(p.collective, self._group(k, p.group), -1, p.bytes))
                                         for (dt, _), p in zip(runs, parts)]
        return hit

    def _moved_of(self, k: int, t: int) -> list[tuple[int, float]]:
        """The (link, bytes) that block ``t``'s collectives leave in copy ``k``, in the order
        ``_replay`` adds them (kept per copy and block shape)."""
        flat = [lb for _, solo in (self._replays[t] if not k else self._replays_of(k, t)) for lb in solo.link_bytes]
        self._moved[k][self._shape[t]] = flat
        return flat

    def _replay(self, solo: Alone, at: float) -> None:
        """A private collective's bytes go on its links, and the fabric's listeners see the load
        changes it makes, at their times (it started at ``at``)."""
        fabric = self.fabric
        moved = fabric.bytes_on_link
        for link, b in solo.link_bytes:
            moved[link] += b
        if fabric.listeners:
            for dt, loads in solo.loads:
                for cb in fabric.listeners:
                    cb(at + dt, loads)

    # -- running ----------------------------------------------------------------
    def run(self) -> tuple[SpanTable, int]:
        """Run to the end; return the spans and the number of SimPy events processed."""
        if self.fabric.rewrite is not None:  # timed faults change links mid-run: every flow is simulated,
            self.private = bytearray(self.T)  # on every link (a detour is no prepared plan: no slack proof)
            self.fabric.set_slack(set())
        self.timed = bytearray(bool(tm or pv) for tm, pv in zip(self.timed, self.private))
        T = self.T
        heads = [t for t in range(T) if self.waiting[t] == 0]  # every copy starts like the template
        self._advance([k * T + t for k in range(len(self._shifts)) for t in heads])
        env = self.env
        step = env.step
        events = 0
        tick = PROGRESS_EVERY
        j = 0
        try:
            while True:
                for j in range(tick):
                    step()
                events += tick
                if self.progress is not None:
                    self.progress(env.now, events)
        except simpy.core.EmptySchedule:
            events += j
        self.events = events
        if self.n and min(self.end) < 0.0:
            raise DeadlockError(self._deadlock_report())
        return self._spans(), events

    def _advance(self, ready: list[int]) -> None:
        """Start every op in ``ready`` (last first), at the latest end of its prerequisites.

        A *timed* op (a compute op on a GPU it has alone, or a private collective: see
        ``_private``) depends on nothing but its start, so it is finished at once, ahead of the
        simulated clock: its end is its start plus its duration, and its successors learn that
        end (``ready_at``). Chains of timed ops so cost no SimPy event. Any other op whose start
        lies ahead of the clock is started by one timeout at that time (``_later``); one due now
        starts now (``_start``)."""
        now = self.env.now
        T, timed, start, xfer, end, durs = self.T, self.timed, self.start, self.xfer, self.end, self.durs
        succ, waiting, ready_at, kind = self.succ, self.waiting, self.ready_at, self.kind
        listening, moved = bool(self.fabric.listeners), self.fabric.bytes_on_link
        while ready:
            i = ready.pop()
            k, t = divmod(i, T)
            at = ready_at[i]
            if not timed[t]:
                if at > now:
                    self._later(i, at)
                else:
                    self._start(i, k, t, now)
                continue
            start[i] = xfer[i] = at
            c = kind[t]
            if c == 0:
                e = at + durs[k][t]
            elif c == 1:
                e = at + self._private_time(k, t, at)
            else:  # BLOCK: its collectives move their bytes at their times
                e = at + durs[k][t]
                if listening:
                    for dt, solo in (self._replays[t] if not k else self._replays_of(k, t)):
                        self._replay(solo, at + dt)
                else:  # only the bytes: the same sums, in the same order, from one flat list
                    flat = self._moved[k][self._shape[t]]
                    if flat is None:
                        flat = self._moved_of(k, t)
                    for link, b in flat:
                        moved[link] += b
            end[i] = e
            base = i - t  # copy k's ops are the template's, shifted by k·T
            for j in succ[t]:
                j += base
                if ready_at[j] < e:
                    ready_at[j] = e
                w = waiting[j] - 1
                waiting[j] = w
                if not w:
                    ready.append(j)

    def _later(self, i: int, at: float) -> None:
        """Start op ``i`` at the future time ``at`` (ops due at one time share one timeout)."""
        batch = self._later_at.get(at)
        if batch is None:
            self._later_at[at] = [i]
            self.env.timeout(delay_to(self.env.now, at), at).callbacks.append(self._due)
        else:
            batch.append(i)

    def _due(self, event: simpy.Event) -> None:
        """The ops due at this timeout's time start now, in the order they were put off."""
        ops = self._later_at.pop(event.value)  # type: ignore[arg-type]  # simpy types every value Optional[Any]
        now, T = self.env.now, self.T
        for i in ops:
            k, t = divmod(i, T)
            self._start(i, k, t, now)

    def _start(self, i: int, k: int, t: int, now: float) -> None:
        """Start op ``i`` (copy ``k`` of template op ``t``), which is not timed, now."""
        self.start[i] = now
        c = self.kind[t]
        if c == 0:  # OpKind.COMPUTE on a shared GPU
            self.xfer[i] = now
            d = self.durs[k][t]
            if d > 0.0:
                self._share(self._tr(k, self.tops[t].rank), i, d, now)
            else:
                self._done_many([i])
            return
        if self.overlap and c == 1:
            self._comm_resident(i, self._tr(k, self.tops[t].rank), now, 1)
        if c == 1:  # OpKind.COLLECTIVE
            self._arrive_collective(i, k, t)
        elif self._pkey is not None:  # OpKind.SEND (2) or RECV (3), matched copy by copy
            self._match(i, k, t, c == 2)
        elif c == 2:  # OpKind.SEND
            self._arrive_p2p(i, self._send_key(k, self.tops[t]), 0)
        else:  # OpKind.RECV
            op = self.tops[t]
            self._arrive_p2p(i, (self._tr(k, op.rank), self._tr(k, op.peer), op.tag), 1)

    def _complete(self, finished: Iterable[int], now: float, ready: list[int], start_each: bool = False) -> None:
        """Mark the ``finished`` ops ended at ``now``; append to ``ready`` each successor that this
        leaves with no unmet prerequisite (the successor-release loop of ops the clock finishes;
        ``_advance`` has the timed ops' own).

        With ``start_each``, the successors of each op are started (``_advance`` empties
        ``ready``) before the next op ends: ops that end together keep their start order."""
        T, succ, waiting, end, ready_at = self.T, self.succ, self.waiting, self.end, self.ready_at
        for i in finished:
            end[i] = now
            t = i % T
            base = i - t
            for j in succ[t]:
                j += base
                if ready_at[j] < now:
                    ready_at[j] = now
                w = waiting[j] - 1
                waiting[j] = w
                if not w:
                    ready.append(j)
            if start_each and ready:
                self._advance(ready)

    # -- GPUs shared by several compute streams ---------------------------------------
    def _share(self, gpu: int, i: int, work: float, now: float) -> None:
        """Kernel ``i`` of ``work`` s (at full speed) starts on ``gpu``, sharing it with its running kernels."""
        share = self._gpu_share.get(gpu)
        if share is None:
            share = self._gpu_share[gpu] = SharedGpu()
        share.add(now, i, work)
        self._share_schedule(gpu, share, now)

    def _share_schedule(self, gpu: int, share: SharedGpu, now: float) -> None:
        """(Re)schedule the GPU's next kernel end; an earlier schedule becomes stale."""
        version = self._share_version.get(gpu, 0) + 1
        self._share_version[gpu] = version
        at = share.next_end()
        if at is not None:
            self.env.timeout(max(0.0, at - now), (gpu, version)).callbacks.append(self._share_done)

    def _share_done(self, event: simpy.Event) -> None:
        """A shared GPU's scheduled kernel end (ignored when a later start rescheduled it)."""
        gpu, version = event.value  # type: ignore[misc]  # simpy types every value Optional[Any]
        if self._share_version[gpu] != version:
            return
        now = self.env.now
        share = self._gpu_share[gpu]
        finished = share.finish(now)
        self._share_schedule(gpu, share, now)
        self._complete(finished, now, [], True)  # start each: keep start order

    def _comm_resident(self, i: int, gpu: int, now: float, delta: int) -> None:
        """Collective ``i`` of ``gpu`` becomes resident (``delta`` 1: issued) or leaves (−1: done).
        While any is resident, a GPU with a ``comm_overlap_slowdown`` f computes at 1/f.

        Resident is the NCCL kernel's whole interval, from its issue (it then spins on its SMs
        waiting for the other members) to its end, as the factor is measured (the kernel's
        interval in a Kineto trace). Collectives only: the factor is measured on them;
        point-to-point kernels run on fewer channels, and a pipeline posts its receive a task
        ahead, so counting them would put nearly all of a stage's compute under a collective's
        factor."""
        f = self.overlap.get(gpu)
        if f is None:
            return
        if delta > 0:
            self._counted.add(i)
        elif i in self._counted:
            self._counted.discard(i)
        else:
            return
        before = self._resident.get(gpu, 0)
        after = self._resident[gpu] = before + delta
        if (before == 0) != (after == 0):
            share = self._gpu_share.get(gpu)
            if share is None:
                share = self._gpu_share[gpu] = SharedGpu()
            share.set_speed(now, 1.0 / f if after else 1.0)
            self._share_schedule(gpu, share, now)

    def _done_many(self, members: list[int]) -> None:
        """The ops of a finished transfer (a collective's members, or a send and its recv) ended
        now; their successors start together, after all of them ended."""
        if self.overlap:
            now = self.env.now
            for i in members:
                self._comm_resident(i, self.rank(i), now, -1)
        ready: list[int] = []
        self._complete(members, self.env.now, ready)
        if ready:
            self._advance(ready)

    # -- collectives ------------------------------------------------------------
    def _arrive_collective(self, i: int, k: int, t: int) -> None:
        """Op ``i`` (copy ``k`` of template op ``t``) issued its collective; the last member starts it."""
        op = self.tops[t]
        keys = self._ckeys[k]
        gkey = keys.get((op.rank, op.group))
        if gkey is None:  # (rank, group) of this copy; the template's key when it is the identity
            gkey = keys[(op.rank, op.group)] = (self._tr(k, op.rank), self._group(k, op.group))
        group = gkey[1]
        seq = self.call[t]
        key = (group, seq)
        arrived = self._rdv.get(key)
        if arrived is None:
            arrived = self._rdv[key] = []
        arrived.append(i)
        expected = self._expected.get(group)
        if expected is None:
            expected = self._expected[group] = sum(1 for r in group if r in self.simulated)
        if len(arrived) < expected:
            return
        del self._rdv[key]
        T, tops = self.T, self.tops
        k0, t0 = divmod(arrived[0], T)
        first = tops[t0]
        for j in arrived[1:]:
            o = tops[j % T]
            if o.collective != first.collective or o.bytes != first.bytes:
                raise EmulatorError(
                    f"collective mismatch on group {list(group)} (call #{seq}): op {self.op_id(arrived[0])} on rank "
                    f"{self.rank(arrived[0])} is {first.collective} of {first.bytes:g} B but op {self.op_id(j)} on "
                    f"rank {self.rank(j)} is {o.collective} of {o.bytes:g} B")
        plan = self.model.collective(first.collective, group, self._tr(k0, first.root), first.bytes)
        self._run_plan(plan, first.bytes, arrived)

    def _run_plan(self, plan: Plan, nbytes: float, members: list[int]) -> None:
        """The transfer of ``members`` begins now: the fabric runs the plan's phases."""
        now = self.env.now
        for i in members:
            self.xfer[i] = now
        if not plan:  # a group of one: done now, via the queue (no deep recursion)
            self.env.timeout(0.0).callbacks.append(lambda _e: self._done_many(members))
            return
        self.fabric.run_plan(plan, nbytes, lambda: self._done_many(members))

    # -- point to point -----------------------------------------------------------
    def _send_key(self, k: int, op: Op) -> P2PKey:
        """Match key (dst, src, tag) as seen by the receiver, which may be a representative."""
        dst, src = self._tr(k, op.peer), self._tr(k, op.rank)
        fold = self.fold
        if fold is not None and dst not in self.simulated:
            dst, src = back(fold, dst, src)
        return dst, src, op.tag

    def _arrive_p2p(self, i: int, key: P2PKey, side: int) -> None:
        """Op ``i`` posted its side (0 send, 1 recv) of ``key``; the oldest complete pair starts."""
        pair = self._p2p.get(key)
        if pair is None:
            pair = self._p2p[key] = [[], []]
        pair[side].append(i)
        if pair[0] and pair[1]:
            s = pair[0].pop(0)
            r = pair[1].pop(0)
            if not pair[0] and not pair[1]:
                del self._p2p[key]
            k, t = divmod(s, self.T)
            send = self.tops[t]
            plan = self.model.p2p(self._tr(k, send.rank), self._tr(k, send.peer))
            self._run_plan(plan, send.bytes, [s, r])

    def _p2p_keys(self) -> tuple[list[P2PKey] | None, array[int]]:
        """Per template op, the match key of a send or recv as copy 0 sees it (``_send_key``), and per
        send, the index of its (rank, peer) pair; keys None where a copy's ops might match another
        copy's (a key with a rank outside the template's: then every key is made per op, in world
        ranks, ``_arrive_p2p``).

        Copy k's world key is the template key translated by k: translations along the stamped axes
        commute with the fold's (disjoint axes of one grid) and map the simulated ranks onto
        themselves (the copies' shifts are a group), and copies' ranks are disjoint; so two ops of
        one copy match in world ranks exactly when their template keys are equal, and ops of two
        copies never do when every key's ranks are the template's."""
        ranks = {op.rank for op in self.tops}
        keys: list[P2PKey] = [(-1, -1, -1)] * self.T
        pairs = array("q", [-1]) * self.T
        index: dict[tuple[int, int], int] = {}
        for t, op in enumerate(self.tops):
            if op.kind is SEND:
                key = self._send_key(0, op)
                pairs[t] = index.setdefault((op.rank, op.peer), len(index))
            elif op.kind is RECV:
                key = (op.rank, op.peer, op.tag)
            else:
                continue
            if len(self._shifts) > 1 and not (key[0] in ranks and key[1] in ranks):
                return None, pairs
            keys[t] = key
        return keys, pairs

    def _match(self, i: int, k: int, t: int, send: bool) -> None:
        """Op ``i`` (copy ``k`` of template send or recv ``t``) is posted; with the oldest waiting op
        of the other side and the same key, its transfer starts (NCCL matches a peer's sends and
        receives in the order they are posted)."""
        key = self._pkey[t]  # type: ignore[index]  # set when this path is taken
        waits = self._pwait[k]
        q = waits.get(key)  # [side waiting (True: sends), its ops oldest first]: one side waits at a time
        if q is None:
            waits[key] = [send, i]
            return
        if q[0] is send:
            q.append(i)
            return
        j = q.pop(1)
        if len(q) == 1:
            del waits[key]
        s, r = (i, j) if send else (j, i)
        ts = s - k * self.T
        pi = self._ppair[ts]
        plans = self._pplan[k]
        hit = plans[pi]
        if hit is None:
            op = self.tops[ts]
            plan = self.model.p2p(self._tr(k, op.rank), self._tr(k, op.peer))
            hit = plans[pi] = (plan, plan[0][0] if len(plan) == 1 and len(plan[0]) == 1 else None)
        plan, flow = hit
        if flow is None:
            self._run_plan(plan, self.tops[ts].bytes, [s, r])
            return
        # one flow, one phase (a transfer within a node or between two NICs): the fabric's transfer
        # itself, as ``Fabric.run_plan`` would start it
        now = self.env.now
        self.xfer[s] = self.xfer[r] = now
        self.fabric.transfer(flow.links, flow.weights, self.tops[ts].bytes * flow.volume, flow.latency,
                             lambda: self._done_many([s, r]))

    # -- results --------------------------------------------------------------------
    def _spans(self) -> SpanTable:
        """The run's spans (made lazily from the flat per-op arrays and the template ops), a
        block's one per part."""
        ranks = {op.rank for op in self.tops}
        maps: list[dict[int, int] | None] = []
        for k, m in enumerate(self._rmaps):
            if m is not None:
                for r in ranks:
                    self._tr(k, r)
            maps.append(m)
        if self._rel:
            start, end, xfer = opened_times(self.tops, self._rel, self.start, self.end, self.xfer, len(maps))
            # memoryviews of the numpy arrays, not copies: they slice and iterate as Python floats
            return SpanTable(OpenedFields(self.tops), maps, self.stride, memoryview(start), memoryview(end),
                             memoryview(xfer))
        return SpanTable(OpFields(self.tops), maps, self.stride, self.start, self.end, self.xfer)

    def _deadlock_report(self, limit: int = 12) -> str:
        """The first unfinished op of each stream (at most ``limit`` streams)."""
        left = sum(1 for e in self.end if e < 0.0)
        lines = [f"deadlock: {left} of {self.n} ops can never finish "
                 f"(simulated time {max(self.env.now, max(self.end)):.6g} s). Waiting:"]
        cycle = self._cycle()
        if cycle:
            steps = " -> ".join(f"op {self.op_id(i)} (rank {self.rank(i)} {self.tops[i % self.T].stream})"
                                for i in cycle + cycle[:1])
            lines[0] = lines[0].replace("deadlock:", "deadlock: a dependency cycle:", 1)
            lines.insert(1, f"  cycle: {steps} (each must end before the next can start: a dependency, "
                            "or the op before it on its stream)")
        shown = 0
        heads: dict[tuple[int, str], int] = {}
        for i in range(self.n):
            if self.end[i] < 0:
                key = (self.rank(i), self.tops[i % self.T].stream)
                if key not in heads:
                    heads[key] = i
        for (rank, stream), i in sorted(heads.items()):
            if shown >= limit:
                lines.append(f"  ... and {len(heads) - shown} more streams")
                break
            lines.append(f"  rank {rank} stream {stream}: op {self.op_id(i)} ({self._why(i)})")
            shown += 1
        return "\n".join(lines)

    def _cycle(self) -> list[int]:
        """A cycle of ops that never started, each the prerequisite of the next (dependency or stream
        order), as flat op indices; [] when the unfinished ops form no cycle."""
        T, start = self.T, self.start

        def succ(t: int) -> array[int]:
            return self.to[self.off[t]:self.off[t + 1]]

        state: dict[int, int] = {}  # 1: on the current path, 2: done (no cycle through it)
        for root in range(self.n):
            if start[root] >= 0 or root in state:
                continue
            path, stack = [root], [iter(succ(root % T))]
            state[root] = 1
            while stack:
                base = path[-1] - path[-1] % T
                j = next(stack[-1], None)
                if j is None:
                    state[path.pop()] = 2
                    stack.pop()
                    continue
                j += base
                if start[j] >= 0 or state.get(j) == 2:
                    continue
                if state.get(j) == 1:
                    return path[path.index(j):]
                state[j] = 1
                path.append(j)
                stack.append(iter(succ(j % T)))
        return []

    def _why(self, i: int) -> str:
        """Why op ``i`` never finished, in words."""
        op = self.tops[i % self.T]
        if self.start[i] < 0:
            return (f"{op.kind.label} {op.name or op.collective}: not started; waits for its dependencies or the op "
                    "before it")
        k = i // self.T
        if op.kind is COLLECTIVE:
            return (f"{op.collective} on group {list(self._group(k, op.group))}: issued, waits for the other members "
                    "to issue the matching call")
        if op.kind is SEND:
            return f"send to rank {self._tr(k, op.peer)} tag {op.tag}: no matching recv was ever issued"
        if op.kind is RECV:
            return f"recv from rank {self._tr(k, op.peer)} tag {op.tag}: no matching send was ever issued"
        return f"{op.kind.label}: started but never finished (a transfer with no bandwidth?)"

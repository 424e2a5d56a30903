"""Private collectives: the ones the fabric would run exactly as they run alone, so their time is fixed.

A collective is *private* when one member of its group is simulated (the rest are folded
copies), no plan of the run but its group's own uses any of its links, and its group's
collectives run on one stream (``PrivateRuns.groups``). Tensor-parallel collectives on a
node's NVLink are the usual case. The engine then finishes such a collective ahead of the
clock, at its start plus its duration alone (``emulator.network.fabric.alone``, once per
size), and replays its bytes and load changes onto the fabric at their times, so link
totals and utilisation series are those of running it on the fabric.

A block op (``Op.parts``: a unit's kernels and private collectives) runs as one op the same
way: its parts' times after its start are kept for its spans (``rel``), and its collectives'
runs alone for their bytes (``replays``).
"""
from __future__ import annotations

from array import array

from emulator.devices.gpu import Gpu
from emulator.network.collectives import CollectiveModel, PlanKey
from emulator.network.fabric import Alone, Fabric, alone
from emulator.program import COLLECTIVE, COMPUTE, SEND, Op
from emulator.run.block import Offsets, offsets
from emulator.run.copies import Copies
from emulator.run.wiring import compute_streams


class PrivateRuns:
    """The runs alone of a program's private collectives and block ops, kept by key and size."""

    def __init__(self, tops: list[Op], model: CollectiveModel, fabric: Fabric, copies: Copies,
                 gpus: dict[int, Gpu]) -> None:
        self.tops = tops  # the engine's template ops (replaced when its blocks are opened)
        self.model = model
        self.fabric = fabric
        self.copies = copies
        self.gpus = gpus
        self._alone: dict[tuple[object, ...], Alone] = {}  # (collective, group, root, bytes) → run alone
        self._solo: list[dict[int, Alone]] = [{} for _ in range(copies.count)]  # per copy: op → its run alone
        self._kreplays: dict[tuple[int, int], list[tuple[float, Alone]]] = {}  # (copy, block's runs) → its links
        self._blocks: dict[tuple[object, ...], tuple[float, Offsets, list[tuple[float, Alone]]]] = {}
        self.rel: dict[int, Offsets] = {}  # block op → its parts' times after its start
        self.replays: dict[int, list[tuple[float, Alone]]] = {}  # block op → its collectives' (start, run alone)
        self.shape: array[int] = array("q")  # block op → its shape's index (``index_shapes``)
        self.moved: list[list[list[tuple[int, float]] | None]] = []

    # -- which collectives are private -----------------------------------------------
    def plan_keys(self) -> list[PlanKey]:
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
        tr, group = self.copies.rank, self.copies.group
        for k in range(self.copies.count):
            for c, g, r in base:
                g2 = tuple(tr(k, x) for x in g) if c == "p2p" else group(k, g)
                keys.add((c, g2, tr(k, r)))
        return sorted(keys, key=repr)

    def groups(self, keys: list[PlanKey], simulated: set[int]) -> dict[tuple[int, ...], bool]:
        """Per group, whether its collectives are private: (1) one member of its group is
        simulated, so it starts as that member issues it; (2) no plan of the run but its group's
        own uses any of its links (compressed links: a link compression kept stands for all it
        merged), so no other flow shares them; (3) the group's collectives run on one stream, so
        they never share them with each other. Each copy of a stamped program must meet them with
        its own group (a run with every member simulated has none; ``folding.restamp``'s copies,
        whose tensor-parallel peers stay folded, have their own)."""
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
            members = sum(1 for r in g if r in simulated)
            return members == 1 and all(owner[link] == g for link in links_of.get(g, ()))

        copies = range(self.copies.count)
        group = self.copies.group
        return {g: len(ss) == 1 and all(alone_in(group(k, g)) for k in copies) for g, ss in streams.items()}

    def blocks_hold(self, groups_ok: dict[tuple[int, ...], bool], allowed: bool) -> bool:
        """Whether the block ops can run as one op each: their collectives are private, their
        kernels have their GPU alone (one compute stream; ``allowed`` is False where a GPU's
        compute slows under communication, or a timed fault changes links mid-run). Else they
        run op by op."""
        if not allowed:
            return False
        compute = compute_streams(self.tops)
        return all(groups_ok[p.group] and len(compute[op.rank]) == 1
                   for op in self.tops if op.parts for p in op.parts if p.kind is COLLECTIVE) and self._copies_alike()

    def _copies_alike(self) -> bool:
        """Whether every block collective takes each copy as long as the template's (its parts' times,
        ``block``, are then every copy's): copies on like links, as ``folding.restamp``'s are."""
        if self.copies.count == 1:
            return True
        seen: set[tuple[str, tuple[int, ...], float]] = set()
        group = self.copies.group
        for op in self.tops:
            for p in op.parts:
                key = (p.collective, p.group, p.bytes)
                if p.kind is COLLECTIVE and key not in seen:
                    seen.add(key)
                    d = self.alone_run(p.collective, p.group, -1, p.bytes).duration
                    if any(self.alone_run(p.collective, group(k, p.group), -1, p.bytes).duration != d
                           for k in range(1, self.copies.count)):
                        return False
        return True

    # -- runs alone --------------------------------------------------------------------
    def alone_run(self, collective: str, group: tuple[int, ...], root: int, nbytes: float) -> Alone:
        """A collective run alone on the idle fabric (cached by its key and size)."""
        key = (collective, group, root, nbytes)
        solo = self._alone.get(key)
        if solo is None:
            plan = self.model.collective(collective, group, root, nbytes)
            solo = self._alone[key] = alone(plan, nbytes, self.fabric.capacity)
        return solo

    def block(self, t: int, op: Op) -> float:
        """The duration of block op ``t`` (its parts' times are kept for its spans, and its
        collectives' runs alone for their bytes, copy by copy: ``replays_of``). Every copy's parts
        take as long as the template's (``_copies_alike``)."""
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
                    a = self.alone_run(part.collective, part.group, -1, part.bytes)
                    solo.append(a)
                    durations.append(a.duration)
            rel = offsets(op.parts, durations)
            runs = [(s, a) for s, a in zip(rel[0], solo) if a is not None]
            hit = self._blocks[key] = (rel[1][-1], rel, runs)
        self.rel[t], self.replays[t] = hit[1], hit[2]
        return hit[0]

    def index_shapes(self) -> None:
        """Per block op, the index of its shape (its collectives' runs); per copy and shape, the bytes
        its collectives leave (``moved``, filled on first use by ``moved_of``)."""
        shapes: dict[int, int] = {}
        self.shape = array("q", [-1]) * len(self.tops)
        for t, runs in self.replays.items():
            self.shape[t] = shapes.setdefault(id(runs), len(shapes))
        self.moved = [[None] * len(shapes) for _ in range(self.copies.count)]

    def time(self, k: int, t: int, at: float) -> float:
        """The duration of private collective ``t`` of copy ``k`` started at ``at``. Its bytes go on its
        links, and the fabric's listeners see the load changes it makes, at their times."""
        solos = self._solo[k]
        solo = solos.get(t)
        if solo is None:
            op = self.tops[t]
            copies = self.copies
            solo = solos[t] = self.alone_run(op.collective, copies.group(k, op.group), copies.rank(k, op.root),
                                             op.bytes)
        self.replay(solo, at)
        return solo.duration

    def replays_of(self, k: int, t: int) -> list[tuple[float, Alone]]:
        """Block ``t``'s collectives in copy ``k`` ≠ 0: the template's times, on the copy's links."""
        runs = self.replays[t]
        key = (k, id(runs))
        hit = self._kreplays.get(key)
        if hit is None:
            parts = [p for p in self.tops[t].parts if p.kind is COLLECTIVE]
            group = self.copies.group
            hit = self._kreplays[key] = [(dt, self.alone_run(p.collective, group(k, p.group), -1, p.bytes))
                                         for (dt, _), p in zip(runs, parts)]
        return hit

    def moved_of(self, k: int, t: int) -> list[tuple[int, float]]:
        """The (link, bytes) that block ``t``'s collectives leave in copy ``k`` (kept per copy and
        block shape: one list, which the fabric counts each time it recurs, ``Fabric.owe``)."""
        flat = [lb for _, solo in (self.replays[t] if not k else self.replays_of(k, t)) for lb in solo.link_bytes]
        self.moved[k][self.shape[t]] = flat
        return flat

    def replay(self, solo: Alone, at: float) -> None:
        """A private collective's bytes go on its links, and the fabric's listeners see the load
        changes it makes, at their times (it started at ``at``)."""
        fabric = self.fabric
        fabric.owe(solo.link_bytes)
        if fabric.listeners:
            for dt, loads in solo.loads:
                for cb in fabric.listeners:
                    cb(at + dt, loads)


"""Costs the collectives a live run intercepts, on the scenario's emulated cluster.

Rank r of the live world is GPU r of the scenario's cluster. The other ranks are
symmetric copies of the local one, so when the local rank issues a collective on
a group G, every copy of G issues it at the same moment: the copies are the
translates G + k (mod N) that partition the world (taken greedily in order of k,
which yields the tensor-, data- and pipeline-parallel groups of a Megatron grid).
They share the fabric, so one collective is costed as a Program of all copies
run by the same Engine, CollectiveModel and flow model as ``emulator run``; the
local rank's span is the cost. Results are cached by (op, group, bytes, root).

Uncontended on a custom graph (no efficiency factor, no software step latency),
a ring all-reduce of S bytes over n ranks with per-hop bandwidth B and per-step
path latency α costs exactly 2(n−1)·α + 2(n−1)/n · S/B (DESIGN.md).

Byte counts follow nccl-tests (``emulator.program.Op``): the all-reduce buffer,
the all-gather *output*, the reduce-scatter *input*, the all-to-all send
buffer, the broadcast buffer.
"""
from __future__ import annotations

from emulator.devices.gpu import Gpu
from emulator.errors import EmulatorError
from emulator.program import COLLECTIVE, COLLECTIVE_OPS, RECV, SEND, Op, Program
from emulator.run.engine import Engine
from emulator.run.simulation import build_cluster
from emulator.scenario.spec import Scenario


def copies(group: tuple[int, ...], world: int) -> list[tuple[int, ...]]:
    """The translates of ``group`` (mod ``world``) that partition the world, ``group`` first.

    Order within each copy is kept (it matters for a send/recv pair); a translate
    that overlaps an accepted copy without being equal to it is skipped.
    """
    taken: set[int] = set(group)
    out = [tuple(group)]
    seen = {frozenset(group)}
    for k in range(1, world):
        img = tuple((r + k) % world for r in group)
        ident = frozenset(img)
        if ident in seen or taken & ident:
            continue
        seen.add(ident)
        taken |= ident
        out.append(img)
    return out


class CommCost:
    """Duration of one intercepted collective (or send/recv) for the local rank, in seconds."""

    def __init__(self, scenario: Scenario, world: int) -> None:
        self.scenario = scenario
        cluster = build_cluster(scenario)
        self.topology = cluster.topology
        gpus = len(self.topology.gpus)
        if not 1 <= world <= gpus:
            raise EmulatorError(f"{scenario.path or scenario.name}: a live world of {world} ranks needs "
                                f"1..{gpus} GPUs; the cluster has {gpus}")
        self.world = world
        self.cluster = cluster
        self.model = cluster.collectives
        self._cache: dict[tuple, float] = {}
        self.engine_runs = 0

    def collective(self, op: str, group: tuple[int, ...], nbytes: float, root: int = -1) -> float:
        """One collective ``op`` of ``nbytes`` (nccl-tests S) over ``group`` (world ranks, local first)."""
        if op not in COLLECTIVE_OPS:
            raise ValueError(f"unknown collective {op!r}")
        if len(group) < 2:
            return 0.0
        key = (op, tuple(group), float(nbytes), root)
        t = self._cache.get(key)
        if t is None:
            t = self._cache[key] = self._run_collective(op, tuple(group), float(nbytes), root)
        return t

    def p2p(self, src: int, dst: int, nbytes: float) -> float:
        """A send of ``nbytes`` from ``src`` to ``dst`` (every copy of the pair sends at once)."""
        key = ("p2p", (src, dst), float(nbytes), -1)
        t = self._cache.get(key)
        if t is None:
            t = self._cache[key] = self._run_p2p(src, dst, float(nbytes))
        return t

    # -- engine runs ------------------------------------------------------------
    def _gpus(self, ranks: set[int]) -> dict[int, Gpu]:
        return self.cluster.gpus(ranks)

    def _run(self, ops: list[Op], local_ids: set[int]) -> float:
        self.engine_runs += 1
        program = Program(self.world, ops)
        engine = Engine(program, self.model, self.topology.capacity, self._gpus({o.rank for o in ops}))
        spans, _events = engine.run()
        return max(s.end_s - s.start_s for s in spans if s.op_id in local_ids)

    def _run_collective(self, op: str, group: tuple[int, ...], nbytes: float, root: int) -> float:
        ops: list[Op] = []
        local = group[0]
        for copy in copies(group, self.world):
            members = tuple(sorted(copy))
            shift = (copy[0] - local) % self.world
            croot = (root + shift) % self.world if root >= 0 else members[0]
            for r in members:
                ops.append(Op(id=len(ops), rank=r, kind=COLLECTIVE, stream="comm", collective=op,
                              group=members, root=croot, bytes=nbytes, name=op))
        local_ids = {o.id for o in ops if o.rank == local and o.group == tuple(sorted(group))}
        return self._run(ops, local_ids)

    def _run_p2p(self, src: int, dst: int, nbytes: float) -> float:
        ops: list[Op] = []
        for a, b in copies((src, dst), self.world):
            ops.append(Op(id=len(ops), rank=a, kind=SEND, stream="send", peer=b, bytes=nbytes, name="send"))
            ops.append(Op(id=len(ops), rank=b, kind=RECV, stream="recv", peer=a, bytes=nbytes, name="recv"))
        return self._run(ops, {0})

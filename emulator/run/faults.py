"""Faults and stragglers: a scenario's ``cluster.overrides`` applied to a built cluster.

- ``gpu_slowdown`` (target ``gpu:R`` or ``node:N``): compute ops run ``factor``
  times longer on those GPUs;
- ``link_degrade`` (target a link ``A->B``, a cable ``A<->B``, or a graph node
  name, meaning every link touching it): bandwidth × ``factor``, plus
  ``extra_latency``;
- ``link_fail``: those links carry nothing; routing avoids them, and a pair of
  GPUs left with no route is an error that names them;
- ``node_fail`` (target ``node:N``): rejected — a job cannot run on a failed node.

Failures in time: a link override with ``at`` (and ``until``) happens in the middle
of the run (:class:`FaultSchedule`, a SimPy process on the fabric). At ``at``:
- ``link_degrade``: the links' capacity × ``factor`` (the product of the degrades
  active on a link), until ``until``;
- ``link_fail``: every flow on a failed link u→v is rerouted, its remaining bytes
  sent round the link over the even split of the shortest switch-only paths u→v that
  avoid every failed link (``emulator.network.routing.detour``, as a fast-reroute
  does); flows that start later take the same detour. A link to or from a failed
  switch (a whole spine: every link of it failed) has no such path; its share goes
  over the switch's live siblings, the switches with the same neighbours, as ECMP
  leaves a dead switch out of the path set (``routing.around_switch``). With no way
  round (a NIC's own port), the flows stall (capacity 0) until ``until``; with no ``until`` the run
  cannot end, which the engine reports as a deadlock. At ``until`` the link carries
  again: new flows use it, stalled ones resume, rerouted ones keep their detour.

The flow plans of a run are compressed (``emulator.network.compression``: one link
stands for a group carrying the very same flows); with timed faults every flow is
expanded back onto all its links as it starts, so a fault on any one link is exact.
Each timed fault is a :class:`FaultRecord` that the summary and the Perfetto trace show.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import simpy

from emulator.errors import EmulatorError
from emulator.network.fabric import Fabric, Flow
from emulator.network.routing import around_switch, detour
from emulator.network.topology import Layout, Topology
from emulator.result import FaultRecord, OverrideRecord
from emulator.scenario.schema import MIN_BANDWIDTH
from emulator.scenario.spec import Fault


class FaultError(EmulatorError):
    """An override that cannot be applied."""


def _links(topo: Topology, target: str, where: str = "cluster.overrides") -> list[int]:
    ids: list[int | None]
    if "<->" in target:
        a, b = (x.strip() for x in target.split("<->", 1))
        ids = [topo.link_ids.get((a, b)), topo.link_ids.get((b, a))]
    elif "->" in target:
        a, b = (x.strip() for x in target.split("->", 1))
        ids = [topo.link_ids.get((a, b))]
    else:
        if target not in topo.graph:
            raise FaultError(f"{where}: unknown link or node {target!r} "
                             "(use a link 'A->B', a cable 'A<->B' or a node name such as 'nic3.0', 'leaf1', 'gpu5')")
        ids = [i for i, (u, v) in enumerate(topo.links) if target in (u, v)]
    found = [i for i in ids if i is not None]
    if not found:
        raise FaultError(f"{where}: no link {target!r} in the topology")
    return found


def _ranks(topo: Topology, target: str) -> list[int]:
    kind, _, num = target.partition(":")
    if kind in ("gpu", "rank") and num.isdigit() and int(num) < len(topo.gpus):
        return [int(num)]
    g = topo.server_gpus or topo.gpus_per_node  # a scenario's node: a server (an NVL72 tray), not its domain
    if kind == "node" and num.isdigit() and g and int(num) * g < len(topo.gpus):
        return list(range(int(num) * g, min(len(topo.gpus), (int(num) + 1) * g)))
    raise FaultError(f"cluster.overrides: target {target!r} is not 'gpu:R' (0..{len(topo.gpus) - 1}) or 'node:N'")


def _line_rate(topo: Topology, link: int) -> float:
    """The raw line rate (B/s) of ``link``, as its builder or graph file gave it."""
    edges = topo.source.edges if isinstance(topo.source, Layout) else topo.graph.edges
    rate: float = edges[topo.links[link]]["bandwidth"]
    return rate


def check_floor(topo: Topology, overrides: tuple[Fault, ...]) -> None:
    """Refuse ``link_degrade`` factors that leave a link below the bandwidth floor of every
    bandwidth key (``MIN_BANDWIDTH``, 1 Mb/s: emulator.scenario.schema), with every degrade of
    the link active at once (timed ones multiply with the rest while they overlap)."""
    product: dict[int, float] = {}
    for k, ov in enumerate(overrides):
        if ov.kind != "link_degrade":
            continue
        for i in _links(topo, ov.target, f"cluster.overrides[{k}].target"):
            product[i] = product.get(i, 1.0) * ov.factor
            if _line_rate(topo, i) * product[i] < MIN_BANDWIDTH:
                u, v = topo.links[i]
                raise FaultError(f"cluster.overrides[{k}].factor: link_degrade leaves {u}->{v} at "
                                 f"{_line_rate(topo, i) * product[i] * 8:.3g} b/s, below the 1 Mb/s that every "
                                 f"bandwidth must reach; expected a factor of at least "
                                 f"{MIN_BANDWIDTH / (_line_rate(topo, i) * product[i] / ov.factor):.3g}, "
                                 f"got {ov.factor:g}")


def apply_faults(topo: Topology, overrides: tuple[Fault, ...]) -> dict[int, float]:
    """Apply link overrides to ``topo`` in place; return the per-rank slowdown factors."""
    check_floor(topo, overrides)
    slowdown: dict[int, float] = {}
    failed = set(topo.failed)
    for ov in overrides:
        if is_timed(ov):
            continue  # applied in the run, by a FaultSchedule
        if ov.kind == "gpu_slowdown":
            for r in _ranks(topo, ov.target):
                slowdown[r] = slowdown.get(r, 1.0) * ov.factor
        elif ov.kind == "link_degrade":
            for i in _links(topo, ov.target):
                topo.capacity[i] *= ov.factor
                topo.latency[i] += ov.extra_latency
                u, v = topo.links[i]
                topo.graph.edges[u, v]["latency"] += ov.extra_latency
        elif ov.kind == "link_fail":
            for i in _links(topo, ov.target):
                failed.add(topo.links[i])
        elif ov.kind == "node_fail":
            raise FaultError(f"cluster.overrides: {ov.target} has failed and a job cannot run on a failed node; "
                             "reduce cluster.nodes (and the parallel layout) to leave it out")
        else:
            raise FaultError(f"cluster.overrides: unknown kind {ov.kind!r} "
                             "(gpu_slowdown | link_degrade | link_fail | node_fail)")
    topo.failed = frozenset(failed)
    return slowdown


def applied_overrides(topo: Topology, overrides: tuple[Fault, ...]) -> list[OverrideRecord]:
    """What each override in force from the start reached (``apply_faults`` resolved the same names)."""
    out = []
    for ov in overrides:
        if is_timed(ov) or ov.kind not in ("gpu_slowdown", "link_degrade", "link_fail"):
            continue
        rec = OverrideRecord(ov.kind, ov.target, ov.factor, ov.extra_latency)
        if ov.kind == "gpu_slowdown":
            rec.gpus = len(_ranks(topo, ov.target))
        else:
            rec.links = len(_links(topo, ov.target))
        out.append(rec)
    return out


def is_timed(ov: Fault) -> bool:
    """Whether an override happens in the middle of the run (it has ``at`` or ``until``)."""
    return ov.at is not None or ov.until is not None


@dataclass(frozen=True)
class TimedFault:
    """A link fault from ``at`` to ``until`` (s; None: never recovers) on resolved link ids."""

    kind: str  # link_degrade | link_fail
    target: str
    links: tuple[int, ...]
    factor: float
    at: float
    until: float | None


def timed_faults(topo: Topology, overrides: tuple[Fault, ...]) -> list[TimedFault]:
    """The timed link overrides of a scenario, their targets resolved on ``topo``."""
    out = []
    for k, ov in enumerate(overrides):
        if is_timed(ov):
            if ov.kind not in ("link_degrade", "link_fail"):
                raise FaultError(f"cluster.overrides[{k}]: {ov.kind} cannot be timed (at/until are for link faults)")
            links = tuple(_links(topo, ov.target, f"cluster.overrides[{k}].target"))
            out.append(TimedFault(ov.kind, ov.target, links, ov.factor, ov.at or 0.0, ov.until))
    return out


class FaultSchedule:
    """Plays timed link faults on a running fabric (see the module doc)."""

    def __init__(self, env: simpy.Environment, fabric: Fabric, topo: Topology, faults: list[TimedFault],
                 alias: dict[int, int]) -> None:
        self.env, self.fabric, self.topo = env, fabric, topo
        self.faults = faults
        self.records = [FaultRecord(f.kind, f.target, f.at, f.until) for f in faults]
        self.base = list(fabric.capacity)
        self.group: dict[int, list[int]] = {}  # kept link → every link it stands for
        for link, kept in sorted(alias.items()):
            self.group.setdefault(kept, []).append(link)
        self.active: list[TimedFault] = []
        self.detours: dict[int, dict[int, float] | None] = {}  # failed link → its detour (None: stall)

    def start(self) -> None:
        """Expand every flow as it starts, and schedule the faults."""
        if not self.faults:
            return
        self.fabric.rewrite = self._rewrite
        for i, f in enumerate(self.faults):
            self.env.timeout(f.at, (i, True)).callbacks.append(self._event)
            if f.until is not None:
                self.env.timeout(f.until, (i, False)).callbacks.append(self._event)

    def _event(self, event: simpy.Event) -> None:
        i, begins = event.value  # type: ignore[misc]  # simpy types every value Optional[Any]
        f = self.faults[i]
        if begins:
            self.active.append(f)
        else:
            self.active.remove(f)
        self._update_detours()
        if begins and f.kind == "link_fail":
            for link in f.links:
                self._reroute(link, self.records[i])
        for link in f.links:
            self.fabric.set_capacity(link, self._capacity(link))

    def _failed(self) -> set[int]:
        return {link for f in self.active if f.kind == "link_fail" for link in f.links}

    def _update_detours(self) -> None:
        failed = self._failed()
        edges = set(self.topo.failed) | {self.topo.links[l] for l in failed}
        self.detours = {link: detour(self.topo, edges, link) or around_switch(self.topo, edges, link)
                        for link in sorted(failed)}

    def _capacity(self, link: int) -> float:
        if link in self.detours:
            return 0.0
        factors = [f.factor for f in self.active if f.kind == "link_degrade" and link in f.links]
        return self.base[link] * math.prod(factors)

    def _reroute(self, link: int, record: FaultRecord) -> None:
        way = self.detours.get(link)
        for flow in self.fabric.flows_on(link):
            if way is None:
                record.stalled += 1
                continue
            record.rerouted += 1
            links, weights = _replace(dict(zip(flow.links, flow.weights)), self.detours)
            self.fabric.reroute(flow, links, weights)

    def _rewrite(self, flow: Flow) -> None:
        acc: dict[int, float] = {}
        group = self.group
        for link, w in zip(flow.links, flow.weights):
            for m in group.get(link, (link,)):
                acc[m] = acc.get(m, 0.0) + w
        for link in acc.keys() & self.detours.keys():  # a flow that starts during a failure: count it
            record = self._owner(link)
            if self.detours[link] is None:
                record.stalled += 1
            else:
                record.rerouted += 1
        flow.links, flow.weights = _replace(acc, self.detours)

    def _owner(self, link: int) -> FaultRecord:
        """The record of the first active failure of ``link``."""
        f = next(f for f in self.active if f.kind == "link_fail" and link in f.links)
        return self.records[next(i for i, g in enumerate(self.faults) if g is f)]


def _replace(acc: dict[int, float], detours: dict[int, dict[int, float] | None]) -> tuple[tuple[int, ...],
                                                                                           tuple[float, ...]]:
    """Links and weights with every failed link that has a detour replaced by it."""
    for link in [l for l in acc if detours.get(l)]:
        w = acc.pop(link)
        for d, wd in detours[link].items():  # type: ignore[union-attr]  # filtered: not None
            acc[d] = acc.get(d, 0.0) + w * wd
    links = tuple(sorted(acc))
    return links, tuple(acc[l] for l in links)

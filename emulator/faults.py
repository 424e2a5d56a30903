"""Faults and stragglers: a scenario's ``cluster.overrides`` applied to a built cluster.

- ``gpu_slowdown`` (target ``gpu:R`` or ``node:N``): compute ops run ``factor``
  times longer on those GPUs;
- ``link_degrade`` (target a link ``A->B``, a cable ``A<->B``, or a graph node
  name, meaning every link touching it): bandwidth × ``factor``, plus
  ``extra_latency``;
- ``link_fail``: those links carry nothing; routing avoids them, and a pair of
  GPUs left with no route is an error that names them;
- ``node_fail`` (target ``node:N``): rejected — a job cannot run on a failed node.
"""
from __future__ import annotations

from emulator.errors import EmulatorError
from emulator.network.topology import Topology
from emulator.scenario.spec import Override


class FaultError(EmulatorError):
    """An override that cannot be applied."""


def _links(topo: Topology, target: str) -> list[int]:
    ids: list[int | None]
    if "<->" in target:
        a, b = (x.strip() for x in target.split("<->", 1))
        ids = [topo.link_ids.get((a, b)), topo.link_ids.get((b, a))]
    elif "->" in target:
        a, b = (x.strip() for x in target.split("->", 1))
        ids = [topo.link_ids.get((a, b))]
    else:
        if target not in topo.graph:
            raise FaultError(f"cluster.overrides: unknown link or node {target!r} "
                             "(use a link 'A->B', a cable 'A<->B' or a node name such as 'nic3.0', 'leaf1', 'gpu5')")
        ids = [i for i, (u, v) in enumerate(topo.links) if target in (u, v)]
    found = [i for i in ids if i is not None]
    if not found:
        raise FaultError(f"cluster.overrides: no link {target!r} in the topology")
    return found


def _ranks(topo: Topology, target: str) -> list[int]:
    kind, _, num = target.partition(":")
    if kind in ("gpu", "rank") and num.isdigit() and int(num) < len(topo.gpus):
        return [int(num)]
    if kind == "node" and num.isdigit() and topo.gpus_per_node and int(num) * topo.gpus_per_node < len(topo.gpus):
        g = topo.gpus_per_node
        return list(range(int(num) * g, (int(num) + 1) * g))
    raise FaultError(f"cluster.overrides: target {target!r} is not 'gpu:R' (0..{len(topo.gpus) - 1}) or 'node:N'")


def apply_faults(topo: Topology, overrides: tuple[Override, ...]) -> dict[int, float]:
    """Apply link overrides to ``topo`` in place; return the per-rank slowdown factors."""
    slowdown: dict[int, float] = {}
    failed = set(topo.failed)
    for ov in overrides:
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

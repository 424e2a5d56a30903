"""NICs: a server's network ports, as links of the topology.

A NIC has two ports onto its fabric switch (egress and ingress), the links that
InfiniBand/RoCE traffic of its GPUs crosses; this module finds them, and the
utilisation of links over a run (bytes moved / (capacity × time)), so that a
report can say which link or NIC is the bottleneck.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from emulator.network.topology import Layout, Topology


@dataclass(frozen=True)
class Nic:
    name: str
    node: int
    egress: tuple[int, ...]  # link ids NIC → fabric
    ingress: tuple[int, ...]  # link ids fabric → NIC


def nics(topo: Topology) -> list[Nic]:
    """Every NIC of the topology with its fabric ports (GPU↔NIC PCIe links excluded)."""
    if isinstance(topo.source, Layout):
        return _laid_out_nics(topo, topo.source)
    out = []
    g = topo.graph
    for name, data in g.nodes(data=True):
        if data.get("kind") != "nic":
            continue
        egress = tuple(topo.link_ids[(name, v)] for v in g.successors(name) if g.nodes[v].get("kind") == "switch")
        ingress = tuple(topo.link_ids[(u, name)] for u in g.predecessors(name) if g.nodes[u].get("kind") == "switch")
        out.append(Nic(name, data.get("node", -1), egress, ingress))
    return sorted(out, key=lambda n: n.name)


def _laid_out_nics(topo: Topology, layout: Layout) -> list[Nic]:
    """``nics`` on a generated network, from its edges in the order they were laid (the
    neighbour order of its graph), without building the graph."""
    kinds = {n: d.get("kind") for n, d in layout.nodes.items()}
    egress: dict[str, list[int]] = {}
    ingress: dict[str, list[int]] = {}
    for u, v in layout.edges:
        if kinds[u] == "nic" and kinds[v] == "switch":
            egress.setdefault(u, []).append(topo.link_ids[u, v])
        elif kinds[v] == "nic" and kinds[u] == "switch":
            ingress.setdefault(v, []).append(topo.link_ids[u, v])
    out = [Nic(n, d.get("node", -1), tuple(egress.get(n, ())), tuple(ingress.get(n, ())))
           for n, d in layout.nodes.items() if d.get("kind") == "nic"]
    return sorted(out, key=lambda n: n.name)


def utilisation(link_bytes: list[float], capacity: list[float], period: float) -> list[float]:
    """Per link: bytes moved / (capacity × period)."""
    if period <= 0:
        return [0.0] * len(link_bytes)
    return [b / (c * period) if c > 0 else 0.0 for b, c in zip(link_bytes, capacity)]


def busiest_links(topo: Topology, link_bytes: list[float], period: float, top: int = 5) -> list[dict]:
    """The ``top`` links by utilisation over ``period`` (ties broken by name, for determinism)."""
    util = utilisation(link_bytes, topo.capacity, period)
    used = [i for i, b in enumerate(link_bytes) if b > 0]
    if len(used) > top:  # the first ``top`` all reach the top-th highest utilisation: sort those only
        cut = heapq.nlargest(top, [util[i] for i in used])[-1]
        used = [i for i in used if util[i] >= cut]
    order = sorted(used, key=lambda i: (-util[i], topo.links[i]))
    return [{"link": f"{topo.links[i][0]}->{topo.links[i][1]}", "class": topo.cls[i], "utilisation": util[i],
             "bytes": link_bytes[i], "capacity_B_per_s": topo.capacity[i]} for i in order[:top]]


def busiest_nic(topo: Topology, link_bytes: list[float], period: float) -> dict | None:
    """The NIC whose busier direction is the most utilised."""
    util = utilisation(link_bytes, topo.capacity, period)
    best: dict[str, Any] | None = None
    for nic in nics(topo):
        for direction, ports in (("egress", nic.egress), ("ingress", nic.ingress)):
            for p in ports:
                if link_bytes[p] > 0 and (best is None or util[p] > best["utilisation"]):
                    best = {"nic": nic.name, "direction": direction, "utilisation": util[p]}
    return best

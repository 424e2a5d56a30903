"""NICs: a server's network ports, as links of the topology.

A NIC has two ports onto its fabric switch (egress and ingress), the links that
InfiniBand/RoCE traffic of its GPUs crosses; this module finds them, and the
utilisation of links over a run (bytes moved / (capacity × time)), so that a
report can say which link or NIC is the bottleneck.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

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
    ports = _laid_out_ports(topo, layout)
    out = [Nic(n, layout.nodes[n].get("node", -1), tuple(e), tuple(i)) for n, (e, i) in ports.items()]
    return sorted(out, key=lambda n: n.name)


def _laid_out_ports(topo: Topology, layout: Layout) -> dict[str, tuple[list[int], list[int]]]:
    """NIC name → (egress, ingress) link ids on a generated network, NICs in layout order."""
    kinds = {n: d.get("kind") for n, d in layout.nodes.items()}
    ports: dict[str, tuple[list[int], list[int]]] = {n: ([], []) for n, k in kinds.items() if k == "nic"}
    ids = topo.link_ids
    for u, v in layout.edges:
        ku, kv = kinds[u], kinds[v]
        if ku == "nic" and kv == "switch":
            ports[u][0].append(ids[u, v])
        elif kv == "nic" and ku == "switch":
            ports[v][1].append(ids[u, v])
    return ports


def utilisation(link_bytes: list[float], capacity: list[float], period: float) -> list[float]:
    """Per link: bytes moved / (capacity × period)."""
    if period <= 0:
        return [0.0] * len(link_bytes)
    return [b / (c * period) if c > 0 else 0.0 for b, c in zip(link_bytes, capacity)]


def level(u: float) -> float:
    """A utilisation to 12 significant digits, as links are ranked: two links that carried the same
    traffic, summed in another order, differ in their last bits; they tie, and the name decides."""
    return float(f"{u:.12g}")


def busiest_links(topo: Topology, link_bytes: list[float], period: float, top: int = 5) -> list[dict]:
    """The ``top`` links by utilisation over ``period`` (``level``; ties broken by name, for determinism)."""
    util = utilisation(link_bytes, topo.capacity, period)
    used = [i for i, b in enumerate(link_bytes) if b > 0]
    if len(used) > top:  # the first ``top`` all reach the top-th highest utilisation: sort those only
        cut = level(heapq.nlargest(top, [util[i] for i in used])[-1])
        used = [i for i in used if level(util[i]) >= cut]
    order = sorted(used, key=lambda i: (-level(util[i]), topo.links[i]))
    return [{"link": f"{topo.links[i][0]}->{topo.links[i][1]}", "class": topo.cls[i], "utilisation": util[i],
             "bytes": link_bytes[i], "capacity_B_per_s": topo.capacity[i]} for i in order[:top]]


def busiest_nic(topo: Topology, link_bytes: list[float], period: float) -> dict | None:
    """The NIC whose busier direction is the most utilised (``level``; the first by name among equals;
    in a NIC, egress before ingress, ports in order)."""
    cap = topo.capacity

    def util(p: int) -> float:  # one link of ``utilisation`` (only the NICs' ports are asked for)
        return 0.0 if period <= 0 else (link_bytes[p] / (cap[p] * period) if cap[p] > 0 else 0.0)

    if isinstance(topo.source, Layout):  # without making a Nic per NIC: 16k of them at 16k GPUs
        ports = ((name, e, i) for name, (e, i) in _laid_out_ports(topo, topo.source).items())
    else:
        ports = ((nic.name, list(nic.egress), list(nic.ingress)) for nic in nics(topo))
    best: tuple[float, str, str, float] | None = None  # (level, NIC, direction, utilisation)
    for name, egress, ingress in ports:
        mine: tuple[float, str, float] | None = None  # this NIC's first port at its highest level
        for direction, links in (("egress", egress), ("ingress", ingress)):
            for p in links:
                if link_bytes[p] > 0:
                    u = util(p)
                    if mine is None or level(u) > mine[0]:
                        mine = (level(u), direction, u)
        if mine is not None and (best is None or mine[0] > best[0] or (mine[0] == best[0] and name < best[1])):
            best = (mine[0], name, mine[1], mine[2])
    return None if best is None else {"nic": best[1], "direction": best[2], "utilisation": best[3]}

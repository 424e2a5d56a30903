"""Routing: shortest paths by hop count; ECMP splits traffic evenly over them.

A route from GPU a to GPU b is a tuple of (link id, weight) pairs and a latency.
With k equal-cost paths, each path carries 1/k of the traffic — more exactly,
link u→v carries σ_a(u)·σ_b(v)/σ_a(b) of it, where σ_a(u) counts the shortest
paths a→u and σ_b(v) those v→b: the even split over all shortest paths.
The latency is that of the slowest shortest path (the last byte waits for it).

The generated topologies get a structured router (O(1) per route, no search);
custom graphs and topologies with failed links use a breadth-first search,
cached per source and per destination.
"""
from __future__ import annotations

from collections import deque

from emulator.errors import EmulatorError
from emulator.network.topology import Topology

Route = tuple[tuple[int, ...], tuple[float, ...], float]


class NoRouteError(EmulatorError):
    """No path joins two GPUs (a disconnected graph, or failed links)."""


class Router:
    """Routes between ranks on a Topology, memoised."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._cache: dict[tuple[int, int], Route] = {}
        # breadth-first search from a node: (hop distance, number of shortest paths) per node
        self._fwd: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        self._bwd: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        self.structured = topo.kind != "custom" and not topo.failed

    def route(self, a: int, b: int) -> Route:
        key = (a, b)
        r = self._cache.get(key)
        if r is None:
            r = self._cache[key] = self._compute(a, b)
        return r

    def _compute(self, a: int, b: int) -> Route:
        if a == b:
            return (), (), 0.0
        topo = self.topo
        if self.structured:
            weighted = structured_path(topo, a, b)
        else:
            weighted = self._ecmp(topo.gpus[a], topo.gpus[b])
        ids = topo.link_ids
        acc: dict[int, float] = {}
        for u, v, w in weighted:
            lid = ids[(u, v)]
            acc[lid] = acc.get(lid, 0.0) + w
        links = tuple(sorted(acc))
        weights = tuple(acc[l] for l in links)
        return links, weights, self._latency(weighted)

    def _latency(self, weighted: list[tuple[str, str, float]]) -> float:
        """Latency of the slowest shortest path, by dynamic programming over the DAG."""
        ids, lat = self.topo.link_ids, self.topo.latency  # flat arrays: no graph attribute lookups
        succ: dict[str, list[str]] = {}
        indeg: dict[str, int] = {}
        for u, v, _w in weighted:
            succ.setdefault(u, []).append(v)
            indeg[v] = indeg.get(v, 0) + 1
            indeg.setdefault(u, 0)
        best: dict[str, float] = {n: 0.0 for n, d in indeg.items() if d == 0}
        order = deque(best)
        while order:
            u = order.popleft()
            for v in succ.get(u, ()):
                t = best[u] + lat[ids[(u, v)]]
                if t > best.get(v, -1.0):
                    best[v] = t
                indeg[v] -= 1
                if indeg[v] == 0:
                    order.append(v)
        return max(best.values()) if best else 0.0

    # -- breadth-first ECMP for arbitrary graphs ----------------------------------
    def _bfs(self, start: str, reverse: bool) -> tuple[dict[str, int], dict[str, int]]:
        cache = self._bwd if reverse else self._fwd
        hit = cache.get(start)
        if hit is not None:
            return hit
        g = self.topo.graph
        failed = self.topo.failed
        nbrs = g.predecessors if reverse else g.successors
        dist = {start: 0}
        sigma = {start: 1}
        q = deque([start])
        while q:
            u = q.popleft()
            for v in nbrs(u):
                edge = (v, u) if reverse else (u, v)
                if edge in failed:
                    continue
                if v not in dist:
                    dist[v] = dist[u] + 1
                    sigma[v] = 0
                    q.append(v)
                if dist[v] == dist[u] + 1:
                    sigma[v] += sigma[u]
        cache[start] = (dist, sigma)
        return dist, sigma

    def _ecmp(self, src: str, dst: str) -> list[tuple[str, str, float]]:
        ds, ss = self._bfs(src, False)
        if dst not in ds:
            raise NoRouteError(f"no route from {src} to {dst}: the network joins no path between them")
        dt, st = self._bfs(dst, True)
        total = ds[dst]
        out: list[tuple[str, str, float]] = []
        failed = self.topo.failed
        for u, du in ds.items():
            if du >= total or u not in dt:
                continue
            for v in self.topo.graph.successors(u):
                if (u, v) in failed:
                    continue
                if v in dt and du + 1 + dt[v] == total:
                    out.append((u, v, ss[u] * st[v] / ss[dst]))
        return out


def _split(path_prefix: list[str], options: list[list[str]], path_suffix: list[str]) -> list[tuple[str, str, float]]:
    out: list[tuple[str, str, float]] = []
    hops = list(zip(path_prefix, path_prefix[1:]))
    out.extend((u, v, 1.0) for u, v in hops)
    w = 1.0 / len(options)
    for opt in options:
        out.extend((u, v, w) for u, v in zip(opt, opt[1:]))
    out.extend((u, v, 1.0) for u, v in zip(path_suffix, path_suffix[1:]))
    return out


def structured_path(topo: Topology, a: int, b: int) -> list[tuple[str, str, float]]:
    """The weighted edges of the shortest paths a→b on a generated topology."""
    g_a, g_b = topo.gpus[a], topo.gpus[b]
    gpn = topo.gpus_per_node
    na, nb = a // gpn, b // gpn
    if na == nb:
        sw = "nvsw" if topo.graph.has_node(f"nvsw{na}") else "pcie"
        mid = f"{sw}{na}"
        return [(g_a, mid, 1.0), (mid, g_b, 1.0)]
    nic_a, nic_b = topo.nic_of(a), topo.nic_of(b)
    head = [(g_a, nic_a, 1.0)]
    tail = [(nic_b, g_b, 1.0)]
    return head + _fabric_path(topo, na, nb, nic_a, nic_b) + tail


def _fabric_path(topo: Topology, na: int, nb: int, nic_a: str, nic_b: str) -> list[tuple[str, str, float]]:
    kind = topo.kind
    if kind == "single_switch":
        return [(nic_a, "sw", 1.0), ("sw", nic_b, 1.0)]
    if kind in ("fat_tree", "rail"):
        if kind == "fat_tree":
            sa, sb = f"leaf{na // topo.leaf_size}", f"leaf{nb // topo.leaf_size}"
        else:
            sa = f"rail{na // topo.leaf_size}.{nic_a.split('.')[1]}"
            sb = f"rail{nb // topo.leaf_size}.{nic_b.split('.')[1]}"
        if sa == sb:
            return [(nic_a, sa, 1.0), (sa, nic_b, 1.0)]
        spines = [[sa, f"spine{k}", sb] for k in range(topo.spines)]
        return _split([nic_a, sa], spines, [sb, nic_b])
    # ring / torus: dimension-order routing, ECMP over the two ways round on a tie
    dims = topo.torus_dims
    from emulator.network.topology import ravel, unravel

    ca, cb = unravel(na, dims), unravel(nb, dims)
    paths: list[tuple[list[int], float]] = [([na], 1.0)]
    for d, size in enumerate(dims):
        fwd = (cb[d] - ca[d]) % size
        steps = []
        if fwd and fwd <= size - fwd:
            steps.append(1)
        if fwd and size - fwd <= fwd:
            steps.append(-1)
        if not steps:
            continue
        grown = []
        for seq, w in paths:
            for s in steps:
                cur = unravel(seq[-1], dims)
                ext = list(seq)
                while cur[d] != cb[d]:
                    cur[d] = (cur[d] + s) % size
                    ext.append(ravel(cur, dims))
                grown.append((ext, w / len(steps)))
        paths = grown
    out = [(nic_a, f"tr{na}", 1.0)]
    for seq, w in paths:
        out.extend((f"tr{u}", f"tr{v}", w) for u, v in zip(seq, seq[1:]))
    out.append((f"tr{nb}", nic_b, 1.0))
    return out

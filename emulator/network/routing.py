"""Routing: shortest paths by hop count; ECMP splits traffic evenly over them.

A route from GPU a to GPU b is a tuple of (link id, weight) pairs and a latency.
With k equal-cost paths, each path carries 1/k of the traffic — more exactly,
link u→v carries σ_a(u)·σ_b(v)/σ_a(b) of it, where σ_a(u) counts the shortest
paths a→u and σ_b(v) those v→b: the even split over all shortest paths.
The latency is that of the slowest shortest path (the last byte waits for it).

The generated topologies get a structured router (O(1) per route, no search);
custom graphs and topologies with failed links use a breadth-first search,
cached per source and per destination.

Two ECMP policies (the topology's ``routing``, from ``cluster.fabric.routing``):
- ``spray`` (the default): each flow is split evenly over its equal-cost paths, as above;
- ``ecmp_hash``: each flow takes one of them, picked by a hash of (seed, source rank,
  destination rank, the switch that chooses), as a switch hashes a flow's header.
  Two flows may then pick the same link while another stays idle: a collision. The
  hash is BLAKE2b (never Python's ``hash``, which is salted per process), so a seed
  gives the same paths in every run. On a generated fabric the choice is one of the
  whole set of equal-cost paths; on a searched graph it is made hop by hop.

:func:`detour` gives the way around a failed link u→v: the even split over the
shortest paths u→v that avoid the failed links and pass through switches only (a
GPU or a NIC forwards nothing), as a fast-reroute does (emulator.run.faults).
:func:`around_switch` gives the way round a link to or from a failed switch: its
siblings (the switches with the same neighbours), as ECMP leaves a dead switch out.
"""
from __future__ import annotations

from collections import deque
from itertools import compress, repeat
from operator import is_
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from emulator.errors import EmulatorError
from emulator.network.topology import Topology

if TYPE_CHECKING:  # networkx is imported only where a graph is searched (it costs ~0.1 s)
    import networkx as nx

Route = tuple[tuple[int, ...], tuple[float, ...], float]
Part = tuple[tuple[int, ...], tuple[float, ...], str]  # link ids, their latencies, the switch at the end
T = TypeVar("T")
Weighted = list[tuple[str, str, float]]  # (u, v, share of the traffic) per directed link
Search = tuple[dict[str, int], dict[str, int]]  # hop distance and number of shortest paths per node


def ecmp_pick(seed: int, a: int, b: int, salt: str, n: int) -> int:
    """Which of ``n`` equal-cost choices the flow a→b takes at ``salt`` (deterministic)."""
    import hashlib  # here: only hashed routing needs it (2.7 ms of imports)

    digest = hashlib.blake2b(f"{seed}:{a}:{b}:{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n


def bfs(g: nx.DiGraph, failed: frozenset[tuple[str, str]] | set[tuple[str, str]], start: str, reverse: bool,
        transit: Callable[[str], bool] | None = None) -> Search:
    """Breadth-first search from ``start`` (against the links when ``reverse``) avoiding
    ``failed``; only nodes that ``transit`` allows are passed through (all, if None)."""
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
                if transit is None or transit(v):
                    q.append(v)
            if dist[v] == dist[u] + 1:
                sigma[v] += sigma[u]
    return dist, sigma


def shortest_dag(g: nx.DiGraph, failed: frozenset[tuple[str, str]] | set[tuple[str, str]], src: str, dst: str,
                 fwd: Search, bwd: Search, transit: Callable[[str], bool] | None = None) -> Weighted:
    """The links of the shortest paths src→dst, each with its share of an even split over them."""
    (ds, ss), (dt, st) = fwd, bwd
    total = ds[dst]
    out: Weighted = []
    for u, du in ds.items():
        if du >= total or u not in dt or (transit is not None and u != src and not transit(u)):
            continue
        for v in g.successors(u):
            if (u, v) in failed or v not in dt or du + 1 + dt[v] != total:
                continue
            if transit is None or v == dst or transit(v):
                out.append((u, v, ss[u] * st[v] / ss[dst]))
    return out


def detour(topo: Topology, failed: set[tuple[str, str]], link: int) -> dict[int, float] | None:
    """The way around ``link`` (u→v) when ``failed`` links carry nothing: each link of the
    shortest switch-only paths u→v with its share of an even split; None if there is none."""
    u, v = topo.links[link]
    g = topo.graph

    def transit(n: str) -> bool:
        return bool(g.nodes[n].get("kind") == "switch")

    fwd = bfs(g, failed, u, False, transit)
    if v not in fwd[0]:
        return None
    bwd = bfs(g, failed, v, True, transit)
    out: dict[int, float] = {}
    for a, b, w in shortest_dag(g, failed, u, v, fwd, bwd, transit):
        lid = topo.link_ids[(a, b)]
        out[lid] = out.get(lid, 0.0) + w
    return out


def around_switch(topo: Topology, failed: set[tuple[str, str]], link: int) -> dict[int, float] | None:
    """The way round ``link`` (u→v) when one end is a failed switch (every link into and out of it
    failed), as ECMP leaves it out of the path set: the same hop through each of its siblings, the
    switches joined to the very same neighbours (a fat-tree's spines), that have no failed link,
    each with an even share. None if neither end is such a switch or it has no live sibling."""
    u, v = topo.links[link]
    g = topo.graph

    def down(n: str) -> bool:
        return g.nodes[n].get("kind") == "switch" and all(
            (a, n) in failed for a in g.predecessors(n)) and all((n, b) in failed for b in g.successors(n))

    dead = v if down(v) else u if down(u) else None
    if dead is None or (dead == v and down(u)):
        return None
    ins, outs = set(g.predecessors(dead)), set(g.successors(dead))
    siblings = [y for y in sorted(ins_of for x in ins for ins_of in g.successors(x))
                if y != dead and g.nodes[y].get("kind") == "switch"]
    alive = [y for y in dict.fromkeys(siblings)
             if set(g.predecessors(y)) == ins and set(g.successors(y)) == outs
             and not any((a, y) in failed for a in ins) and not any((y, b) in failed for b in outs)]
    if not alive:
        return None
    share = 1.0 / len(alive)
    ids = topo.link_ids
    return {ids[(u, y) if dead == v else (y, v)]: share for y in alive}


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
        # leaf-switched fabrics with spray: a route is (up from a, switch paths sa→sb, down to b),
        # each part shared by many routes and turned into link ids once
        self.fast = self.structured and topo.kind in SPLIT_KINDS and topo.routing != "ecmp_hash"
        # the parts up and down are cached per rank (per (rank, plane of the destination) with multi-plane
        # PXN, where the way up depends on the destination's plane)
        self.per_rank = topo.kind != "multi_plane"
        self._up: dict[int | tuple[int, int], Part] = {}
        self._down: dict[int, Part] = {}
        self._mid: dict[tuple[str, str], tuple[dict[int, float], list[list[float]]]] = {}

    def route(self, a: int, b: int) -> Route:
        key = (a, b)
        r = self._cache.get(key)
        if r is None:
            r = self._cache[key] = self._compute(a, b)
        return r

    def routes(self, pairs: list[tuple[int, int]]) -> list[Route]:
        """``route(a, b)`` of each (a, b) of ``pairs``, in order (the cached ones looked up at C speed:
        a ring of 8,192 members asks for 65,536)."""
        out: list[Route | None] = list(map(self._cache.get, pairs))
        new = list(compress(range(len(out)), map(is_, out, repeat(None))))  # found at C speed
        if new:
            if self.fast:
                self._prime([pairs[i] for i in new])
            for i in new:
                out[i] = self.route(*pairs[i])
        return out  # type: ignore[return-value]  # no None is left

    def _prime(self, pairs: list[tuple[int, int]]) -> None:
        """Route at once, with their link ids looked up at C speed, what ``pairs`` need: the routes
        inside a node (``_inside``), and the parts up and down (``_up_part``, ``_down_part``) of
        those between nodes (a ring of 8,192 GPUs asks for 8,192 of each)."""
        topo = self.topo
        gpn = topo.gpus_per_node
        inside = [(a, b) for a, b in dict.fromkeys(pairs) if a // gpn == b // gpn and a != b]
        self._cache.update(zip(inside, self._insides(inside)))
        if not self.per_rank:
            return
        across = [(a, b) for a, b in pairs if a // gpn != b // gpn]
        ups = [a for a in dict.fromkeys(a for a, _b in across) if a not in self._up]
        downs = [b for b in dict.fromkeys(b for _a, b in across) if b not in self._down]
        self._up.update(zip(ups, self._parts(ups, True)))
        self._down.update(zip(downs, self._parts(downs, False)))

    def _insides(self, pairs: list[tuple[int, int]]) -> list[Route]:
        """``_inside(a, b)`` of each pair, the same tuples."""
        topo = self.topo
        gpn, gpus, lat = topo.gpus_per_node, topo.gpus, topo.latency
        switches = [f"{topo.intra_switch}{a // gpn}" for a, _b in pairs]
        ups = map(topo.link_ids.__getitem__, zip([gpus[a] for a, _b in pairs], switches))
        downs = map(topo.link_ids.__getitem__, zip(switches, [gpus[b] for _a, b in pairs]))
        out: list[Route] = []
        for up, down in zip(ups, downs):
            t = 0.0 + lat[up]
            t += lat[down]
            out.append(((up, down) if up < down else (down, up), (1.0, 1.0), t))
        return out

    def _parts(self, ranks: list[int], up: bool) -> list[Part]:
        """``_up_part(r)`` (``up``) or ``_down_part(r)`` of each of ``ranks``, the same tuples."""
        topo = self.topo
        nics = list(map(topo.nic_of, ranks))
        switches = [_edge_switch(topo, r, nic) for r, nic in zip(ranks, nics)]
        gpus = list(map(topo.gpus.__getitem__, ranks))
        first, second = (zip(gpus, nics), zip(nics, switches)) if up else (zip(switches, nics), zip(nics, gpus))
        ids = list(zip(map(topo.link_ids.__getitem__, first), map(topo.link_ids.__getitem__, second)))
        lat = topo.latency
        return list(zip(ids, [(lat[i], lat[j]) for i, j in ids], switches))

    def _compute(self, a: int, b: int) -> Route:
        if a == b:
            return (), (), 0.0
        topo = self.topo
        if self.fast:
            if a // topo.gpus_per_node == b // topo.gpus_per_node:
                return self._inside(a, b)
            return self._composed(a, b)
        if self.structured:
            weighted = structured_path(topo, a, b)
        else:
            weighted = self._ecmp(topo.gpus[a], topo.gpus[b], a, b)
        ids = topo.link_ids
        acc: dict[int, float] = {}
        for u, v, w in weighted:
            lid = ids[(u, v)]
            acc[lid] = acc.get(lid, 0.0) + w
        links = tuple(sorted(acc))
        weights = tuple(acc[l] for l in links)
        return links, weights, self._latency(weighted)

    def _composed(self, a: int, b: int) -> Route:
        """The route a→b from its three cached parts. Every link is in one part only, and the
        numbers are those of ``_compute`` on ``structured_path``: a part-link's weight is the
        same sum in the same order, and the latency the same left-to-right sum along the
        slowest path (the longest-path DP is the maximum of those sums: rounding is monotone)."""
        topo = self.topo
        if self.per_rank:  # the part up from a depends on a alone, the part down to b on b alone
            up = self._up.get(a)
            if up is None:
                up = self._up[a] = self._up_part(a)
            down = self._down.get(b)
            if down is None:
                down = self._down[b] = self._down_part(b)
        else:  # multi-plane: a's way up depends on b's plane (PXN)
            gpn = topo.gpus_per_node
            key = (a, (b % gpn) * topo.nics_per_node // gpn)
            up = self._up.get(key)
            down = self._down.get(b)
            if up is None or down is None:
                up_edges, sa, sb, down_edges = ends(topo, a, b)
                up = self._up[key] = self._part(up_edges, sa)
                down = self._down[b] = self._part(down_edges, sb)
        up_ids, up_lat, sa = up
        down_ids, down_lat, sb = down
        t = 0.0
        for x in up_lat:
            t += x
        if sa != sb:
            mid = self._mid.get((sa, sb))
            if mid is None:
                mid = self._mid[sa, sb] = self._middle(a, b, sa, sb)
            shares = mid[0]
            best = -1.0
            for path in mid[1]:
                x = t
                for hop in path:
                    x += hop
                if x > best:
                    best = x
            t = best
            links = tuple(sorted((*up_ids, *shares, *down_ids)))
            weights = tuple([shares.get(lid, 1.0) for lid in links])  # up and down links carry it all
        else:
            links = tuple(sorted((*up_ids, *down_ids)))
            weights = (1.0,) * len(links)
        for x in down_lat:
            t += x
        return links, weights, t

    def _inside(self, a: int, b: int) -> Route:
        """a→b on one node: through its switch (as ``structured_path``; latency 0 + up + down)."""
        topo = self.topo
        sw = f"{topo.intra_switch}{a // topo.gpus_per_node}"
        up, down = topo.link_ids[topo.gpus[a], sw], topo.link_ids[sw, topo.gpus[b]]
        lat = 0.0 + topo.latency[up]
        lat += topo.latency[down]
        return (up, down) if up < down else (down, up), (1.0, 1.0), lat

    def _up_part(self, a: int) -> Part:
        """GPU a's way up to its first switch (as ``ends`` gives it, on fabrics without PXN)."""
        topo = self.topo
        nic = topo.nic_of(a)
        sa = _edge_switch(topo, a, nic)
        return self._part([(topo.gpus[a], nic), (nic, sa)], sa)

    def _down_part(self, b: int) -> Part:
        """The way down from GPU b's last switch to b (as ``ends`` gives it, on fabrics without PXN)."""
        topo = self.topo
        nic = topo.nic_of(b)
        sb = _edge_switch(topo, b, nic)
        return self._part([(sb, nic), (nic, topo.gpus[b])], sb)

    def _part(self, edges: list[tuple[str, str]], switch: str) -> Part:
        ids = tuple(map(self.topo.link_ids.__getitem__, edges))
        return ids, tuple(map(self.topo.latency.__getitem__, ids)), switch

    def _middle(self, a: int, b: int, sa: str, sb: str) -> tuple[dict[int, float], list[list[float]]]:
        """The links between switches sa and sb with their shares, and each path's hop latencies."""
        ids, lat = self.topo.link_ids, self.topo.latency
        options = middle(self.topo, a, b, sa, sb)
        w = 1.0 / len(options)
        acc: dict[int, float] = {}
        paths = []
        for opt in options:
            hops = [ids[(u, v)] for u, v in zip(opt, opt[1:])]
            for lid in hops:
                acc[lid] = acc.get(lid, 0.0) + w
            paths.append([lat[lid] for lid in hops])
        return acc, paths

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
    def _bfs(self, start: str, reverse: bool) -> Search:
        cache = self._bwd if reverse else self._fwd
        hit = cache.get(start)
        if hit is None:
            hit = cache[start] = bfs(self.topo.graph, self.topo.failed, start, reverse)
        return hit

    def _ecmp(self, src: str, dst: str, a: int, b: int) -> Weighted:
        fwd = self._bfs(src, False)
        if dst not in fwd[0]:
            raise NoRouteError(f"no route from {src} to {dst}: the network joins no path between them")
        bwd = self._bfs(dst, True)
        dag = shortest_dag(self.topo.graph, self.topo.failed, src, dst, fwd, bwd)
        if self.topo.routing != "ecmp_hash":
            return dag
        nxt: dict[str, list[str]] = {}
        for u, v, _w in dag:
            nxt.setdefault(u, []).append(v)
        out: Weighted = []
        u = src
        while u != dst:  # hop by hop, as each switch hashes the flow
            options = sorted(nxt[u])
            v = options[ecmp_pick(self.topo.seed, a, b, u, len(options))]
            out.append((u, v, 1.0))
            u = v
        return out


def _split(path_prefix: list[str], options: Sequence[Sequence[str]], path_suffix: list[str]) -> Weighted:
    out: Weighted = []
    hops = list(zip(path_prefix, path_prefix[1:]))
    out.extend((u, v, 1.0) for u, v in hops)
    w = 1.0 / len(options)
    for opt in options:
        out.extend((u, v, w) for u, v in zip(opt, opt[1:]))
    out.extend((u, v, 1.0) for u, v in zip(path_suffix, path_suffix[1:]))
    return out


def _choose(topo: Topology, a: int, b: int, salt: str, options: Sequence[T]) -> list[T]:
    """All the equal-cost ``options`` (spray), or the one the flow a→b hashes to (ecmp_hash)."""
    if topo.routing != "ecmp_hash" or len(options) < 2:
        return list(options)
    return [options[ecmp_pick(topo.seed, a, b, salt, len(options))]]


SPLIT_KINDS = frozenset({"single_switch", "fat_tree", "rail", "multi_plane", "fat_tree3", "dragonfly"})
Edges = list[tuple[str, str]]


def structured_path(topo: Topology, a: int, b: int) -> Weighted:
    """The weighted edges of the shortest paths a→b on a generated topology."""
    g_a, g_b = topo.gpus[a], topo.gpus[b]
    gpn = topo.gpus_per_node
    na, nb = a // gpn, b // gpn
    if na == nb:
        mid = f"{topo.intra_switch}{na}"
        return [(g_a, mid, 1.0), (mid, g_b, 1.0)]
    if topo.kind not in SPLIT_KINDS:
        head, nic_a = _head(topo, a, b)
        nic_b = topo.nic_of(b)
        return ([(u, v, 1.0) for u, v in head] + _torus_path(topo, a, b, nic_a, nic_b) + [(nic_b, g_b, 1.0)])
    up, sa, sb, down = ends(topo, a, b)
    options = middle(topo, a, b, sa, sb)
    if not options:  # sa == sb: one switch joins them
        return [(u, v, 1.0) for u, v in up + down]
    return _split([u for u, _ in up] + [sa], options, [sb] + [v for _, v in down])


def _head(topo: Topology, a: int, b: int) -> tuple[Edges, str]:
    """The edges from GPU a to the NIC it sends to b from, and that NIC (with multi-plane
    rails, a transfer between NICs of different planes first crosses NVLink to the GPU of
    b's plane: NCCL's PXN)."""
    gpn = topo.gpus_per_node
    na = a // gpn
    nic_a, nic_b = topo.nic_of(a), topo.nic_of(b)
    if topo.kind == "multi_plane" and nic_a.split(".")[1] != nic_b.split(".")[1]:
        plane = int(nic_b.split(".")[1])
        x = na * gpn + -(-plane * gpn // topo.nics_per_node)  # the first GPU of the node on that NIC
        nic_a = topo.nic_of(x)
        sw = f"{topo.intra_switch}{na}"
        return [(topo.gpus[a], sw), (sw, topo.gpus[x]), (topo.gpus[x], nic_a)], nic_a
    return [(topo.gpus[a], nic_a)], nic_a


def ends(topo: Topology, a: int, b: int) -> tuple[Edges, str, str, Edges]:
    """For GPUs on different nodes of a leaf-switched fabric (``SPLIT_KINDS``): the edges
    from GPU a up to its first switch ``sa``, and from b's last switch ``sb`` down to GPU b."""
    head, nic_a = _head(topo, a, b)
    nic_b = topo.nic_of(b)
    sa, sb = _edge_switches(topo, a, b, nic_a, nic_b)
    return head + [(nic_a, sa)], sa, sb, [(sb, nic_b), (nic_b, topo.gpus[b])]


def _edge_switch(topo: Topology, rank: int, nic: str) -> str:
    """The switch that ``nic`` (of ``rank``) hangs on, on a leaf-switched fabric other than multi-plane
    (there, a's switch depends on b's plane): one side of ``_edge_switches``."""
    kind = topo.kind
    if kind == "single_switch":
        return "sw"
    leaf = (rank // topo.gpus_per_node) // topo.leaf_size
    if kind in ("fat_tree", "fat_tree3"):
        return f"leaf{leaf}"
    if kind == "rail":
        return f"rail{leaf}.{nic.split('.')[1]}"
    n = topo.group_size  # dragonfly
    return f"df{leaf // n}.{leaf % n}"


def _edge_switches(topo: Topology, a: int, b: int, nic_a: str, nic_b: str) -> tuple[str, str]:
    """The switches the NICs of a and b hang on."""
    kind = topo.kind
    if kind == "single_switch":
        return "sw", "sw"
    la, lb = (a // topo.gpus_per_node) // topo.leaf_size, (b // topo.gpus_per_node) // topo.leaf_size
    if kind in ("fat_tree", "fat_tree3"):
        return f"leaf{la}", f"leaf{lb}"
    if kind == "rail":
        return f"rail{la}.{nic_a.split('.')[1]}", f"rail{lb}.{nic_b.split('.')[1]}"
    if kind == "multi_plane":
        plane = f"plane{nic_a.split('.')[1]}"
        return f"{plane}.leaf{la}", f"{plane}.leaf{lb}"
    n = topo.group_size  # dragonfly: routers of leaf_size nodes each
    return f"df{la // n}.{la % n}", f"df{lb // n}.{lb % n}"


def middle(topo: Topology, a: int, b: int, sa: str, sb: str) -> list[list[str]]:
    """The switch paths sa→sb that the flow a→b spreads over (all equal-cost ones, or the one it
    hashes to); [] when sa is sb. With spray they depend on (sa, sb) alone."""
    if sa == sb:
        return []
    kind = topo.kind
    if kind in ("fat_tree", "rail", "multi_plane"):
        spine = f"{sa.split('.')[0]}.spine" if kind == "multi_plane" else "spine"
        return _choose(topo, a, b, sa, [[sa, f"{spine}{k}", sb] for k in range(topo.spines)])
    if kind == "fat_tree3":
        return _fat_tree3_middle(topo, a, b, sa, sb)
    return _dragonfly_middle(topo, a, b, sa, sb)


def _fat_tree3_middle(topo: Topology, a: int, b: int, sa: str, sb: str) -> list[list[str]]:
    """Up to the lowest common level (pod spine or core) and down, over every equal-cost way."""
    la, lb = (a // topo.gpus_per_node) // topo.leaf_size, (b // topo.gpus_per_node) // topo.leaf_size
    pa, pb = la // topo.pod_size, lb // topo.pod_size
    if pa == pb:
        options = [[sa, f"spine{pa}.{k}", sb] for k in range(topo.spines)]
    else:
        options = [[sa, f"spine{pa}.{k}", f"core{k}.{m}", f"spine{pb}.{k}", sb]
                   for k in range(topo.spines) for m in range(topo.cores)]
    return _choose(topo, a, b, sa, options)


def _dragonfly_middle(topo: Topology, a: int, b: int, sa: str, sb: str) -> list[list[str]]:
    """Minimal routing: a local hop to a router with a global link to b's group, the global
    link, a local hop to b's router; ECMP over the ``global_links`` global links."""
    from emulator.network.topology import dragonfly_gateway

    ra, rb = (a // topo.gpus_per_node) // topo.leaf_size, (b // topo.gpus_per_node) // topo.leaf_size
    n = topo.group_size
    ga, gb = ra // n, rb // n
    if ga == gb:
        return [[sa, sb]]
    options = []
    for m in range(topo.global_links):
        gw_a, gw_b = f"df{ga}.{dragonfly_gateway(ga, gb, m, topo)}", f"df{gb}.{dragonfly_gateway(gb, ga, m, topo)}"
        options.append([sa] + ([gw_a] if gw_a != sa else []) + ([gw_b] if gw_b != sb else []) + [sb])
    # gw_a == sa and gw_b == sb leave [sa, sb]: the global link itself
    return _choose(topo, a, b, sa, options)


def _torus_path(topo: Topology, a: int, b: int, nic_a: str, nic_b: str) -> Weighted:
    """Dimension-order routing, ECMP over the two ways round on a tie."""
    from emulator.network.topology import ravel, unravel

    na, nb = a // topo.gpus_per_node, b // topo.gpus_per_node
    dims = topo.torus_dims
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
        steps = _choose(topo, a, b, f"dim{d}", steps)
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

"""Placed: a cluster's router seen through a rank → GPU map, so that a job's own Program (its ranks
0..n−1) runs on the GPUs the loader gave it without renumbering one op (issue 29).

Rank r of the job is cluster GPU ``gpu_of[r]``: a route between ranks is the route between their
GPUs, a rank's node is its GPU's node. Everything else (link ids, capacities, latencies, faults on
links) is the cluster's own, so the job's link loads land on the cluster's links.
"""
from __future__ import annotations

from typing import Callable, Sequence

from emulator.network.routing import Route, Router
from emulator.network.topology import Topology


class PlacedRouter:
    """``Router``'s interface (``route``, ``routes``, ``topo``) over job ranks: the routes of their GPUs."""

    def __init__(self, router: Router, gpu_of: Sequence[int]) -> None:  # noqa: D107
        self.inner = router
        self.topo: Topology = router.topo
        self.gpu_of = tuple(gpu_of)

    def route(self, a: int, b: int) -> Route:
        g = self.gpu_of
        return self.inner.route(g[a], g[b])

    def routes(self, pairs: list[tuple[int, int]]) -> list[Route]:
        g = self.gpu_of
        return self.inner.routes([(g[a], g[b]) for a, b in pairs])


def placed_node_of(topo: Topology, gpu_of: Sequence[int]) -> Callable[[int], int]:
    """The node of each job rank: its GPU's node (a plain function, as ``Topology.node_of``)."""
    nodes = [topo.node_of(g) for g in gpu_of]
    return nodes.__getitem__

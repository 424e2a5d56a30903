"""Allocation: which cluster nodes each job of a multi-job scenario (``jobs:``) runs on.

A pure function of the jobs' requests and the cluster's shape, run once by the loader
(checks.py), so a bad request is a one-line error naming the job's key. Policies:

- an explicit node list (``placement: [0, 2, 5]``): exactly those nodes, in that rank order;
  these are reserved first, before any policy runs;
- ``contiguous``: the first run of ``nodes`` consecutive free nodes (lowest index first);
- ``spread``: round robin over the leaves (groups of ``leaf_size`` consecutive nodes, as the
  builders of ``LEAF_FABRICS`` make them: a leaf, a rail group, a dragonfly router), taking the
  lowest free node of each leaf in turn; on other fabrics the cluster is one leaf;
- ``random``: ``nodes`` free nodes drawn by ``random.Random(seed).sample`` from the free nodes
  in index order, then sorted, so a seed always gives the same nodes.

The policy jobs are placed in list order, each on the nodes that the jobs before it left free.
Ranks fill a job's nodes in order: job rank r runs on node ``nodes[r // gpus_per_node]``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

POLICIES = ("contiguous", "spread", "random")
# the fabric kinds whose builders group ``leaf_size`` consecutive nodes on one switch
# (network/topology.py: every builder that calls ``_leaves``)
LEAF_FABRICS = ("fat_tree", "rail", "fat_tree3", "multi_plane", "dragonfly")


class AllocationError(ValueError):
    """A request that cannot be met: ``index`` is the job's position, ``key`` the key to change."""

    def __init__(self, index: int, key: str, message: str) -> None:
        super().__init__(message)
        self.index, self.key, self.message = index, key, message


@dataclass(frozen=True)
class Request:
    """What one job asks for: ``nodes`` nodes by ``policy``, or exactly ``node_list``."""

    name: str
    nodes: int
    policy: str = "contiguous"  # contiguous | spread | random | list
    node_list: tuple[int, ...] = ()
    seed: int = 0


def allocate(requests: list[Request], total: int, leaf_size: int) -> list[tuple[int, ...]]:
    """The nodes of each request, in request order (see the module doc for the policies)."""
    out: list[tuple[int, ...] | None] = [None] * len(requests)
    owner: dict[int, str] = {}
    for i, rq in enumerate(requests):
        if rq.policy == "list":
            out[i] = _reserve(i, rq, total, owner)
    for i, rq in enumerate(requests):
        if rq.policy != "list":
            free = [n for n in range(total) if n not in owner]
            if rq.nodes > len(free):
                raise AllocationError(i, "nodes", f"job {rq.name!r} needs {rq.nodes} nodes but only {len(free)} "
                                                  f"of the cluster's {total} are free (the other jobs hold the rest)")
            picked = _pick(i, rq, free, leaf_size)
            for n in picked:
                owner[n] = rq.name
            out[i] = picked
    return [o if o is not None else () for o in out]


def _reserve(i: int, rq: Request, total: int, owner: dict[int, str]) -> tuple[int, ...]:
    seen: set[int] = set()
    for n in rq.node_list:
        if not 0 <= n < total:
            raise AllocationError(i, "placement", f"there is no node {n}: the cluster has nodes 0 to {total - 1}")
        if n in seen:
            raise AllocationError(i, "placement", f"node {n} is listed twice")
        if n in owner:
            raise AllocationError(i, "placement", f"node {n} is already taken by job {owner[n]!r}; "
                                                  "jobs may not share nodes")
        seen.add(n)
        owner[n] = rq.name
    return tuple(rq.node_list)


def _pick(i: int, rq: Request, free: list[int], leaf_size: int) -> tuple[int, ...]:
    n = rq.nodes
    if rq.policy == "contiguous":
        free_set = set(free)
        for first in free:
            if all(first + k in free_set for k in range(n)):
                return tuple(range(first, first + n))
        raise AllocationError(i, "placement", f"job {rq.name!r} needs {n} consecutive free nodes and there are "
                                              f"none (free: {_ranges(free)}); use spread, random or a node list")
    if rq.policy == "spread":
        leaves: dict[int, list[int]] = {}
        for node in free:
            leaves.setdefault(node // max(1, leaf_size), []).append(node)
        order = [leaves[k] for k in sorted(leaves)]
        picked: list[int] = []
        depth = 0
        while len(picked) < n:
            for nodes in order:
                if depth < len(nodes) and len(picked) < n:
                    picked.append(nodes[depth])
            depth += 1
        return tuple(picked)
    return tuple(sorted(random.Random(rq.seed).sample(free, n)))


def _ranges(nodes: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    parts: list[str] = []
    for n in nodes:
        if parts and int(parts[-1].split("-")[-1]) == n - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)

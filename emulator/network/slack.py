"""Slack links: links that no mix of a program's flows can ever fill, so that they never bind a
max-min rate.

A flow that crosses link l = (u → v) and does not start at u entered u over a link m = (x → u).
Group the flows on l by such an entering link m (one each). The flows of m's group put at most
cap(m) on m, so at most ρ(m, l)·cap(m) on l, ρ the greatest w_l / w_m among them. Hence

    load(l) ≤ Σ_m ρ(m, l) · cap(m)    (the *witnesses* m of l),

whatever the flows' rates; the same holds with the links by which the flows leave v, where none
ends at v. Where that bound is at most cap(l), and no witness of l is itself left out, every
allocation that fits the links kept fits l too: the max-min fair rates without the slack links
are feasible with them, so they are their max-min fair rates (the allocation is unique).

The leaf–spine links of a fat tree without oversubscription are the usual case: a leaf's
uplinks carry at most what its NICs bring in, and a spine's downlinks to a leaf at most what that
leaf's NICs take out, split evenly by ECMP. A link some flow starts and ends on is never slack.
Links are taken by their number of witnesses, most first: a link that many flows meet on is worth
more than the few it would have to keep; a link one flow crosses is left in (nothing to gain). A
bound within ``ROUNDING`` of cap(l) counts as cap(l): at 1:1 the two are equal, summed in another
order (the rates could then differ from the exact ones by that much, where every NIC under a leaf
is full through one uplink).

The fabric leaves slack links out of its components and its solves (a pipeline's transfers that
meet on a spine are then each alone on the links that bind them), and still moves bytes and
reports loads on them. Pure: no SimPy.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from emulator.network.flows import FlowSpec

ROUNDING = 1e-12  # a bound within this of cap(l) is cap(l): Σ of a leaf's NIC shares, summed in another order


def slack_links(flows: Iterable[FlowSpec], ends: Sequence[tuple[str, str]], capacity: Sequence[float],
                same: Mapping[int, int] | None = None) -> set[int]:
    """The links (ids into ``ends``, each (u, v)) that none of ``flows`` can fill (see module doc).

    ``same`` maps each link to the one that stands for its class of identical constraints (link
    compression's ``keep``): a class is slack or not as a whole, so a witness's class is never
    left out either. The result is those class links. Folded flows cross thousands of links
    each, so the witnesses are found with numpy, flow by flow."""
    ids: dict[str, int] = {}
    tail = np.array([ids.setdefault(u, len(ids)) for u, _ in ends], dtype=np.int64)
    head = np.array([ids.setdefault(v, len(ids)) for _, v in ends], dtype=np.int64)
    found: list[list[tuple[np.ndarray, ...]]] = [[], []]  # per side: (links, witnesses, ratios, open links)
    crossed: list[np.ndarray] = []
    seen: set[tuple[tuple[int, ...], tuple[float, ...]]] = set()
    for f in flows:  # a ring's phases, and plans alike, repeat their flows: each once
        key = (f.links, f.weights)
        if key not in seen and f.links:
            seen.add(key)
            links = np.array(f.links, dtype=np.int64)
            w = np.array(f.weights, dtype=float)
            crossed.append(np.unique(links))
            found[0].append(_witnesses(links, w, head[links], tail[links]))  # entering l's tail
            found[1].append(_witnesses(links, w, tail[links], head[links]))  # leaving l's head
    if not crossed:
        return set()
    # a link one flow crosses is never shared: leaving it in costs nothing (and most links are such)
    every, times = np.unique(np.concatenate(crossed), return_counts=True)
    shared = every[times > 1]
    cap = np.asarray(capacity, dtype=float)
    candidates: list[tuple[int, int, int]] = []  # (-witnesses, link, side)
    sides: list[dict[int, list[int]]] = []
    for side in (0, 1):
        bounds, witnesses = _bounds(found[side], cap, shared)
        sides.append(witnesses)
        for link, bound in bounds.items():
            if bound <= capacity[link] * (1.0 + ROUNDING):
                candidates.append((-len(witnesses[link]), link, side))
    candidates.sort()
    cls = same.get if same is not None else None
    slack: set[int] = set()  # classes
    kept: set[int] = set()  # classes of witnesses of slack links: never slack themselves
    for _, link, side in candidates:
        c = cls(link, link) if cls else link
        if c in slack or c in kept:
            continue
        ws = [cls(m, m) if cls else m for m in sides[side][link]]
        if any(m in slack or m == c for m in ws):
            continue
        slack.add(c)
        kept.update(ws)
    return slack


def _witnesses(links: np.ndarray, w: np.ndarray, at: np.ndarray, of: np.ndarray) -> tuple[np.ndarray, ...]:
    """One flow's witnesses on one side: for each of its links l, the link of the flow with the
    greatest weight (the first such) whose node ``at`` is l's node ``of`` (entering l's tail: at =
    heads, of = tails). Returns (links with one, their witnesses, w_l / w_witness, links without)."""
    order = np.lexsort((np.arange(len(links)), -w, at))
    nodes = at[order]
    first = np.ones(len(nodes), dtype=bool)
    first[1:] = nodes[1:] != nodes[:-1]
    nodes, best, best_w = nodes[first], links[order][first], w[order][first]
    pos = np.minimum(np.searchsorted(nodes, of), len(nodes) - 1)
    ok = (nodes[pos] == of) & (best_w[pos] > 0.0)
    return links[ok], best[pos[ok]], w[ok] / best_w[pos[ok]], links[~ok]


def _bounds(found: list[tuple[np.ndarray, ...]], cap: np.ndarray,
            shared: np.ndarray) -> tuple[dict[int, float], dict[int, list[int]]]:
    """Per link of ``shared`` with a witness for each of its flows on this side: Σ_m ρ(m, l)·cap(m),
    and its witnesses m."""
    if not found:
        return {}, {}
    links = np.concatenate([x[0] for x in found])
    wit = np.concatenate([x[1] for x in found])
    ratio = np.concatenate([x[2] for x in found])
    closed = np.unique(np.concatenate([x[3] for x in found]))
    order = np.lexsort((-ratio, wit, links))  # per (l, m), the greatest ratio first
    links, wit, ratio = links[order], wit[order], ratio[order]
    first = np.ones(len(links), dtype=bool)
    first[1:] = (links[1:] != links[:-1]) | (wit[1:] != wit[:-1])
    links, wit, ratio = links[first], wit[first], ratio[first]
    keep = ~np.isin(links, closed) & np.isin(links, shared)
    links, wit, ratio = links[keep], wit[keep], ratio[keep]
    if not len(links):
        return {}, {}
    starts = np.flatnonzero(np.r_[True, links[1:] != links[:-1]])
    sums = np.add.reduceat(ratio * cap[wit], starts)
    ends = np.r_[starts[1:], len(links)]
    wl = wit.tolist()
    bounds = dict(zip(links[starts].tolist(), sums.tolist()))
    return bounds, {int(links[a]): wl[a:b] for a, b in zip(starts.tolist(), ends.tolist())}

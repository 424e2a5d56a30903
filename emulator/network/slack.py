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
more than the few it would have to keep.

The fabric leaves slack links out of its components and its solves (a pipeline's transfers that
meet on a spine are then each alone on the links that bind them), and still moves bytes and
reports loads on them. Pure: no SimPy.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from emulator.network.flows import FlowSpec

Side = dict[int, float]  # witness link → the greatest w_l / w_witness


def slack_links(flows: Iterable[FlowSpec], ends: Sequence[tuple[str, str]], capacity: Sequence[float],
                same: Mapping[int, int] | None = None) -> set[int]:
    """The links (ids into ``ends``, each (u, v)) that none of ``flows`` can fill (see module doc).

    ``same`` maps each link to the one that stands for its class of identical constraints (link
    compression's ``keep``): a class is slack or not as a whole, so a witness's class is never
    left out either. The result is those class links."""
    cls = same.get if same is not None else None
    sides: list[dict[int, Side]] = [{}, {}]  # by entering link, by leaving link: l → its witnesses
    open_: list[set[int]] = [set(), set()]  # links some flow starts on (0) / ends on (1): no such side
    for f in flows:
        _witness(f, ends, sides, open_)
    candidates: list[tuple[int, int, int]] = []  # (-witnesses, link, side)
    for side in (0, 1):
        for link, w in sides[side].items():
            if link not in open_[side] and sum(r * capacity[m] for m, r in w.items()) <= capacity[link]:
                candidates.append((-len(w), link, side))
    candidates.sort()
    slack: set[int] = set()  # classes
    kept: set[int] = set()  # classes of witnesses of slack links: never slack themselves
    for _, link, side in candidates:
        c = cls(link, link) if cls else link
        if c in slack or c in kept:
            continue
        witnesses = [cls(m, m) if cls else m for m in sides[side][link]]
        if any(m in slack or m == c for m in witnesses):
            continue
        slack.add(c)
        kept.update(witnesses)
    return slack


def _witness(f: FlowSpec, ends: Sequence[tuple[str, str]], sides: list[dict[int, Side]],
             open_: list[set[int]]) -> None:
    """Add flow ``f``'s ratios to each of its links' witnesses on both sides."""
    into: dict[str, tuple[float, int]] = {}  # node → (the greatest weight entering it, that link)
    out: dict[str, tuple[float, int]] = {}  # node → (the greatest weight leaving it, that link)
    for m, w in zip(f.links, f.weights):
        u, v = ends[m]
        if v not in into or w > into[v][0]:
            into[v] = (w, m)
        if u not in out or w > out[u][0]:
            out[u] = (w, m)
    for link, w in zip(f.links, f.weights):
        u, v = ends[link]
        for side, entry in ((0, into.get(u)), (1, out.get(v))):
            if entry is None or entry[0] <= 0.0:
                open_[side].add(link)
                continue
            wm, m = entry
            got = sides[side].setdefault(link, {})
            ratio = w / wm
            if ratio > got.get(m, 0.0):
                got[m] = ratio

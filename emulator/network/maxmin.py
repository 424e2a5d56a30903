"""Max-min fair rates of flows on shared links: weighted progressive filling (pure: no SimPy).

Every unfrozen flow grows at the same level x; the link that saturates first (least
(c_l − frozen load_l)/Σ w of its unfrozen flows) fixes x for every unfrozen flow crossing
it; repeat. A flow puts w·r on each link it crosses with weight w (a crossing count, an
ECMP share, or a folded flow's multiplicity). ``emulator.network.flow_fabric`` runs flows over
time and asks these for their rates.
"""
from __future__ import annotations

from typing import Protocol, Sequence


class Route(Protocol):
    """What the solver reads of a flow: its links and the weight it puts on each."""

    links: tuple[int, ...]
    weights: tuple[float, ...]


INF = float("inf")
_TIE = 1e-12  # relative tolerance for links saturating at the same level
# A link whose Σ w over its unfrozen flows is at most this is empty: what remains after
# subtracting the frozen flows' weights is rounding residue. Weights are crossing counts
# (≥ 1) or ECMP shares (1/k of a few paths), so a real remainder is ≫ 1e-15, and the
# residue of a few subtractions of O(1) weights is a few ulps of 1 (ε = 2.2e-16).
_EMPTY_WSUM = 1e-15


VECTORISE_ABOVE = 64  # flows in a component; larger components are solved with numpy


def max_min_rates(flows: Sequence[Route], capacity: Sequence[float]) -> list[float]:
    """Max-min fair rates of ``flows`` by weighted progressive filling (pure).

    x_l = (c_l − Σ_frozen w·r) / Σ_unfrozen w; the least x_l is the level of every
    unfrozen flow crossing link l; those flows freeze at it. A flow that crosses
    no link of finite capacity gets rate inf. Components of more than
    ``VECTORISE_ABOVE`` flows go to the same algorithm on numpy arrays.
    """
    if len(flows) > VECTORISE_ABOVE:
        return max_min_rates_vectorised(flows, capacity)
    n = len(flows)
    if n == 1:  # a flow alone (a pipeline's transfer, mostly): the least c_l / w_l, as the rounds below give
        return [alone_rate(flows[0], capacity)]
    rates = [INF] * n
    resid: dict[int, float] = {}
    wsum: dict[int, float] = {}
    members: dict[int, list[int]] = {}
    for i, f in enumerate(flows):
        for link, w in zip(f.links, f.weights):
            if link not in resid:
                resid[link] = capacity[link]
                wsum[link] = 0.0
                members[link] = []
            wsum[link] += w
            members[link].append(i)
    frozen = [False] * n
    left = n
    live = set(resid)
    while left and live:
        best = INF
        for link in live:
            ws = wsum[link]
            if ws > 0.0:
                share = resid[link] / ws
                if share < best:
                    best = share
        if best == INF:
            break
        limit = best * (1.0 + _TIE) if best > 0 else 0.0
        tight = [l for l in live if wsum[l] > 0.0 and resid[l] / wsum[l] <= limit]
        for link in tight:
            for i in members[link]:
                if frozen[i]:
                    continue
                frozen[i] = True
                left -= 1
                rates[i] = best
                f = flows[i]
                for l2, w in zip(f.links, f.weights):
                    resid[l2] -= w * best
                    wsum[l2] -= w
        for link in tight:
            live.discard(link)
        live = {l for l in live if wsum[l] > _EMPTY_WSUM}
    return rates


def alone_rate(f: Route, capacity: Sequence[float]) -> float:
    """The max-min rate of a flow alone: min over its links of c_l / Σ w (inf if none binds)."""
    wsum: dict[int, float] = {}
    for link, w in zip(f.links, f.weights):
        wsum[link] = wsum.get(link, 0.0) + w
    best = INF
    for link, ws in wsum.items():
        if ws > 0.0:
            share = capacity[link] / ws
            if share < best:
                best = share
    return best


def max_min_rates_vectorised(flows: Sequence[Route], capacity: Sequence[float]) -> list[float]:
    """``max_min_rates`` on flat numpy arrays: one (flow, link, weight) entry per crossing;
    per round, Σ w of the unfrozen flows per link by ``bincount``, the least share, the
    flows on the tight links frozen at it, their load taken off the links."""
    import numpy as np

    entry_flow = np.repeat(np.arange(len(flows)), [len(f.links) for f in flows])
    entry_link_ids = np.fromiter((l for f in flows for l in f.links), dtype=np.int64, count=len(entry_flow))
    w = np.fromiter((x for f in flows for x in f.weights), dtype=float, count=len(entry_flow))
    links, entry_link = np.unique(entry_link_ids, return_inverse=True)
    resid = np.array([capacity[l] for l in links], dtype=float)
    nl, nf = len(links), len(flows)
    rates = np.full(nf, INF)
    frozen = np.zeros(nf, dtype=bool)
    live = np.ones(nl, dtype=bool)
    while not frozen.all():
        active = ~frozen[entry_flow]
        wsum = np.bincount(entry_link, weights=w * active, minlength=nl)
        ok = live & (wsum > _EMPTY_WSUM)
        if not ok.any():
            break
        share = np.full(nl, INF)
        share[ok] = resid[ok] / wsum[ok]
        best = float(share.min())
        limit = best * (1.0 + _TIE) if best > 0 else 0.0
        tight = ok & (share <= limit)
        newly = np.zeros(nf, dtype=bool)
        newly[entry_flow[tight[entry_link] & active]] = True
        rates[newly] = best
        frozen |= newly
        resid -= np.bincount(entry_link, weights=w * newly[entry_flow] * best, minlength=nl)
        live &= ~tight
    return rates.tolist()

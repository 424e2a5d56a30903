"""Link compression: drop links whose constraint another link already states.

Two links used by exactly the same flows, with the same weights, and with the
same capacity, impose the same max-min constraint (Σ w·r ≤ c) — one of them is
redundant. Over all the flow plans of a program (known before it runs), links
are grouped by that signature and each plan keeps one link per group. This is
exact, and large: a ring's private links collapse into one, and the links of
the symmetric copies of a folded flow collapse with the representative's.

Pure: no SimPy. The run moves traffic on the kept link of each group only;
``keep`` maps every link to its kept one, so reports copy the traffic back.
"""
from __future__ import annotations

from itertools import compress
from operator import lt

from emulator.network.flows import FlowSpec, Plan


def compress_plans(plans: list[Plan], capacity: list[float]) -> tuple[list[Plan], dict[int, int]]:
    """The same plans with redundant links removed (see module doc), and for every link
    the link kept in its place (itself when kept): it carried the very same traffic."""
    # link → its users as a flat list fid, w, fid, w, ...: the same signature as the (fid, w)
    # pairs (the alternation makes it one-to-one), without a tuple per entry
    users: dict[int, list[float]] = {}
    fid = 0
    for plan in plans:
        for phase in plan:
            for f in phase:
                get = users.get
                for link, w in zip(f.links, f.weights):
                    u = get(link)
                    if u is None:
                        users[link] = [fid, w]
                    else:
                        u += (fid, w)
                fid += 1
    keep: dict[int, int] = {}
    first: dict[tuple[float, tuple[float, ...]], int] = {}  # (capacity, users) → first such link
    for link in sorted(users):
        keep[link] = first.setdefault((capacity[link], tuple(users[link])), link)
    kept = set(first.values())  # the links kept (each the first of its group)
    out: list[Plan] = []
    for plan in plans:
        new_plan = []
        for phase in plan:
            new_phase = []
            for f in phase:
                links = f.links
                if all(map(lt, links, links[1:])):  # as plans are built (_Acc.freeze): kept in order
                    mask = list(map(kept.__contains__, links))
                    new_phase.append(FlowSpec(tuple(compress(links, mask)), tuple(compress(f.weights, mask)),
                                              f.volume, f.latency))
                    continue
                pairs = sorted({(l, w) for l, w in zip(links, f.weights) if keep[l] == l})
                new_phase.append(FlowSpec(tuple(l for l, _ in pairs), tuple(w for _, w in pairs), f.volume,
                                          f.latency))
            new_plan.append(new_phase)
        out.append(new_plan)
    return out, keep

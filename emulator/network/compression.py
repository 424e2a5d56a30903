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

from emulator.network.flows import FlowSpec, Plan


def compress_plans(plans: list[Plan], capacity: list[float]) -> tuple[list[Plan], dict[int, int]]:
    """The same plans with redundant links removed (see module doc), and for every link
    the link kept in its place (itself when kept): it carried the very same traffic."""
    users: dict[int, list[tuple[int, float]]] = {}
    specs: list[FlowSpec] = []
    for plan in plans:
        for phase in plan:
            for f in phase:
                fid = len(specs)
                specs.append(f)
                for link, w in zip(f.links, f.weights):
                    users.setdefault(link, []).append((fid, w))
    keep: dict[int, int] = {}
    first: dict[tuple[float, tuple[tuple[int, float], ...]], int] = {}  # (capacity, users) → first such link
    for link in sorted(users):
        sig = (capacity[link], tuple(users[link]))
        keep[link] = first.setdefault(sig, link)
    out: list[Plan] = []
    it = iter(range(len(specs)))
    for plan in plans:
        new_plan = []
        for phase in plan:
            new_phase = []
            for f in phase:
                next(it)
                pairs = sorted({(l, w) for l, w in zip(f.links, f.weights) if keep[l] == l})
                new_phase.append(FlowSpec(tuple(l for l, _ in pairs), tuple(w for _, w in pairs), f.volume,
                                          f.latency))
            new_plan.append(new_phase)
        out.append(new_plan)
    return out, keep

"""Orbits of a direct all-to-all's flows under the fold's translations that map its group onto itself.

With symmetry folding (DESIGN.md, "Speed") a collective's representative instance carries the links of
each distinct *image* of its group. A group that the fold maps onto itself (an expert-parallel group that
is a whole pipeline stage, or a block of data-parallel ranks inside one) has no other image, so every
one of its n(n−1) all-to-all flows used to be simulated. Those flows are not all distinct, though: a
translation t that maps the group onto itself maps the flow a→b onto t(a)→t(b), which runs on the image
of its path, an automorphism of the network (the fold guarantees it), so under max-min fairness both get
the same rate and end together. One flow per orbit, carrying the links of every flow of its orbit with
multiplicity (as an image's flows are carried), gives the same timing with n − 1 flows instead of
n(n − 1) where the translations act on the group without fixed points.
"""
from __future__ import annotations

from emulator.program import Fold


def direct_orbits(fold: Fold, group: tuple[int, ...], flows: int) -> list[list[int]] | None:
    """The orbits of the flows of ``direct``'s all-to-all on ``group`` (one per ordered pair a ≠ b, a
    slower), as lists of flow indices, the smallest (the one simulated) first; None when no folded axis
    maps the group onto itself by one step (nothing to merge)."""
    n = len(group)
    if flows != n * (n - 1) or n < 2:
        return None
    members = set(group)
    steps = []
    for axis, folded in enumerate(fold.folded):
        if not folded or fold.shape[axis] == 1:
            continue
        offset = tuple(1 if k == axis else 0 for k in range(len(fold.shape)))
        image = [fold.translate(r, offset) for r in group]
        if set(image) == members:
            steps.append(dict(zip(group, image)))
    if not steps:
        return None
    index = {(a, b): i for i, (a, b) in enumerate((a, b) for a in group for b in group if a != b)}
    parent = list(range(flows))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for step in steps:  # the translations the steps generate: orbits are the components of these edges
        for (a, b), i in index.items():
            x, y = root(i), root(index[step[a], step[b]])
            if x != y:
                parent[max(x, y)] = min(x, y)
    orbits: dict[int, list[int]] = {}
    for i in range(flows):
        orbits.setdefault(root(i), []).append(i)
    return sorted(orbits.values())

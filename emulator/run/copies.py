"""Copies: the ranks and groups of a stamped program's copies, translated from its template.

A ``Stamped`` program (``emulator.run.folding``) is its representatives' ops plus the
translations that copy them; a plain Program is the one-copy case. Copy k of a template rank
or group is the template's translated by the k-th shift of the stamp, worked out on first use
and kept. The engine asks this for every rank and group it meets of a copy.
"""
from __future__ import annotations

from emulator.program import Fold, Program
from emulator.run.folding import Stamped


class Copies:
    """The copies of a program: ``count`` of them, copy 0 the template itself."""

    def __init__(self, program: Program) -> None:
        self.stamp: Fold | None
        self.shifts: list[tuple[int, ...] | None]
        if isinstance(program, Stamped):
            self.stamp, self.shifts, self.stride = program.stamp, list(program.translations), program.stride
        else:
            self.stamp, self.shifts, self.stride = None, [None], 0
        self.count = len(self.shifts)
        # per copy: template rank → its rank (None: the identity), template group → its group (sorted)
        self.rank_maps: list[dict[int, int] | None] = [None if s is None or not any(s) else {} for s in self.shifts]
        self._group_maps: list[dict[tuple[int, ...], tuple[int, ...]]] = [{} for _ in self.shifts]

    def rank(self, k: int, r: int) -> int:
        """Rank ``r`` of the template, in copy ``k``."""
        m = self.rank_maps[k]
        if m is None or r < 0:
            return r
        x = m.get(r)
        if x is None:
            stamp, shift = self.stamp, self.shifts[k]
            assert stamp is not None and shift is not None  # a map exists only for a moving copy
            x = m[r] = stamp.translate(r, shift)
        return x

    def group(self, k: int, g: tuple[int, ...]) -> tuple[int, ...]:
        """Group ``g`` of the template, in copy ``k`` (sorted)."""
        if self.rank_maps[k] is None:
            return g
        m = self._group_maps[k]
        x = m.get(g)
        if x is None:
            x = m[g] = tuple(sorted(self.rank(k, r) for r in g))
        return x

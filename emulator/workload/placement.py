"""Placement: which world rank holds which (pp, dp, cp, tp) coordinate, and the groups.

Megatron-LM's default order puts TP fastest (inside a node), then CP, then DP, then PP:

    rank = ((pp·DP + dp)·CP + cp)·TP + tp.

``ORDER`` (slowest → fastest) is the one place this order lives; a ``parallel.order``
override can pass another permutation of the same four names. Expert parallelism is
carved out of DP×CP as Megatron's expert-data-parallel: with u = dp·CP + cp, a rank's
EP index is u mod EP and its expert-data-parallel index u // EP, so an EP group is EP
consecutive u values with the same pp and tp.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from emulator.errors import ScenarioError
from emulator.scenario.spec import ParallelSpec

ORDER: tuple[str, ...] = ("pp", "dp", "cp", "tp")  # slowest → fastest (Megatron-LM)


@dataclass(frozen=True)
class Layout:
    """The rank grid of one job. ``sizes`` maps axis name → size; ``order`` is slowest first."""

    sizes: dict
    ep: int = 1
    order: tuple[str, ...] = ORDER

    @classmethod
    def from_parallel(cls, par: ParallelSpec, world: int, order: tuple[str, ...] | None = None) -> "Layout":
        order = tuple(order or ORDER)
        if sorted(order) != sorted(ORDER):
            raise ScenarioError(f"must be a permutation of {', '.join(ORDER)}, got {', '.join(order)}",
                                key="parallel.order")
        sizes = {"pp": par.pp, "dp": par.dp, "cp": par.cp, "tp": par.tp}
        for axis, n in sizes.items():
            if n < 1:
                raise ScenarioError(f"must be at least 1, got {n}", key=f"parallel.{axis}")
        product_ = par.tp * par.pp * par.dp * par.cp
        if product_ != world:
            raise ScenarioError(f"tp·pp·dp·cp = {par.tp}·{par.pp}·{par.dp}·{par.cp} = {product_} "
                                f"but the cluster has {world} GPUs", key="parallel")
        if par.ep < 1 or (par.dp * par.cp) % par.ep:
            raise ScenarioError(f"ep {par.ep} must divide dp·cp = {par.dp * par.cp} (experts are "
                                f"parallel across data-parallel ranks, as in Megatron)", key="parallel.ep")
        return cls(sizes, par.ep, order)

    @property
    def world(self) -> int:
        n = 1
        for v in self.sizes.values():
            n *= v
        return n

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[a] for a in self.order)

    def coords(self, rank: int) -> dict:
        """{'pp': .., 'dp': .., 'cp': .., 'tp': ..} of a world rank."""
        out = {}
        for axis in reversed(self.order):
            out[axis] = rank % self.sizes[axis]
            rank //= self.sizes[axis]
        return out

    def rank(self, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        c = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
        r = 0
        for axis in self.order:
            r = r * self.sizes[axis] + c[axis] % self.sizes[axis]
        return r

    def _group(self, rank: int, axes: tuple[str, ...]) -> tuple[int, ...]:
        base = self.coords(rank)
        out = []
        for values in product(*(range(self.sizes[a]) for a in axes)):
            c = dict(base)
            c.update(zip(axes, values))
            out.append(self.rank(**c))
        return tuple(sorted(out))

    def tp_group(self, rank: int) -> tuple[int, ...]:
        return self._group(rank, ("tp",))

    def cp_group(self, rank: int) -> tuple[int, ...]:
        return self._group(rank, ("cp",))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        return self._group(rank, ("dp",))

    def pp_group(self, rank: int) -> tuple[int, ...]:
        return self._group(rank, ("pp",))

    def dp_cp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that share dense weights: gradients are reduced over DP×CP (Megatron)."""
        return self._group(rank, ("dp", "cp"))

    def _u(self, c: dict) -> int:
        return c["dp"] * self.sizes["cp"] + c["cp"]

    def _from_u(self, c: dict, u: int) -> int:
        cc = dict(c)
        cc["dp"], cc["cp"] = divmod(u, self.sizes["cp"])
        return self.rank(**cc)

    def ep_group(self, rank: int) -> tuple[int, ...]:
        """EP consecutive u = dp·CP + cp values with the same pp and tp."""
        c = self.coords(rank)
        base = self._u(c) // self.ep * self.ep
        return tuple(sorted(self._from_u(c, base + i) for i in range(self.ep)))

    def edp_group(self, rank: int) -> tuple[int, ...]:
        """Expert-data-parallel: the ranks that share this rank's experts (same u mod EP)."""
        c = self.coords(rank)
        u = self._u(c)
        n = self.sizes["dp"] * self.sizes["cp"]
        return tuple(sorted(self._from_u(c, v) for v in range(u % self.ep, n, self.ep)))

    def ep_index(self, rank: int) -> int:
        return self._u(self.coords(rank)) % self.ep

    def neighbour(self, rank: int, axis: str, offset: int) -> int:
        """The rank ``offset`` steps along ``axis`` (cyclically)."""
        c = self.coords(rank)
        c[axis] = (c[axis] + offset) % self.sizes[axis]
        return self.rank(**c)

"""Placement: which world rank holds which (pp, dp, cp, tp) coordinate, and the groups.

Megatron-LM's default order puts TP fastest (inside a node), then CP, then DP, then PP:

    rank = ((pp·DP + dp)·CP + cp)·TP + tp.

``ORDER`` (slowest → fastest) is the one place this order lives; a ``parallel.order``
override can pass another permutation of the same four names. Expert parallelism is
carved out of DP×CP as Megatron's expert-data-parallel: with u = dp·CP + cp, a rank's
EP index is u mod EP and its expert-data-parallel index u // EP, so an EP group is EP
consecutive u values with the same pp and tp.

MoE parallel folding (``parallel.etp`` other than tp): the expert layers get a grid of their own,
ETP × EP × expert-DP × PP = world, as Megatron-Core builds it (megatron/core/parallel_state.py @
d98e8a64dd, ``initialize_model_parallel``, lines 870-908: ``expert_decoder_rank_generator =
RankGenerator(tp=expert_tensor_parallel_size, ep=expert_model_parallel_size, dp=expert_data_parallel_size,
pp=..., cp=1, order=...)`` over the same order as the attention's "tp-cp-ep-dp-pp", with
expert_data_parallel_size = world // (etp·ep·pp), and the EP, ETP and expert-DP groups taken from it by
``get_ranks('ep')``, ``get_ranks('tp')`` and ``get_ranks('dp')``, lines 1357-1471). Both grids keep pp
slowest and share the pipeline groups (the assertion of line 904), so inside one pipeline stage the
index j = tp + TP·(cp + CP·dp) of the attention's grid is read again, fastest first, as
j = etp + ETP·(ep + EP·edp). With ETP 1 and TP 2, an EP group takes in both TP ranks of each DP
replica. With etp = tp this is the grid above (u = cp + CP·dp = ep + EP·edp), which stays the code
path for every order.
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
    etp: int = 0  # expert tensor-parallel size; 0: as tp (no folding)

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
        etp = par.etp if par.etp and par.etp != par.tp else 0
        if etp:
            if (par.tp * par.dp * par.cp) % (etp * par.ep):
                raise ScenarioError(f"etp·ep = {etp}·{par.ep} must divide tp·dp·cp = {par.tp * par.dp * par.cp} "
                                    f"(the expert layers' grid, Megatron-Core's MoE parallel folding)",
                                    key="parallel.ep")
        elif par.ep < 1 or (par.dp * par.cp) % par.ep:
            raise ScenarioError(f"ep {par.ep} must divide dp·cp = {par.dp * par.cp} (experts are "
                                f"parallel across data-parallel ranks, as in Megatron)", key="parallel.ep")
        return cls(sizes, par.ep, order, etp)

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

    def _j(self, c: dict) -> int:
        """The rank's index inside its pipeline stage in Megatron's order (tp fastest, then cp, dp)."""
        return c["tp"] + self.sizes["tp"] * (c["cp"] + self.sizes["cp"] * c["dp"])

    def _from_j(self, c: dict, j: int) -> int:
        cc = dict(c)
        rest, cc["tp"] = divmod(j, self.sizes["tp"])
        cc["dp"], cc["cp"] = divmod(rest, self.sizes["cp"])
        return self.rank(**cc)

    def _expert_group(self, rank: int, axis: str) -> tuple[int, ...]:
        """The folded expert grid's group along ``axis`` (etp | ep | edp): j = etp + ETP·(ep + EP·edp)."""
        c = self.coords(rank)
        j = self._j(c)
        e, ep = self.etp, self.ep
        edp = self.sizes["tp"] * self.sizes["cp"] * self.sizes["dp"] // (e * ep)
        digits = {"etp": (j % e, 1, e), "ep": (j // e % ep, e, ep), "edp": (j // (e * ep), e * ep, edp)}
        value, stride, size = digits[axis]
        base = j - value * stride
        return tuple(sorted(self._from_j(c, base + i * stride) for i in range(size)))

    def etp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that split one expert's weights: the TP group, or the folded grid's ETP group."""
        return self._expert_group(rank, "etp") if self.etp else self.tp_group(rank)

    def ep_group(self, rank: int) -> tuple[int, ...]:
        """EP consecutive u = dp·CP + cp values with the same pp and tp (folded: the expert grid's EP group)."""
        if self.etp:
            return self._expert_group(rank, "ep")
        c = self.coords(rank)
        base = self._u(c) // self.ep * self.ep
        return tuple(sorted(self._from_u(c, base + i) for i in range(self.ep)))

    def edp_group(self, rank: int) -> tuple[int, ...]:
        """Expert-data-parallel: the ranks that share this rank's experts (same u mod EP; folded: the
        expert grid's expert-DP group)."""
        if self.etp:
            return self._expert_group(rank, "edp")
        c = self.coords(rank)
        u = self._u(c)
        n = self.sizes["dp"] * self.sizes["cp"]
        return tuple(sorted(self._from_u(c, v) for v in range(u % self.ep, n, self.ep)))

    def ep_index(self, rank: int) -> int:
        if self.etp:
            return self._j(self.coords(rank)) // self.etp % self.ep
        return self._u(self.coords(rank)) % self.ep

    def neighbour(self, rank: int, axis: str, offset: int) -> int:
        """The rank ``offset`` steps along ``axis`` (cyclically)."""
        c = self.coords(rank)
        c[axis] = (c[axis] + offset) % self.sizes[axis]
        return self.rank(**c)


def hsdp_groups(group: tuple[int, ...], k: int, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """HSDP's split of data-parallel ``group`` (its ranks in order) into ``k`` instances of consecutive ranks, as
    Megatron-Core's hierarchical groups [intra size, k] (parallel_state.py @ d98e8a64dd ``create_hierarchical_
    groups``): (``rank``'s instance, ``rank``'s peers at its place in every instance). k = 1: (group, (rank,))."""
    if k <= 1 or len(group) < k:
        return group, (rank,)
    size = len(group) // k
    i = group.index(rank)
    return group[i // size * size:(i // size + 1) * size], group[i % size::size]

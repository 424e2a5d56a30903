"""Symmetry folding: which ranks are provably identical, so that one stands for all.

The rank grid of a Megatron layout is (pp, dp, cp, tp), tp fastest
(rank = ((pp·D + dp)·C + cp)·T + tp). Translating a folded axis must map the
program onto itself (true for tp, cp and dp: peers and replicas run the same
ops) *and* the network onto itself (an automorphism), or folded ≠ unfolded.
This module decides which translations are automorphisms of the topology:

- inside a node, rotating a block of GPUs is an automorphism of the node's
  switch when every GPU has its own NIC (or all share one);
- across nodes, rotating whole nodes is an automorphism of a single switch, of a
  leaf (its nodes are interchangeable), and permuting whole leaves is one of a
  two-level fat-tree or rail fabric; so a dp axis that spans several leaves is
  split into (leaves, nodes in a leaf, GPUs in a node) and each part is folded;
- on a non-blocking fat-tree or rail fabric, dp blocks that cross leaves are folded
  *in effect* (``Fold.checked``): only latencies can differ there, and every plan checks
  that its copies' latencies equal its own, or the fold is refused (``FoldRefused``) and
  the run folds the automorphisms only;
- rings and tori fold only inside nodes; custom graphs, overrides (stragglers,
  degraded or failed links), hashed ECMP routing, traces and expert parallelism are
  not folded;
- with MoE parallel folding (``parallel.etp`` other than tp) a pipeline stage's index
  j = tp + TP·(cp + CP·dp) is also read as etp + ETP·(ep + EP·edp) (workload/placement.py). Where
  the strides of both readings form one chain (each divides the next), j splits into digits that
  each lie inside one axis of both grids; rotating such a digit maps TP, DP, EP, ETP and expert-DP
  groups onto groups of their kind, so it is a symmetry of the program, and it is folded where it is
  also one of the network (as a dp axis, ``_dp_axes``). Digits inside cp are not folded (the ring's
  neighbours are a rotation of the whole cp axis only);
- with expert parallelism over whole CP rings (cp divides ep: each EP group is a block of whole CP groups,
  ``_ep_rings``), a rotation of cp maps every EP group onto itself, so the cp axis folds as without experts
  (GLM-5's recipe: CP 32 = EP 32, 192 ranks simulated as 6);
- without expert parallelism, a CP ring over whole nodes (tp·cp a multiple of a node's GPUs) folds its rotations by
  whole nodes, which map the ring and its nodes onto themselves, and not the ring's ranks inside a node
  (``_cp_axes``); a CP group that meets only in collectives (cp_comm_type all_gather or a2a: no ring) folds as a
  dp axis does, its ranks in a node too, with expert parallelism over it or without.

Each refusal comes with a note that the summary carries.
"""
from __future__ import annotations

import dataclasses

from emulator.network.domain import network_cluster
from emulator.program import Fold, Op, Program
from emulator.scenario.spec import Scenario

GROUP_CP = ("all_gather", "a2a")  # cp_comm_types whose CP exchanges are collectives over the whole group (no ring)


def _node_axes(span_nodes: int, step_nodes: int, scenario: Scenario,
               checked: list[bool] | None = None) -> list[tuple[int, bool]] | None:
    """Axes (slow→fast) for rotating ``span_nodes // step_nodes`` positions of
    ``step_nodes`` whole nodes each, inside a block of ``span_nodes`` nodes.

    Where the rotation is no automorphism (blocks that cross leaves, leaves that the block
    does not divide) but the fabric is non-blocking (``_non_blocking``), it is folded in
    effect: ``checked`` gets True, and every plan then checks its copies' latencies."""
    count = span_nodes // step_nodes
    fabric = scenario.cluster.fabric
    if scenario.cluster.nodes == 1 or fabric.kind == "single_switch":
        return [(count, True)]
    if fabric.kind not in ("fat_tree", "rail"):
        return None
    leaf = max(1, min(fabric.leaf_size, scenario.cluster.nodes))
    if span_nodes <= leaf and leaf % span_nodes == 0:
        return [(count, True)]
    if span_nodes % leaf == 0 and leaf % step_nodes == 0:
        return [(span_nodes // leaf, True), (leaf // step_nodes, True)]
    if checked is not None and _non_blocking(scenario):
        checked.append(True)
        return [(count, True)]
    return None


def _non_blocking(scenario: Scenario) -> bool:
    """A two-level fat-tree or rail fabric whose uplinks carry all that its NICs can send, spread evenly
    (spray): no leaf–spine link can be the only bottleneck of a flow, so GPUs on different
    leaves get the same bandwidth as GPUs on one leaf. Only latencies differ (two more hops);
    a fold in effect checks those plan by plan (``Fold.checked``)."""
    fabric, node = scenario.cluster.fabric, scenario.cluster.node
    if fabric.kind not in ("fat_tree", "rail") or fabric.routing != "spray" or node is None \
            or fabric.oversubscription > 1:
        return False
    leaf = max(1, min(fabric.leaf_size, scenario.cluster.nodes))
    spines = fabric.spines or max(1, node.nics)
    # what the NICs below one leaf (or rail) switch can send (topology.fat_tree, topology.rail)
    down = leaf * (node.nics if fabric.kind == "fat_tree" else 1) * node.nic_bandwidth
    up = (fabric.link_bandwidth or down / spines) / fabric.oversubscription * spines
    return up >= down


def _dp_axes(d: int, unit: int, g: int, scenario: Scenario,
             checked: list[bool] | None = None) -> list[tuple[int, bool]]:
    """Axes for the dp coordinate: d positions of ``unit`` ranks each."""
    if d == 1:
        return [(1, False)]
    if unit * d <= g and g % (unit * d) == 0:
        return [(d, True)]
    if unit % g == 0:
        axes = _node_axes(d * unit // g, unit // g, scenario, checked)
        return axes if axes else [(d, False)]
    if g % unit == 0 and (unit * d) % g == 0:
        inner = g // unit
        axes = _node_axes(d * unit // g, 1, scenario, checked)
        if axes:
            return axes + [(inner, True)]
        return [(d // inner, False), (inner, True)]
    return [(d, False)]


def choose_fold(scenario: Scenario, in_effect: bool = True) -> tuple[Fold | None, str]:
    """The fold for a model workload, and a note saying what was folded or why not
    (``in_effect``: also fold replicas that are symmetric in effect only, see ``_node_axes``)."""
    if scenario.simulation.fold == "off":
        return None, "folding off (simulation.fold: off)"
    if scenario.workload.trace:
        return None, "folding off: trace workloads are simulated rank by rank"
    c = scenario.cluster
    if c.fabric.kind == "custom" or c.node is None:
        return None, "folding off: a custom graph is not known to be symmetric"
    if c.fabric.routing == "ecmp_hash":
        return None, "folding off: ECMP hashing routes each pair of GPUs its own way (fabric.routing: ecmp_hash)"
    if c.overrides:
        return None, "folding off: overrides (stragglers, degraded or failed links) break the symmetry"
    p = scenario.parallel
    if p.order and tuple(p.order) != ("pp", "dp", "cp", "tp"):
        return None, "folding off: a rank placement other than Megatron's (parallel.order)"
    t, cp, d, pp = p.tp, p.cp, p.dp, p.pp
    if c.nodes * c.node.gpus_per_node % c.node.domain:
        return None, "folding off: the last NVLink domain is partly filled (cluster.node.nvlink_domain)"
    # symmetric as the network sees it: a node is an NVLink domain (network/domain.py)
    scenario = dataclasses.replace(scenario, cluster=network_cluster(c))
    c = scenario.cluster
    assert c.node is not None
    g, nics = c.node.gpus_per_node, c.node.nics
    in_node_ok = nics in (0, 1, g)
    tp_ok = in_node_ok and t <= g and g % t == 0
    cp_ok = tp_ok and t * cp <= g and g % (t * cp) == 0
    axes: list[tuple[int, bool]] = [(pp, False)]
    note = "folding on"
    checked: list[bool] | None = [] if in_effect else None  # set by a dp axis folded in effect (_node_axes)
    if _expert_digits(p) is not None:
        axes += _expert_axes(p, g, scenario, in_node_ok)
        fold = Fold(tuple(s for s, _ in axes), tuple(f and s > 1 for s, f in axes))
        if fold.copies == 1:
            return None, "folding found no symmetric ranks to fold"
        return fold, f"folding on (the experts' own grid, etp {p.etp}): {fold.copies} ranks per simulated rank"
    if _folded_experts(p):
        return None, "folding off: the expert grid (parallel.etp) and the attention's do not nest"
    if p.ep > 1 and _ep_rings(p):  # a cp rotation keeps every EP group (whole CP rings) onto itself
        axes += [(d, False)] + _cp_axes(p, g, scenario, cp_ok, False, in_node_ok)
    elif p.ep > 1 and not _ep_splits(p):
        axes += [(d, False), (cp, False)]
        note = "folding: tp only (expert parallelism with context parallelism regroups the dp ranks)"
    elif p.ep > 1:  # dp = (blocks of ep) × (position in the block): both rotate EP groups onto EP groups
        outer = _dp_axes(d // p.ep, p.ep * t, g, scenario) if in_node_ok else [(d // p.ep, False)]
        inner = _dp_axes(p.ep, t, g, scenario) if in_node_ok else [(p.ep, False)]
        axes += outer + inner + [(cp, False)]
    else:
        axes += _dp_axes(d, cp * t, g, scenario, checked) if in_node_ok else [(d, False)]
        axes += _cp_axes(p, g, scenario, cp_ok, tp_ok, in_node_ok)
    axes.append((t, tp_ok and t > 1))
    fold = Fold(tuple(s for s, _ in axes), tuple(f and s > 1 for s, f in axes), bool(checked))
    if fold.copies == 1:
        return None, "folding found no symmetric ranks to fold"
    if fold.checked:
        note += " (data-parallel replicas on different leaves of a non-blocking fabric folded in effect: " \
                "every copy checked to have the same latencies)"
    return fold, f"{note}: {fold.copies} ranks per simulated rank"


def _cp_axes(p, g: int, scenario: Scenario, cp_ok: bool, by_node: bool, in_node_ok: bool) -> list[tuple[int, bool]]:
    """The fold's axes for the cp coordinate. Inside a node (``cp_ok``) every rotation of the ring is folded. With
    ``by_node`` (tp folded too), a ring over whole nodes (tp·cp a multiple of the node's g GPUs) folds its rotations
    by whole nodes only: cp splits into (nodes of the ring, folded; the ring's g/tp ranks in a node, not folded),
    where rotating the ring's nodes is a symmetry of the network (``_node_axes``: the ring's nodes in one leaf, not
    folded in effect). A rotation by one rank would carry a node's last GPU into the next node's first: no symmetry
    of the nodes. Llama-3 70B at TP 8, CP 2 over 2 DGX nodes: 32 ranks per simulated rank instead of 16, 2.3x
    faster. Not with EP groups over the rings (``choose_fold``): GLM-5.1's H100 recipe (CP 32 = EP 32 over 4 nodes)
    ran slower folded so, 28.5 → 31.5 s at 8 micro-batches, in 2.2x the memory, its DeepEP dispatches over 4 nodes
    being most of its work either way.

    By all-gather or all-to-all (``GROUP_CP``: Transformer Engine's cp_comm_type all_gather, a2a) the CP group meets
    only in collectives over all of it (layer.py: no ring exchange), so any permutation of its ranks maps the program
    onto itself, and the cp axis folds as a dp axis does (``_dp_axes``: its nodes rotated as whole nodes, and its ranks
    in a node all at once, in every node alike), with or without EP over it. GLM-5.1's recipe on 416 H100 (CP 32 =
    EP 32, all-gather) then simulates 13 ranks instead of 416, the same iteration to the bit: 180 → 60 s. The
    ranks in a node rotate together only where the rotation is a symmetry of the node (``in_node_ok``: every GPU
    its own NIC, or all one); else the ring's rule below decides."""
    digits = _cp_digits(p)
    if cp_ok:
        return [(size, size > 1) for size in digits]
    t, cp = p.tp, p.cp
    if p.cp_comm_type in GROUP_CP and in_node_ok:
        return _dp_axes(cp, t, g, scenario)
    if by_node and len(digits) == 1 and t * cp > g and (t * cp) % g == 0:
        per_node, nodes = g // t, t * cp // g
        if _node_axes(nodes, 1, scenario) == [(nodes, True)]:
            return [(nodes, True), (per_node, False)]
    return [(size, False) for size in digits]


def _cp_digits(p) -> tuple[int, ...]:
    """The cp axis as rotations that keep its groups, slowest first: the whole ring; with cp_comm_type a2a+p2p
    (hierarchical_context_parallel_sizes [a, b]) the ring's b positions and the a ranks of an all-to-all group,
    since a rotation of cp by one would carry a group's last rank into the next group."""
    sizes = p.hierarchical_context_parallel_sizes
    if p.cp_comm_type == "a2a+p2p" and sizes and len(sizes) == 2 and sizes[0] * sizes[1] == p.cp:
        return (sizes[1], sizes[0])
    return (p.cp,)


def _folded_experts(p) -> bool:
    return bool(p.etp) and p.etp != p.tp


def _expert_digits(p) -> list[tuple[int, int, str]] | None:
    """MoE parallel folding: the digits (stride, size, dense axis) of a pipeline stage's index j, fastest
    first, that refine both j = tp + TP·(cp + CP·dp) and j = etp + ETP·(ep + EP·edp); None without
    folding or where the two sets of strides are no chain of divisors."""
    if not _folded_experts(p):
        return None
    world = p.tp * p.cp * p.dp
    if world % (p.etp * p.ep):
        return None
    strides = sorted({1, p.tp, p.tp * p.cp, p.etp, p.etp * p.ep, world})
    if any(b % a for a, b in zip(strides, strides[1:])):
        return None
    return [(a, b // a, "tp" if a < p.tp else "cp" if a < p.tp * p.cp else "dp") for a, b in zip(strides, strides[1:])]


def _expert_axes(p, g: int, scenario: Scenario, in_node_ok: bool) -> list[tuple[int, bool]]:
    """The fold's axes for the digits of ``_expert_digits``, slowest first."""
    axes: list[tuple[int, bool]] = []
    for stride, size, axis in reversed(_expert_digits(p) or []):
        if axis == "cp" or not in_node_ok:
            axes.append((size, False))
        else:
            axes += _dp_axes(size, stride, g, scenario)
    return axes


def _ep_splits(p) -> bool:
    """Expert parallelism without CP: EP groups are blocks of ``ep`` consecutive dp ranks
    (emulator.workload.placement), so dp splits into (dp/ep blocks, ep positions), and a
    rotation of either maps EP groups, and expert-data-parallel groups, onto their kind."""
    return p.cp == 1 and p.dp % p.ep == 0


def _ep_rings(p) -> bool:
    """Expert parallelism over whole CP rings: EP groups are blocks of ``ep`` consecutive ranks of the
    (dp, cp) index j = cp + CP·dp (emulator.workload.placement), so where ``cp`` divides ``ep`` each group is
    made of whole CP groups and a rotation of cp maps it onto itself (GLM-5's CP 32 = EP 32)."""
    return p.cp > 1 and p.ep % p.cp == 0 and (p.cp * p.dp) % p.ep == 0


def program_fold(scenario: Scenario) -> Fold | None:
    """The symmetry of the *program* alone (not the network): the builder emits the same
    ops, translated, for every tp, cp and dp coordinate (with expert parallelism, dp as
    (blocks, positions), and cp not at all). Used to build an unfolded program fast:
    build the representatives, then stamp copies."""
    p = scenario.parallel
    if p.order and tuple(p.order) != ("pp", "dp", "cp", "tp"):
        return None
    digits = _expert_digits(p)
    if digits is not None:
        sizes = [size for _s, size, _a in reversed(digits)]
        fold = Fold((p.pp, *sizes), (False, *(axis != "cp" for _s, _z, axis in reversed(digits))))
        return fold if fold.copies > 1 else None
    if _folded_experts(p):
        return None
    if p.ep > 1 and _ep_splits(p):
        fold = Fold((p.pp, p.dp // p.ep, p.ep, p.cp, p.tp), (False, p.dp > p.ep, True, False, p.tp > 1))
    elif p.ep > 1 and _ep_rings(p):
        cp = _cp_digits(p)
        fold = Fold((p.pp, p.dp, *cp, p.tp), (False, False, *(c > 1 for c in cp), p.tp > 1))
    else:
        plain = p.ep == 1
        cp = _cp_digits(p)
        fold = Fold((p.pp, p.dp, *cp, p.tp), (False, plain and p.dp > 1, *(plain and c > 1 for c in cp), p.tp > 1))
    return fold if fold.copies > 1 else None


class Stamped(Program):
    """A program given as its representatives' ops (``template``) and a symmetry
    (``stamp``) whose every translation gives a copy of them: copy k (the k-th of
    ``stamp.translations()``, copy 0 the identity) has rank, group, root and peer
    translated and ids and deps shifted by ``k·stride``.

    The engine consumes this form directly, so an unfolded run never materialises
    one Op per rank (that cost ~5 µs and ~300 B per op: 21M ops at 1024 GPUs).
    With ``fold``, each copy is itself folded by it (``restamp``: replicas whose fold in
    effect was refused, with their tensor-parallel peers still folded); the template's
    ranks are then that fold's representatives.
    ``ops`` still gives every copy's ops, built on first use, for anyone who asks.
    """

    def __init__(self, template: Program, stamp: Fold, fold: Fold | None = None) -> None:  # noqa: D107
        self.ranks = template.ranks
        self.fold = fold  # what each copy still folds (automorphisms), or None: every rank simulated
        self.meta = template.meta  # immutable: shared
        self.iterations = template.iterations
        self.template = template.ops
        self.stamp = stamp
        self.checked = False  # the template validated already (``validate`` then skips it)
        self.translations = list(stamp.translations())
        self.stride = max((op.id for op in self.template), default=-1) + 1
        self._ops: list[Op] | None = None

    @property
    def ops(self) -> list[Op]:  # type: ignore[override]
        if self._ops is None:
            self._ops = _stamp_ops(self)
        return self._ops

    def distinct_ops(self) -> list[Op]:
        return self.template

    def simulated_ranks(self) -> list[int]:
        ranks = {op.rank for op in self.template}
        return sorted({self.stamp.translate(r, t) for r in ranks for t in self.translations})

    def validate(self) -> None:
        """The template's checks; its copies are valid by construction (translations stay in the grid)."""
        if not self.checked:
            Program(self.ranks, self.template).validate()
            self.checked = True

    def repeated(self, n: int) -> Program:
        if n <= 1 or self.iterations > 1:
            return self
        return Program(self.ranks, self.ops, self.fold, self.meta).repeated(n)


def unfold(program: Program, fold: Fold) -> Stamped:
    """Every rank's ops, from the representatives' ops of a program with symmetry ``fold``
    (a ``Stamped`` program: copies are made only if its ``ops`` are asked for)."""
    return Stamped(program, fold)


def restamp(program: Program, scenario: Scenario) -> Stamped | None:
    """A program folded in effect (``Fold.checked``) whose fold was refused, as the program the
    automorphisms alone fold, without building it again: its ops are the template, the replicas
    folded in effect are stamped from it (simulated each, from one copy of the ops), and what
    the automorphisms fold stays folded. None where the two folds do not share one grid.

    The builder emits a rank's ops the same under either fold (a fold only says which ranks it
    emits), so the copies are the ops the automorphism fold would have built for those ranks:
    the run is the same, less the build (GPT 530B: 1.59M ops built twice) and its memory."""
    effect = program.fold
    if effect is None or not effect.checked:
        return None
    auto, _ = choose_fold(scenario, in_effect=False)
    shape = effect.shape
    if auto is None or auto.shape != shape or any(a and not e for a, e in zip(auto.folded, effect.folded)):
        return None
    stamp = Fold(shape, tuple(e and not a for e, a in zip(effect.folded, auto.folded)))
    return Stamped(program, stamp, auto)


def _stamp_ops(sp: Stamped) -> list[Op]:
    """The ops of every copy of a Stamped program, blocks opened. Per-(rank, stream) order is the
    representative's."""
    ops, fold, stride = Program(sp.ranks, sp.template).expanded().ops, sp.stamp, sp.stride
    out: list[Op] = list(ops)
    for k, t in enumerate(sp.translations):
        if not any(t):
            continue
        off = k * stride
        ranks: dict[int, int] = {}
        groups: dict[tuple[int, ...], tuple[int, ...]] = {}

        def tr(r: int) -> int:
            x = ranks.get(r)
            if x is None:
                x = ranks[r] = fold.translate(r, t) if r >= 0 else r
            return x

        append = out.append
        for op in ops:
            g = op.group
            if g:
                tg = groups.get(g)
                if tg is None:
                    tg = groups[g] = tuple(sorted(tr(r) for r in g))
                g = tg
            append(Op(op.id + off, tr(op.rank), op.kind, op.stream, tuple(d + off for d in op.deps), op.name,
                      op.duration, op.flops, op.bytes, op.category, op.collective, g, tr(op.root), tr(op.peer),
                      op.tag, op.microbatch, op.stage, op.layer))
    return out


class JobsFold:
    """The folds of several jobs on one cluster (issue 29): job j runs on cluster GPUs ``gpus[j]`` (its
    rank r on ``gpus[j][r]``) with its own fold over its own ranks, or None (every rank simulated).
    It answers what the engine and the collective model ask of a ``Fold``, in cluster GPU numbering:
    a group's symmetric copies (``orbit``), the representative of a rank, the way back to it.

    A job's fold holds in the shared run only where its copies also see the same traffic from the
    other jobs: ``contested(rank)`` gives the links other jobs use, and the collective model refuses
    (``FoldRefused``, ``last`` naming the job) a plan whose copies put different loads on any of them;
    the run then folds that job less (``emulator.run.mix``). Where the copies load those links alike, the
    translation that maps the copies onto each other maps the whole run onto itself (other jobs'
    flows and the contested links stay, the job's private links permute like its alone run's), so
    the copies run alike, as a single job's do (``emulator.run.folding``)."""

    def __init__(self, gpus: list[tuple[int, ...]], folds: list[Fold | None],
                 others: list[frozenset[int]]) -> None:  # noqa: D107
        self.gpus, self.folds, self.others = gpus, folds, others
        self.where: dict[int, tuple[int, int]] = {g: (j, r) for j, gs in enumerate(gpus) for r, g in enumerate(gs)}
        self.checked = any(f is not None and f.checked for f in folds)
        self.copies = max([f.copies for f in folds if f is not None], default=1)
        self.last = -1  # the job of the last ``orbit`` asked (which job a refusal names)

    def job(self, rank: int) -> int:
        return self.where[rank][0]

    def copies_of(self, rank: int) -> int:
        f = self.folds[self.where[rank][0]]
        return f.copies if f is not None else 1

    def contested(self, rank: int) -> frozenset[int]:
        return self.others[self.where[rank][0]]

    def orbit(self, ranks: list[int], key: int, ordered: bool) -> list[list[int]]:
        j = self.where[ranks[0]][0]
        self.last = j
        fold, gs = self.folds[j], self.gpus[j]
        if fold is None or fold.copies == 1:
            return [list(ranks)]
        local = [self.where[r][1] for r in ranks]
        return [[gs[x] for x in row] for row in fold.orbit(local, key, ordered)]

    def representative(self, rank: int) -> int:
        j, r = self.where[rank]
        fold = self.folds[j]
        return rank if fold is None else self.gpus[j][fold.representative(r)]

    def is_representative(self, rank: int) -> bool:
        j, r = self.where[rank]
        fold = self.folds[j]
        return fold is None or fold.is_representative(r)

    def back(self, dst: int, src: int) -> tuple[int, int]:
        """(dst, src) moved by the translation that takes ``dst`` to its representative."""
        j, d = self.where[dst]
        fold, gs = self.folds[j], self.gpus[j]
        if fold is None:
            return dst, src
        d2, s2 = back(fold, d, self.where[src][1])
        return gs[d2], gs[s2]


def back(fold: Fold | JobsFold, dst: int, src: int) -> tuple[int, int]:
    """(dst, src) moved by the translation of ``fold`` that takes ``dst`` to its representative (a
    transfer to a folded copy is matched as the one to the representative)."""
    if isinstance(fold, JobsFold):
        return fold.back(dst, src)
    c = fold.coords(dst)
    shift = tuple(-x if f else 0 for x, f in zip(c, fold.folded))
    return fold.translate(dst, shift), fold.translate(src, shift)


class JobsProgram(Program):
    """The ops of several jobs on one cluster, each folded by its own fold (``JobsFold``); the ranks of
    its unfolded jobs are simulated whether or not they have ops (they must join their groups)."""

    def __init__(self, ranks: int, ops: list[Op], fold: JobsFold) -> None:  # noqa: D107
        super().__init__(ranks, ops, None)
        self.fold = fold  # type: ignore[assignment]  # a Fold's interface, over several jobs

    def simulated_ranks(self) -> list[int]:
        fold = self.fold
        assert isinstance(fold, JobsFold)
        ranks = {op.rank for op in self.ops}
        for gs, f in zip(fold.gpus, fold.folds):
            if f is None:
                ranks.update(gs)
        return sorted(ranks)

    def repeated(self, n: int) -> Program:  # noqa: D102  # built with its iterations already
        assert n <= 1
        return self

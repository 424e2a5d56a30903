"""Collectives as a few coupled flows, not packets (DESIGN.md, "Network model").

A collective becomes a flow plan (flows.py): phases of flows that start together.

Algorithms (small named plug-ins in ``ALGORITHMS``), for a group of n GPUs and a
buffer of S bytes (the nccl-tests convention), uncontended on bandwidth B with a
per-step latency α (path latency of the slowest hop plus the software step
latency of its class) and a launch cost L:

- ring all-reduce:       L + 2(n−1)·α + 2(n−1)/n · S/B
- ring reduce-scatter / all-gather: L + (n−1)·α + (n−1)/n · S/B
- ring broadcast:        L + (n−1)·α + S/B   (pipelined from the root along each ring channel)
- direct all-to-all:     one flow per ordered pair, S/n bytes each, each of latency
                         L + α + (n − 2)·p: p per peer beyond the first (``ALLTOALL_PEER_S``)
- send/recv:             L + α + S/B
- MoE dispatch (all-to-all-v with per-pair sizes, DeepEP): one flow per rank over its legs (dispatch.py)
- tree all-reduce (NCCL's double binary tree, tree.py): per channel two trees over the
  nodes, each carrying half; inside a node a chain. Reduce up and broadcast down are
  pipelined: one flow over every edge both ways, L + 2·(chain α + depth α).
- collnet all-reduce (InfiniBand SHARP, ``fabric.sharp``), pipelined: per local position
  one flow of S/k from the node's GPUs to that position's GPU, up the switches and back
  (each NIC sends S/k once and gets it back once; the switches reduce, so a link shared
  by several nodes' paths carries it once) and out to the node's GPUs again.
- hierarchical all-reduce (multi-node): reduce-scatter inside each node, ring
  all-reduce of S/k across nodes per local position, all-gather inside the node.
- nvls all-reduce (one node with NVLink SHARP, opt-in): L + 2·α + S/B_nvls·2(n−1)/n,
  B_nvls the node's measured NVLS bus bandwidth; other groups and ops fall back to ring.
- auto: per call, the algorithm of least time by the emulator's own cost: each candidate's
  plan for the group alone (without the fold's copies) run by itself on the idle fabric
  (``fabric.alone``), ties to the first of ring, tree, collnet, nvls. NCCL picks by its
  tuning model (tuning.py) instead, whose per-algorithm times differ from the flows'
  (docs/guides/fabrics-physics.md compares them); picking by the cost that the run then
  pays keeps auto the fastest of the candidates, so more bandwidth or fewer bytes never
  make it slower. The protocol reported is NCCL's best for the algorithm picked.

A pipelined ring moves at the pace of its slowest hop, so one ring channel is one
flow over every hop of the ring at one common rate. A group spanning several
nodes runs k channels (NCCL's rings, one per NIC rail), k the members on its
smallest node (as many as the smaller side allows), each carrying S/k; channel c
enters each node at its c-th local member and visits the node's other members.

With symmetry folding, the flows of the representative instance also carry the
links of every symmetric copy of it (each distinct image of the group under the
fold's translations), with multiplicity, so shared links see the whole load. A direct all-to-all
on a group the fold maps onto itself keeps one flow per orbit of its flows (orbits.py).
"""
from __future__ import annotations

import itertools
from itertools import compress, repeat
from operator import is_, itemgetter
from typing import Callable

from emulator.network import dispatch as moe_dispatch
from emulator.network import tree, tuning
from emulator.network.compression import compress_plans
from emulator.network.flows import FlowSpec, Plan
from emulator.network.orbits import direct_orbits
from emulator.network.raw_plan import Hop, RawFlow, RawPlan, StepCosts
from emulator.network.routing import Route, Router
from emulator.network.slack import slack_links
from emulator.program import Fold, FoldRefused, parse_dispatch_op

# An NCCL all-to-all is n send/recv pairs (NVIDIA/nccl @ 5067397c, src/enqueue.cc: ncclAlltoAll appends a
# send and a recv per rank, lines 3070-3079), and its latency grows with the peers. NCCL's own baseline
# in contrib/custom_algos/alltoall/README.md (same commit, "Performance", NCCL_baseline column, 16 B per
# pair, CUDA graph, 4 CTAs): 8 GB200 11.75 us, 32 GB200 28.20 us: (28.20 − 11.75)/(32 − 8) = 0.685 us per
# added peer. With gb200-nvl72's launch (6.05 us) and step (1.69 us) a flow's latency L + α + (n − 2)·p
# gives 11.85 and 28.29 us. ASSUMPTION: the same cost per peer on other GPUs and for peers across nodes
# (the rows are one NVLink domain); the XLA table's sm_90 all-to-alls (../shared/calibration/h100/nccl.csv,
# 2 KB to 1 MB, 8 GPUs) are slower still (median 37.3 us, executable overhead included).
ALLTOALL_PEER_S = (28.20e-6 - 11.75e-6) / (32 - 8)

PlanKey = tuple[str, tuple[int, ...], int]  # (op, group, root); op "p2p" with group (src, dst) for a transfer
CacheKey = tuple[str, tuple[int, ...], int, str]  # a PlanKey and the algorithm that builds it
Algorithm = Callable[["CollectiveModel", str, tuple[int, ...], int], RawPlan]


class _Acc:
    """Accumulates the weighted links of one flow."""

    __slots__ = ("w",)

    def __init__(self) -> None:
        self.w: dict[int, float] = {}

    def add(self, links: tuple[int, ...], weights: tuple[float, ...], scale: float = 1.0) -> None:
        w = self.w
        get = w.get
        if scale == 1.0:  # x · 1.0 is x exactly: the same sums, without the product
            for l, x in zip(links, weights):
                w[l] = get(l, 0.0) + x
            return
        for l, x in zip(links, weights):
            w[l] = get(l, 0.0) + x * scale

    def most(self, links: tuple[int, ...], weights: tuple[float, ...], scale: float = 1.0) -> None:
        w = self.w
        for l, x in zip(links, weights):
            w[l] = max(w.get(l, 0.0), x * scale)

    def freeze(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        links = tuple(sorted(self.w))
        return links, tuple(map(self.w.__getitem__, links))


def _unscaled(legs: list[list[Hop]]) -> bool:
    """Whether every hop of ``legs`` has scale 1.0."""
    return all(map((1.0).__eq__, itertools.chain.from_iterable([map(itemgetter(2), hops) for hops in legs])))


def _disjoint_sum(routes: list[Route]) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
    """The links of ``routes`` (sorted) with their weights, where no link is on two of them; None
    where one is (then ``_Acc`` sums them in order). Built at C speed (zip, dict): with every link
    on one route, ``_Acc`` would give each the sum 0.0 + w, which is w exactly (weights are
    positive shares), so both give the same tuples bit for bit."""
    links = list(itertools.chain.from_iterable([r[0] for r in routes]))
    w = dict(zip(links, itertools.chain.from_iterable([r[1] for r in routes])))
    if len(w) != len(links):
        return None
    out = tuple(sorted(w))
    return out, tuple(map(w.__getitem__, out))


class CollectiveModel:
    """Turns collectives and point-to-point transfers into flow plans (memoised)."""

    def __init__(self, router: Router, node_of: Callable[[int], int], steps: StepCosts,
                 algorithm: str = "ring", fold: Fold | None = None,
                 hardware: tuning.Hardware | None = None, spread: str = "refuse") -> None:
        if spread not in ("refuse", "least", "greatest"):
            raise ValueError(f"unknown spread {spread!r}; known: refuse, least, greatest")
        if algorithm not in ("auto", *ALGORITHMS):
            raise ValueError(f"unknown collective algorithm {algorithm!r}; known: auto, {', '.join(ALGORITHMS)}")
        self.router = router
        self.node_of = node_of
        self.steps = steps
        self.algorithm = algorithm
        self.fold = fold
        self.hardware = hardware  # the tuning model's view of the nodes (None: custom graph)
        # a fold in effect whose copies of a flow have other latencies: "refuse" it (FoldRefused), or
        # give the flow the "least" or the "greatest" of its copies' (bounds: emulator.run.simulation)
        self.spread = spread
        self._cache: dict[CacheKey, Plan] = {}  # the plans in use (compressed once prepared)
        self._raw_plans: dict[CacheKey, Plan] = {}  # as built, before compression
        self._frozen = False
        self.link_alias: dict[int, int] = {}  # link → the link compression kept for it
        self._slack: set[int] | None = set()  # ``slack``; None: not worked out yet
        self._flows: list[Plan] = []  # the prepared plans as built (``slack`` is found on them)
        self._capacity: list[float] = []
        self._calls: dict[tuple[object, ...], Plan] = {}  # (op, group, root[, nbytes with auto]) → its plan
        self._candidates: dict[tuple[str, tuple[int, ...]], tuple[str, ...]] = {}
        self._choices: dict[tuple[str, tuple[int, ...], float], tuple[str, str]] = {}
        self._own_plans: dict[tuple[str, tuple[int, ...], str], Plan] = {}  # (op, group, algo) → plan alone
        self._alphas: dict[tuple[int, int], float] = {}  # (a, b) → α of one step a→b

    # -- public ---------------------------------------------------------------
    @property
    def slack(self) -> set[int]:
        """The kept links that no mix of the prepared plans' flows can fill (``emulator.network.slack``),
        worked out on first use (a run whose communication is all private needs none: pure DP 8192
        spent 0.1 s, a sixth of its run, on its ring's)."""
        if self._slack is None:
            self._slack = slack_links((f for plan in self._flows for phase in plan for f in phase),
                                      self.router.topo.links, self._capacity, self.link_alias)
        return self._slack

    def collective(self, op: str, group: tuple[int, ...], root: int = -1, nbytes: float = 0.0) -> Plan:
        """The flow plan of collective ``op`` of ``nbytes`` on ``group`` (world ranks, sorted) from
        ``root``. The size matters only to ``auto``, which picks the algorithm per call."""
        call = (op, group, root, nbytes) if self.algorithm == "auto" else (op, group, root)
        plan = self._calls.get(call)  # one lookup per call on the hot path
        if plan is None:
            key = (op, group, root, self.algorithm_for(op, group, nbytes))
            plan = self._cache.get(key)
            if plan is None:
                if self._frozen:
                    raise RuntimeError(f"collective plan {key} was not prepared before the run")
                plan = self._cache[key] = self._raw_plans[key] = self._folded(key)
            self._calls[call] = plan
        return plan

    def p2p(self, src: int, dst: int) -> Plan:
        """The flow plan of one transfer src → dst."""
        return self.collective("p2p", (src, dst), src)

    def prepare(self, keys: list[PlanKey], capacity: list[float]) -> None:
        """Build every plan a program will need, then compress their links together
        (``emulator.network.compression``). ``keys`` are (op, group, root), with
        op "p2p" and group (src, dst) for point-to-point; with ``auto``, the plan of every
        algorithm it may pick for them. No plan may be asked for afterwards that was not
        prepared: it could break the link equivalences."""
        for op, group, root in keys:
            for algo in self.candidates(op, group):
                key = (op, group, root, algo)
                if key not in self._raw_plans:
                    self._raw_plans[key] = self._folded(key)
        # always from the uncompressed plans: a link equivalent within earlier plans need not
        # be within the new set (the model is reused across engines by `collective` and `live`)
        order = sorted(self._raw_plans, key=lambda k: (repr(k[:3]), k[3]))
        raw = [self._raw_plans[k] for k in order]
        compressed, self.link_alias = compress_plans(raw, capacity)
        self._flows, self._capacity, self._slack = raw, capacity, None
        self._cache = dict(zip(order, compressed))
        self._calls = {}
        self._frozen = True

    def plans(self, op: str, group: tuple[int, ...], root: int = -1) -> list[Plan]:
        """Every prepared plan ``op`` on ``group`` may run (one per algorithm it may pick)."""
        return [self._cache[(op, group, root, algo)] for algo in self.candidates(op, group)]

    # -- the choice of algorithm ------------------------------------------------
    def candidates(self, op: str, group: tuple[int, ...]) -> tuple[str, ...]:
        """The algorithms that may run ``op`` on ``group``: the fixed one (after its fallbacks),
        or, with ``auto``, each that NCCL's tuning model may pick and the emulator can build."""
        key = (op, group)
        out = self._candidates.get(key)
        if out is None:
            if op == "p2p":
                out = ("p2p",)
            elif self.algorithm != "auto":
                out = (self._fixed(op, group),)
            else:
                out = self._auto_candidates(op, group)
            self._candidates[key] = out
        return out

    def algorithm_for(self, op: str, group: tuple[int, ...], nbytes: float) -> str:
        """The algorithm that runs one call of ``op`` on ``group`` of ``nbytes``."""
        algos = self.candidates(op, group)
        if len(algos) == 1:
            return algos[0]
        return self.choice(op, group, nbytes)[0]

    def choice(self, op: str, group: tuple[int, ...], nbytes: float) -> tuple[str, str]:
        """(algorithm, NCCL protocol) of one call: the candidate of least own time (``own_time``;
        ties to the first), and NCCL's best protocol for it ("" where NCCL has no table: all-to-all,
        point-to-point, hierarchical, custom graphs). The emulator does not model protocols: the
        flows use the calibrated α and β."""
        key = (op, group, nbytes)
        out = self._choices.get(key)
        if out is None:
            algos = self.candidates(op, group)
            best = algos[0]
            if len(algos) > 1:
                times = [self.own_time(op, group, algo, nbytes) for algo in algos]
                best = algos[times.index(min(times))]
            out = (best, self._protocol(op, group, best, nbytes))
            self._choices[key] = out
        return out

    def own_time(self, op: str, group: tuple[int, ...], algo: str, nbytes: float) -> float:
        """The emulator's time (s) of ``op`` of ``nbytes`` on ``group`` by ``algo``, alone on the idle
        fabric: its plan for the group alone (no fold copies, so folding cannot change a choice)."""
        from emulator.network.fabric import alone  # SimPy: only where a choice is made

        plan = self._own_plans.get((op, group, algo))
        if plan is None:
            plan = self._own_plans[op, group, algo] = self._folded((op, group, -1, algo), copies=False)
        return alone(plan, nbytes, self.router.topo.capacity).duration

    def _protocol(self, op: str, group: tuple[int, ...], algo: str, nbytes: float) -> str:
        """NCCL's best protocol for ``algo`` (tuning.py); "" where NCCL has no table for it."""
        comm = self._comm(group)
        if comm is None or self.hardware is None or algo not in tuning.NAMES.values() or op in ("p2p", "all_to_all"):
            return ""
        try:
            return tuning.choose(op, nbytes, comm, self.hardware, (algo,)).protocol
        except ValueError:  # NCCL would not run it (NVLS before Hopper, say): the emulator still does
            return ""

    def _fixed(self, op: str, group: tuple[int, ...]) -> str:
        """The configured algorithm, or the ring where it does not apply to this op or group."""
        algo = self.algorithm
        if len(group) < 2:
            return "ring"
        if parse_dispatch_op(op) is not None:
            return "dispatch"
        if op == "all_to_all" or algo == "direct":
            return "direct" if op == "all_to_all" else "ring"
        if algo in ("hierarchical", "collnet") and (op != "all_reduce" or not self._regular(group)):
            return "ring"
        if algo == "collnet" and (self.hardware is None or not self.hardware.sharp):
            return "ring"
        if algo == "tree" and (op != "all_reduce" or self.node_of(group[0]) < 0):
            return "ring"
        if algo == "nvls" and (op != "all_reduce" or not self.steps.nvls or len(self.by_node(group)) > 1
                               or self.node_of(group[0]) < 0):
            return "ring"
        return algo

    def _auto_candidates(self, op: str, group: tuple[int, ...]) -> tuple[str, ...]:
        if len(group) < 2:
            return ("ring",)
        if parse_dispatch_op(op) is not None:
            return ("dispatch",)
        if op == "all_to_all":
            return ("direct",)
        if op != "all_reduce" or self.hardware is None or self.node_of(group[0]) < 0:
            return ("ring",)
        out = ["ring", "tree"]
        if self.hardware.sharp and self._regular(group):
            out.append("collnet")
        if self.steps.nvls and len(self.by_node(group)) == 1:
            out.append("nvls")
        return tuple(out)

    def _comm(self, group: tuple[int, ...]) -> tuning.Comm | None:
        if self.hardware is None or len(group) < 2 or self.node_of(group[0]) < 0:
            return None
        return tuning.comm_of(self.hardware, [len(p) for p in self.by_node(group)])

    # -- construction ---------------------------------------------------------
    def _raw(self, op: str, group: tuple[int, ...], root: int, algo: str) -> RawPlan:
        """Phases of flows, each flow as (hops [(src, dst, scale)], volume, latency, merged hops)."""
        if op == "p2p":
            a, b = group
            lat = self.steps.launch + self.alpha(a, b)
            return [[([(a, b, 1.0)], 1.0, lat, [])]]
        if len(group) < 2:
            return []
        return ALGORITHMS[algo](self, op, group, root)

    def _folded(self, key: CacheKey, copies: bool = True) -> Plan:
        """The routed plan of ``key``; with a fold (and ``copies``), each flow also carries its symmetric
        copies' links."""
        op, group, root, algo = key
        raw = self._raw(op, group, root, algo)
        images = [raw]
        fold = self.fold if copies else None
        if fold is not None and fold.copies > 1:
            seen: set[tuple[int, ...] | frozenset[int]] = {tuple(group) if op == "p2p" else frozenset(group)}
            members = list(group) + ([root] if root >= 0 else [])
            for row in fold.orbit(members, len(group), ordered=op == "p2p"):
                img = row[:len(group)]
                ident = tuple(img) if op == "p2p" else frozenset(img)
                if ident in seen:
                    continue
                seen.add(ident)
                iroot = row[-1] if root >= 0 else -1
                igroup = tuple(img) if op == "p2p" else tuple(sorted(img))
                image = self._raw(op, igroup, iroot, algo)
                if [len(ph) for ph in image] != [len(ph) for ph in raw]:
                    raise RuntimeError(f"folding: the copy {igroup} of {op} {group} is not symmetric to it")
                if fold.checked and self.spread == "refuse":
                    _same_latency(op, group, igroup, raw, image)
                images.append(image)
            contested = getattr(fold, "contested", None)  # several jobs (folding.JobsFold)
            if contested is not None and len(images) > 1 and contested(group[0]):
                self._same_load(op, group, images, contested(group[0]), getattr(fold, "last", -1))
        plan: Plan = []
        route = self.router.route
        # a direct all-to-all whose group the fold maps onto itself: one flow per orbit (orbits.py); not
        # with a fold in effect only, whose copies may differ in latency
        orbits = None
        if fold is not None and fold.copies > 1 and not fold.checked and op == "all_to_all" and len(raw) == 1:
            orbits = direct_orbits(fold, group, len(raw[0]))
        for p, phase in enumerate(raw):
            out = []
            for kin in orbits if orbits is not None else [[f] for f in range(len(phase))]:
                f = kin[0]
                _hops, volume, latency, merged = phase[f]
                if self.spread != "refuse" and len(images) > 1:  # the least or greatest of its copies'
                    latency = (min if self.spread == "least" else max)(copy[p][g][2] for copy in images
                                                                       for g in kin)
                legs = [copy[p][g][0] for copy in images for g in kin]
                if not merged and _unscaled(legs):
                    fast = _disjoint_sum(self.router.routes([(a, b) for hops in legs for a, b, _s in hops]))
                    if fast is not None:  # no link on two hops (a ring's channel): no sums to make
                        out.append(FlowSpec(*fast, volume, latency))
                        continue
                acc = _Acc()
                add = acc.add
                for copy in images:
                    for g in kin:
                        for a, b, scale in copy[p][g][0]:
                            links, weights, _lat = route(a, b)
                            add(links, weights, scale)
                    if merged:
                        one = _Acc()
                        for a, b, scale in copy[p][f][3]:
                            links, weights, _lat = route(a, b)
                            one.most(links, weights, scale)
                        acc.add(*one.freeze())
                links, weights = acc.freeze()
                out.append(FlowSpec(links, weights, volume, latency))
            plan.append(out)
        return plan

    def _same_load(self, op: str, group: tuple[int, ...], images: list[RawPlan], links: frozenset[int],
                   job: int) -> None:
        """Several jobs (``folding.JobsFold``): every copy of each flow puts the same load on the links
        ``links`` that other jobs use, or the job's fold is refused there (FoldRefused; the fold's
        ``last`` names the job)."""
        route = self.router.route
        for p, phase in enumerate(images[0]):
            for f in range(len(phase)):
                first: dict[int, float] | None = None
                for copy in images:
                    hops, _v, _lat, merged = copy[p][f]
                    acc = _Acc()
                    for a, b, scale in hops:
                        acc.add(*route(a, b)[:2], scale)
                    if merged:
                        one = _Acc()
                        for a, b, scale in merged:
                            one.most(*route(a, b)[:2], scale)
                        acc.add(*one.freeze())
                    load = {link: w for link, w in acc.w.items() if link in links}
                    if first is None:
                        first = load
                    elif load != first:
                        raise FoldRefused(f"job {job}: {op} on {group[:4]}{'...' if len(group) > 4 else ''}: its "
                                                  "copies load the links of other jobs unlike")

    # -- helpers --------------------------------------------------------------
    def alpha(self, a: int, b: int) -> float:
        """One step a→b: path latency plus the software step latency of its class (memoised: the
        same hop is a step of every collective on its group, and of each of its symmetric copies)."""
        out = self._alphas.get((a, b))
        if out is None:
            lat = self.router.route(a, b)[2]
            na, nb = self.node_of(a), self.node_of(b)
            out = lat if na < 0 else lat + (self.steps.intra if na == nb else self.steps.inter)
            self._alphas[a, b] = out
        return out

    def _alphas_of(self, src: list[int], dst: list[int]) -> list[float]:
        """``alpha(src[i], dst[i])`` of each i (the memoised ones looked up at C speed)."""
        pairs = list(zip(src, dst))
        out: list[float | None] = list(map(self._alphas.get, pairs))
        new = list(compress(range(len(out)), map(is_, out, repeat(None))))  # found at C speed
        if new:
            todo = list(dict.fromkeys([pairs[i] for i in new]))
            routes = self.router.routes(todo)  # routed together (Router._prime)
            src_nodes = list(map(self.node_of, [a for a, _b in todo]))
            dst_nodes = list(map(self.node_of, [b for _a, b in todo]))
            intra, inter = self.steps.intra, self.steps.inter
            for pair, r, na, nb in zip(todo, routes, src_nodes, dst_nodes):  # as _alpha
                self._alphas[pair] = r[2] if na < 0 else r[2] + (intra if na == nb else inter)
            for i in new:
                out[i] = self._alphas[pairs[i]]
        return out  # type: ignore[return-value]  # no None is left

    def by_node(self, group: tuple[int, ...]) -> list[list[int]]:
        nodes: dict[int, list[int]] = {}
        for r in group:
            nodes.setdefault(self.node_of(r), []).append(r)
        return [nodes[n] for n in sorted(nodes)]

    def _regular(self, group: tuple[int, ...]) -> bool:
        per = self.by_node(group)
        return len(per) > 1 and len({len(p) for p in per}) == 1 and self.node_of(group[0]) >= 0

    def rings(self, group: tuple[int, ...]) -> list[list[int]]:
        """The ring channels of a group: one ring, or, across nodes, one per local position of the
        smallest node (NCCL uses as many channels as the smaller side allows)."""
        per = self.by_node(group)
        k = min(len(p) for p in per)
        if len(per) == 1 or self.node_of(group[0]) < 0 or k == 1:
            return [list(group)]
        return [[r for local in per for r in local[c:] + local[:c]] for c in range(k)]

    def _ring_flows(self, ring: list[int], volume: float, steps: int) -> RawFlow:
        """One ring channel over ``ring``: every hop, at the pace of the slowest (``steps`` steps of it)."""
        nxt = ring[1:] + ring[:1]
        hops = list(zip(ring, nxt, repeat(1.0)))
        alpha = max(self._alphas_of(ring, nxt))
        return hops, volume, self.steps.launch + steps * alpha, []


def _same_latency(op: str, group: tuple[int, ...], copy: tuple[int, ...], raw: RawPlan, image: RawPlan) -> None:
    """A fold in effect (``Fold.checked``) holds only where every copy of a plan takes the same time
    as the plan: the same latency on every flow (the fabric's bandwidth is checked by the fold)."""
    for phase, other in zip(raw, image):
        for flow, twin in zip(phase, other):
            if flow[2] != twin[2]:
                raise FoldRefused(f"{op} on {copy[:4]}{'...' if len(copy) > 4 else ''} has latency {twin[2]:.6g} s, "
                                  f"its representative on {group[:4]}{'...' if len(group) > 4 else ''} {flow[2]:.6g} s")


def ring_factors(op: str, n: int) -> tuple[float, int]:
    """(volume factor, steps) of a ring ``op`` on n members: all-reduce 2(n−1)/n of the buffer in
    2(n−1) steps; reduce-scatter and all-gather (n−1)/n in n−1 (pure; the closed-form estimate
    of emulator/studies/rank.py prices rings with it too)."""
    return (2.0 * (n - 1) / n, 2 * (n - 1)) if op == "all_reduce" else ((n - 1) / n, n - 1)


def ring(model: CollectiveModel, op: str, group: tuple[int, ...], root: int) -> RawPlan:
    """Ring reduce-scatter, all-gather, all-reduce or broadcast (one channel per local position across nodes)."""
    n = len(group)
    if op == "broadcast":
        return ring_broadcast(model, group, root)
    if op == "all_to_all":
        return direct(model, op, group, root)
    factor, steps = ring_factors(op, n)
    rings = model.rings(group)
    k = len(rings)
    return [[model._ring_flows(r, factor / k, steps) for r in rings]]


def ring_broadcast(model: CollectiveModel, group: tuple[int, ...], root: int) -> RawPlan:
    """A pipelined chain from the root along each ring channel (NCCL's ring broadcast), S/k on each."""
    rings = model.rings(group)
    flows: list[RawFlow] = []
    for order in rings:
        if root in order:
            i = order.index(root)
            order = order[i:] + order[:i]
        hops = [(order[i], order[i + 1], 1.0) for i in range(len(order) - 1)]
        alpha = max(model.alpha(a, b) for a, b, _ in hops)
        flows.append((hops, 1.0 / len(rings), model.steps.launch + (len(order) - 1) * alpha, []))
    return [flows]


def direct(model: CollectiveModel, op: str, group: tuple[int, ...], root: int) -> RawPlan:
    """All-to-all as one flow per ordered pair (other ops: ring)."""
    if op != "all_to_all":
        return ring(model, op, group, root)
    n = len(group)
    peers = peer_latency(model.steps, n)
    flows: list[RawFlow] = []
    for a in group:
        for b in group:
            if a != b:
                flows.append(([(a, b, 1.0)], 1.0 / n, model.steps.launch + model.alpha(a, b) + peers, []))
    return [flows]


def peer_latency(steps: StepCosts, n: int) -> float:
    """An NCCL all-to-all's latency for its peers beyond the first, (n − 2)·p (``ALLTOALL_PEER_S``)."""
    return max(0, n - 2) * steps.peer


def double_tree(model: CollectiveModel, op: str, group: tuple[int, ...], root: int) -> RawPlan:
    """NCCL's tree all-reduce: per channel (one per local position of the smallest node), two trees
    over the nodes (tree.py), each carrying S/(2k); inside a node a chain from the channel's entry
    member through the node's others. Reduce (up) and broadcast (down) are pipelined: one flow per
    (channel, tree) over every edge, both ways, at one rate; latency L + 2·(chain α + depth α)."""
    per = model.by_node(group)
    m, k = len(per), min(len(p) for p in per)
    flows: list[RawFlow] = []
    for c in range(k):
        chains = [local[c:] + local[:c] for local in per]
        intra: list[Hop] = []
        for chain in chains:
            for a, b in zip(chain, chain[1:]):
                intra += [(a, b, 1.0), (b, a, 1.0)]
        chain_alpha = max((model.alpha(a, b) for a, b, _ in intra), default=0.0)
        chain_steps = max(len(chain) for chain in chains) - 1
        for t in (0, 1):
            parent = tree.parents(m, t)
            inter: list[Hop] = []
            for i, p in enumerate(parent):
                if p >= 0:
                    a, b = chains[i][0], chains[p][0]
                    inter += [(a, b, 1.0), (b, a, 1.0)]
            inter_alpha = max((model.alpha(a, b) for a, b, _ in inter), default=0.0)
            lat = model.steps.launch + 2 * (chain_steps * chain_alpha + tree.depth(parent) * inter_alpha)
            flows.append((intra + inter, 1.0 / (2 * k), lat, []))
    return [flows]


def collnet(model: CollectiveModel, op: str, group: tuple[int, ...], root: int) -> RawPlan:
    """In-network all-reduce (SHARP, NCCL's CollNet Direct), pipelined: per local position c (k of
    them), every GPU of a node sends its S/k share to the node's c-th member (reduce-scatter), which
    sends it up the switch tree and gets the sum back (routes to the first node's c-th member and
    back, merged: each link once each way, the switches reduce), then hands it to the node's other
    GPUs (all-gather). One flow per c carries S/k over all of it at one rate; latency
    L + 2·(α inside the node + α to the first node)."""
    per = model.by_node(group)
    k = len(per[0])
    flows: list[RawFlow] = []
    for c in range(k):
        heads = [local[c] for local in per]
        intra = [h for local in per for x in local if x != local[c] for h in ((x, local[c], 1.0), (local[c], x, 1.0))]
        up = [h for x in heads[1:] for h in ((x, heads[0], 1.0), (heads[0], x, 1.0))]
        a_intra = max((model.alpha(a, b) for a, b, _ in intra), default=0.0)
        a_inter = max(model.alpha(a, b) for a, b, _ in up)
        flows.append((intra, 1.0 / k, model.steps.launch + 2 * (a_intra + a_inter), up))
    return [flows]


def hierarchical(model: CollectiveModel, op: str, group: tuple[int, ...], root: int) -> RawPlan:
    """Reduce-scatter in each node, all-reduce across nodes per local position, all-gather."""
    per = model.by_node(group)
    k, m = len(per[0]), len(per)
    rs_factor, rs_steps = (k - 1) / k, k - 1
    phase1 = [model._ring_flows(local, rs_factor, rs_steps) for local in per] if k > 1 else []
    ar_factor = 2.0 * (m - 1) / m / k
    phase2 = [model._ring_flows([local[c] for local in per], ar_factor, 2 * (m - 1)) for c in range(k)]
    phases = [phase1, phase2, list(phase1)] if k > 1 else [phase2]
    return phases


def nvls(model: CollectiveModel, op: str, group: tuple[int, ...], root: int) -> RawPlan:
    """All-reduce by NVLink SHARP inside one node: every GPU sends its buffer to the switch,
    which reduces it and multicasts the result back. Per GPU, S up and S down (a ring moves
    2(n-1)/n·S), in two steps. The volume is set so that a large all-reduce reaches the node's
    measured NVLS bus bandwidth: 2(n-1)/n · S / t = nvls_busbw with t = S·volume / capacity,
    volume = 2(n-1)/n · capacity / nvls_busbw. One flow per GPU over its uplink and the next
    GPU's downlink carries that volume on every port once."""
    n = len(group)
    return [[model._ring_flows(list(group), 2.0 * (n - 1) / n * model.steps.nvls, 2)]]


ALGORITHMS: dict[str, Algorithm] = {
    "ring": ring,
    "tree": double_tree,
    "collnet": collnet,
    "direct": direct,
    "hierarchical": hierarchical,
    "nvls": nvls,
    "dispatch": moe_dispatch.dispatch,  # MoE dispatch with routing-dependent sizes (dispatch.py)
}

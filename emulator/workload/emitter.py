"""The emitter: how one rank's step lists become ops (the builder's lower half).

A step list (a layer pass, a segment of one, a weight-gradient part: workload/layer.py) is cut once
into a *recipe*, the ops it makes in order (``_recipe``): each communication, and each run of kernels
fused into one compute op (``simulation.detail``: layer) with what it waits for. The recipe is then
emitted op by op, or as one block op (``Op.parts``) where nothing but its start decides when its parts
run. Where the host is modelled (workload/host.py), each list's issuing becomes an op on the ``cpu``
stream that the next list's first op waits for. Which lists run when, and on which schedule, is the
builder's (builder.py).

May import: emulator.program, emulator.devices, emulator.workload (not the builder).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emulator.devices import compute
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Op, Part
from emulator.workload import host as H
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload.plan import Plan

__all__ = ["UnitTag", "Emitter"]


@dataclass(frozen=True, slots=True)
class UnitTag:
    """What every op of one unit (a layer's forward or backward in one task) is tagged with."""

    prefix: str  # of the op names, e.g. "mb3.layer7.fwd."
    mb: int
    stage: int  # the virtual stage
    layer: int
    key: int = -1  # the unit's tag key (micro-batch, stage, layer, direction); CP ring tags derive from it


# a compute op's cost: (name, duration, flops, bytes, category, seconds from measured,
# interpolated and roofline kernels)
_Cost = tuple[str, float, float, float, str, tuple[float, float, float]]
# one op of a step list's recipe: (the comm, None, (), False) or (None, compute cost, comm indexes
# waited for, whether the unit's deps are waited for)
_Action = tuple["Ly.Comm | None", "_Cost | None", tuple[int, ...], bool]


class Emitter:
    """Emits one rank's step lists as ops into a shared list (``ops``, ids from ``next_id``)."""

    def __init__(self, plan: Plan, rank: int, ops: list[Op], next_id: list[int], blocks: bool = False) -> None:
        self.plan, self.rank, self.ops, self.next_id = plan, rank, ops, next_id
        self.blocks = blocks  # emit a unit as one block op where it can be (Op.parts)
        self._parts: dict[int, tuple[list[Ly.Step], tuple[Part, ...] | None]] = {}  # per step list
        self._sum_of: dict[int, tuple[float, float, tuple[float, ...]]] = {}  # per parts tuple (kept in _parts)
        self.lo = plan.layout
        self.c = self.lo.coords(rank)
        node = plan.sc.cluster.node
        assert node is not None  # make_plan checked it
        self.gpu = compute.at_precision(node.gpu, plan.sc.training.precision)  # GEMMs at the precision's peak
        self.detail = plan.sc.simulation.detail
        self.last_compute: int | None = None
        self.tp = self.lo.tp_group(rank)
        self.ep = self.lo.ep_group(rank)
        self.etp = self.lo.etp_group(rank)  # the experts' tensor-parallel group (MoE parallel folding)
        self.cp = self.lo.cp_group(rank)  # context parallelism's all-to-alls (cp_comm_type a2a)
        # cp_comm_type a2a+p2p: the all-to-all level, this rank's run of a consecutive CP ranks (the CP group is
        # in CP order: a rank grows with its CP coordinate), and the ring's step, a ranks along CP
        hier = plan.sc.parallel.hierarchical_context_parallel_sizes if plan.sc.parallel.cp_comm_type == "a2a+p2p" \
            else None
        self._ring_stride = hier[0] if hier else 1
        first = self.lo.coords(rank)["cp"] // self._ring_stride * self._ring_stride
        cp_a2a = self.cp[first:first + self._ring_stride]
        self.groups = {"tp": self.tp, "ep": self.ep, "etp": self.etp, "cp": self.cp,  # a layer Comm's, by its group
                       "cp_a2a": cp_a2a}
        self._time_cache: dict[int, tuple[float, str]] = {}
        self._recipes: dict[int, tuple[list[Ly.Step], list[_Action], list[int]]] = {}
        self._carry: list[int] = []
        self._ring_step = 0  # CP ring exchanges emitted so far in the current unit (part of their tags)
        self._halves: dict[int, tuple[list[Ly.Step], list[Ly.Step], list[Ly.Step]]] = {}
        self._segments: dict[int, tuple[list[Ly.Step], tuple[list[Ly.Step], ...] | None]] = {}
        # the host's issuing (host.py): one ``cpu`` op a step list, the next list's first op waiting for it
        self._launch = node.host_launch
        self._captured = H.captured_modules(plan.sc.training.cuda_graph_impl, plan.sc.training.cuda_graph_modules)
        self._issues: dict[int, tuple[list[Ly.Step], H.Issue]] = {}
        self._host_last: int | None = None
        if plan.host_bound is None:
            plan.host_bound = self._host_bound()

    # --- op emission -----------------------------------------------------------------
    def _emit(self, **kw: Any) -> int:
        oid = self.next_id[0]
        self.next_id[0] += 1
        self.ops.append(Op(id=oid, rank=self.rank, **kw))
        return oid

    def _kernel_cost(self, k: Ly.Kernel) -> tuple[float, str]:
        key = id(k)
        if key not in self._time_cache:
            self._time_cache[key] = KC.kernel_cost(k, self.gpu, self.plan.sc.training.precision)
        return self._time_cache[key]

    def _cost(self, kernels: list[Ly.Kernel]) -> _Cost:
        """(name, duration, flops, bytes, category, seconds measured/interpolated/roofline) of one
        compute op made of ``kernels``."""
        name = kernels[0].name if len(kernels) == 1 else f"{kernels[0].name}..{kernels[-1].name}"
        split = {"measured": 0.0, "interpolated": 0.0, "roofline": 0.0}
        for k in kernels:
            t, source = self._kernel_cost(k)
            split[source] += t
        return (name, sum(self._kernel_cost(k)[0] for k in kernels), sum(k.flops for k in kernels),
                sum(k.bytes for k in kernels), kernels[0].category,
                (split["measured"], split["interpolated"], split["roofline"]))

    def _compute(self, kernels: list[Ly.Kernel], deps: list[int], unit: UnitTag) -> int:
        return self._compute_op(self._cost(kernels), deps, unit)

    def _compute_op(self, cost: _Cost, deps: list[int], unit: UnitTag) -> int:
        name, duration, flops, nbytes, category, costed = cost
        oid = self.next_id[0]
        self.next_id[0] = oid + 1
        # positional (Op's field order): the hot path of the build, a third cheaper than keywords
        self.ops.append(Op(oid, self.rank, COMPUTE, "compute", tuple(sorted(set(deps))), unit.prefix + name,
                           duration, flops, nbytes, category, "", (), -1, -1, 0, unit.mb, unit.stage, unit.layer,
                           costed))
        self.last_compute = oid
        return oid

    def _comm(self, st: Ly.Comm, unit: UnitTag) -> list[int]:
        """Emit one layer Comm; returns the op ids the waiting kernel must depend on."""
        deps = () if self.last_compute is None else (self.last_compute,)
        name = f"{unit.prefix}{st.name}"
        if st.collective == "ring":
            common = dict(deps=deps, category="comm", microbatch=unit.mb, stage=unit.stage, layer=unit.layer)
            step = self._ring_stride
            nxt, prv = self.lo.neighbour(self.rank, "cp", step), self.lo.neighbour(self.rank, "cp", -step)
            key = unit.key * self.lo.sizes["cp"] + self._ring_step
            self._ring_step += 1
            tag = key * 4 + 1
            s = self._emit(kind=SEND, stream="cp_send", name=name, bytes=st.bytes, peer=nxt, tag=tag, **common)
            r = self._emit(kind=RECV, stream="cp_recv", name=name, bytes=st.bytes, peer=prv, tag=tag, **common)
            return [s, r]
        group = self.groups[st.group]
        oid = self.next_id[0]
        self.next_id[0] = oid + 1
        self.ops.append(Op(oid, self.rank, COLLECTIVE, st.group, deps, name, None, 0.0, st.bytes, "comm",
                           st.collective, group, -1, -1, 0, unit.mb, unit.stage, unit.layer, ()))
        return [oid]

    # --- the host's issuing (host.py) -------------------------------------------------
    def _issue(self, steps: list[Ly.Step], layer: int) -> H.Issue:
        """The host's seconds to issue ``steps`` of layer ``layer`` (kept per list)."""
        hit = self._issues.get(id(steps))
        if hit is None or hit[0] is not steps:
            moe = M.is_moe_layer(self.plan.model, layer)
            hit = self._issues[id(steps)] = (steps, H.issue_time(steps, self._launch, self._captured, moe,
                                                                  self.plan.sc.parallel.moe_shared_expert_overlap))
        return hit[1]

    def _host_bound(self) -> bool:
        """Whether some step list the builder emits alone takes the host longer to issue than its kernels
        take to run. Where none does, the host finishes issuing each list before the GPU has run it (each
        list's kernels follow the one before on the compute stream), so it never holds the GPU back, and
        no host op is emitted. A token all-to-all emitted alone (``_a2a``) is left out: its launch is not
        counted (ASSUMPTION: one launch beside the layer's dozens)."""
        if self._launch <= 0 or self.plan.sc.training.cuda_graph_impl == "full_iteration" or \
                self.plan.sc.workload.profile is not None:  # a profile's host gaps are its own (profiled.py)
            return False
        return any(self._issue(part, u.layer).total > sum(self._kernel_cost(k)[0] for k in part
                                                          if isinstance(k, Ly.Kernel))
                   for units in self.plan.chunk_units.values() for u in units for steps in (u.fwd, u.bwd)
                   for part in self._pieces(steps))

    def _pieces(self, steps: list[Ly.Step]) -> list[list[Ly.Step]]:
        """The lists ``steps`` may be emitted as: itself, its segments between the token all-to-alls where
        passes are paired (``run_pair``), and each one's input- and weight-gradient parts where backwards
        are split (zero-bubble schedules, delay_wgrad_compute); the empty ones left out."""
        par = self.plan.sc.parallel
        pieces = [steps]
        if par.overlap_moe_expert_parallel_comm or par.schedule in ("dualpipe", "dualpipev"):
            pieces += [seg for seg in self._a2a_segments(steps) or () if len(seg) > 1]
        if par.schedule in ("zb-h1", "zb-v", "dualpipe", "dualpipev") or par.delay_wgrad_compute:
            pieces += [self._backward_part(piece, half) for piece in list(pieces) for half in ("I", "W")]
        return [piece for piece in pieces if piece]

    def _host_issue(self, steps: list[Ly.Step], unit: UnitTag, before: int | None) -> None:
        """The host's op(s) for a list just emitted: its issuing, after the host's previous op (the ``cpu``
        stream is in order); past a host sync, the rest waits for the GPU to have run what came before
        the list (ASSUMPTION: the sync's own point, inside the list, is not an op a block exposes)."""
        issue = self._issue(steps, unit.layer)
        common: dict[str, Any] = dict(kind=COMPUTE, stream="cpu", category="host", microbatch=unit.mb,
                                      stage=unit.stage, layer=unit.layer)
        if issue.before > 0:
            self._host_last = self._emit(name=unit.prefix + "host.issue", duration=issue.before, deps=(), **common)
        if issue.synced:
            self._host_last = self._emit(name=unit.prefix + "host.after_sync", duration=issue.after,
                                         deps=() if before is None else (before,), **common)

    def _emit_steps(self, steps: list[Ly.Step], deps: list[int],
                    unit: UnitTag) -> tuple[int | None, int | None]:
        """Emit a unit's steps (``_emit_gpu_steps``) and, where the host is modelled, its issuing: the
        list's first op waits until the host has issued the list before it (host.py)."""
        if not self.plan.host_bound:
            return self._emit_gpu_steps(steps, deps, unit)
        before = self.last_compute
        if self._host_last is not None:
            deps = [*deps, self._host_last]
        out = self._emit_gpu_steps(steps, deps, unit)
        self._host_issue(steps, unit, before)
        return out

    def _emit_gpu_steps(self, steps: list[Ly.Step], deps: list[int],
                        unit: UnitTag) -> tuple[int | None, int | None]:
        """Emit a unit's steps; returns (first compute op, last op any later work must follow).

        The grouping of a step list into ops (``_recipe``) is the same every time it runs, so it
        is worked out once per list; here only the ops are made, with this unit's ids."""
        self._ring_step = 0  # the unit's CP ring exchanges are numbered from 0
        actions, carry = self._recipe(steps)
        parts = self._block_parts(steps, actions, carry) if self.blocks else None
        if parts is not None:
            return self._emit_block(parts, deps, unit)
        comm_ids: list[list[int]] = []
        first: int | None = None
        # the compute ops are made here rather than by _compute_op (the same op, field for field):
        # the hot loop of the build, 60% of its ops
        append, rank, next_id, prefix = self.ops.append, self.rank, self.next_id, unit.prefix
        mb, stage, layer = unit.mb, unit.stage, unit.layer
        for comm, what, refs, with_deps in actions:
            if what is None:
                assert comm is not None
                comm_ids.append(self._comm(comm, unit))
                continue
            wait = list(deps) if with_deps else []
            for ci in refs:
                wait += comm_ids[ci]
            name, duration, flops, nbytes, category, costed = what
            oid = next_id[0]
            next_id[0] = oid + 1
            append(Op(oid, rank, COMPUTE, "compute", tuple(sorted(set(wait))) if len(wait) > 1 else tuple(wait),
                      prefix + name, duration, flops, nbytes, category, "", (), -1, -1, 0, mb, stage, layer, costed))
            self.last_compute = oid
            if first is None:
                first = oid
        # a comm still running at the end of the unit: the next unit's first kernel waits for it
        self._carry = [i for ci in carry for i in comm_ids[ci]]
        return first, self.last_compute

    def _block_parts(self, steps: list[Ly.Step], actions: list[_Action], carry: list[int]) -> tuple[Part, ...] | None:
        """The parts of the block op a step list makes (``Op.parts``), or None where its ops must be
        emitted one by one: a block starts and ends with a compute op, its communications are
        collectives (no CP ring exchange), and none outlives it (no carry). Worked out once per list."""
        hit = self._parts.get(id(steps))
        if hit is not None and hit[0] is steps:
            return hit[1]
        ok = (not carry and bool(actions) and actions[0][1] is not None and actions[-1][1] is not None
              and all(c is None or c.collective != "ring" for c, _w, _r, _d in actions))
        parts: list[Part] = []
        at: list[int] = []  # comm index → its part
        last = -1  # the latest compute part
        for comm, what, refs, _with_deps in actions if ok else ():
            if what is None:
                assert comm is not None
                group = self.groups[comm.group]
                at.append(len(parts))
                parts.append(Part(COLLECTIVE, comm.group, comm.name, None, 0.0, comm.bytes, "comm", comm.collective,
                                  group, (last,)))
                continue
            name, duration, flops, nbytes, category, costed = what
            last = len(parts)
            parts.append(Part(COMPUTE, "compute", name, duration, flops, nbytes, category, "", (),
                              tuple(sorted({at[ci] for ci in refs})), costed))
        out = tuple(parts) if ok else None
        self._parts[id(steps)] = (steps, out)  # the list is kept: its id stays its own
        return out

    def _emit_block(self, parts: tuple[Part, ...], deps: list[int], unit: UnitTag) -> tuple[int, int]:
        """One block op for a unit's ops (``_block_parts``); it takes their ids, its own being its
        last part's (the op later work waits for). Returns (first part id, block id)."""
        first = self.next_id[0]
        self.next_id[0] = first + len(parts)
        oid = first + len(parts) - 1
        flops, nbytes, costed = self._sums(parts)
        wait = tuple(sorted(set(deps))) if len(deps) > 1 else tuple(deps)  # as the first part's, op by op
        self.ops.append(Op(oid, self.rank, COMPUTE, "compute", wait, unit.prefix, None, flops, nbytes,
                           parts[-1].category, "", (), -1, -1, 0, unit.mb, unit.stage, unit.layer, costed, parts))
        self.last_compute = oid
        self._carry = []
        return first, oid

    def _sums(self, parts: tuple[Part, ...]) -> tuple[float, float, tuple[float, ...]]:
        """A block's FLOPs, its kernels' bytes, and their seconds measured, interpolated and roofline
        (once per block: ``_block_parts`` gives each step list one parts tuple)."""
        hit = self._sum_of.get(id(parts))
        if hit is None:
            costed = [0.0, 0.0, 0.0]
            flops = nbytes = 0.0
            for p in parts:
                flops += p.flops
                if p.kind is COMPUTE:
                    nbytes += p.bytes
                    for j, x in enumerate(p.costed):
                        costed[j] += x
            hit = self._sum_of[id(parts)] = (flops, nbytes, tuple(costed))
        return hit

    def _recipe(self, steps: list[Ly.Step]) -> tuple[list[_Action], list[int]]:
        """The ops a step list makes, in order: each comm, and each group of kernels fused into one
        compute op with its cost and what it waits for (the unit's deps if it is the first, and
        the comms, by their index, whose overlap ended); and the comms still running at the end.

        Kernels join the current group until a comm must be waited for, or (detail: layer) the
        category changes, or (detail: op) always."""
        hit = self._recipes.get(id(steps))
        if hit is not None and hit[0] is steps:
            return hit[1], hit[2]
        actions: list[_Action] = []
        pending: list[tuple[int, int]] = []  # (kernels still allowed to overlap, comm index)
        group: list[Ly.Kernel] = []
        wait: list[int] = []
        with_deps = True
        comms = 0
        for st in steps:
            if isinstance(st, Ly.Comm):
                if group:
                    actions.append((None, self._cost(group), tuple(wait), with_deps))
                    group, wait, with_deps = [], [], False
                actions.append((st, None, (), False))
                pending.append((st.overlap, comms))
                comms += 1
                continue
            must = [ci for left, ci in pending if left == 0]
            pending = [(left - 1, ci) for left, ci in pending if left > 0]
            if group and (must or self.detail == "op" or group[-1].category != st.category):
                actions.append((None, self._cost(group), tuple(wait), with_deps))
                group, wait, with_deps = [], [], False
            wait += must
            group.append(st)
        if group:
            actions.append((None, self._cost(group), tuple(wait), with_deps))
        carry = [ci for _, ci in pending]
        self._recipes[id(steps)] = (steps, actions, carry)  # the list is kept: its id stays its own
        return actions, carry

    def _backward_part(self, steps: list[Ly.Step], phase: str) -> list[Ly.Step]:
        """A split backward's I (input gradient) or W (weight gradient) part of a unit's backward steps:
        W is its weight-gradient kernels (``*.wgrad``, layer.py), I the rest in their order; a comm
        that overlapped a wgrad GEMM overlaps the next I kernel instead. Kept per list, so each part
        keeps its identity (the recipe cache is by list)."""
        hit = self._halves.get(id(steps))
        if hit is None or hit[0] is not steps:
            w: list[Ly.Step] = [st for st in steps if isinstance(st, Ly.Kernel) and st.name.endswith(".wgrad")]
            b = [st for st in steps if not (isinstance(st, Ly.Kernel) and st.name.endswith(".wgrad"))]
            hit = (steps, b, w)
            self._halves[id(steps)] = hit
        return hit[1] if phase == "I" else hit[2]

    def _a2a_segments(self, steps: list[Ly.Step]) -> tuple[list[Ly.Step], ...] | None:
        """A MoE layer pass cut at its two token all-to-alls: (before, first a2a, between, second a2a,
        after), each a2a a one-step list; forward: dispatch then combine, backward: combine_bwd then
        dispatch_bwd (token_dispatch.py). None for a pass without both (a dense layer, ep 1). Kept per list."""
        hit = self._segments.get(id(steps))
        if hit is not None and hit[0] is steps:
            return hit[1]
        cuts = [i for i, st in enumerate(steps) if isinstance(st, Ly.Comm) and st.group == "ep"
                and st.name in ("moe.dispatch", "moe.combine", "moe.combine_bwd", "moe.dispatch_bwd")]
        out: tuple[list[Ly.Step], ...] | None = None
        if len(cuts) == 2:
            a, b = cuts
            out = (steps[:a], [steps[a]], steps[a + 1:b], [steps[b]], steps[b + 1:])
        self._segments[id(steps)] = (steps, out)
        return out

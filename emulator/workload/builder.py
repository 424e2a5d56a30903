"""Workload builder: a Scenario (model × parallelism × schedule) → a Program (per-rank op DAG).

For every simulated rank (all, or the fold's representatives) it walks the rank's
pipeline schedule and emits, per task, the kernels and communications of its model
chunk (:mod:`.layer`), costed by :mod:`emulator.devices.compute`. Groups and peers are
always world ranks (:mod:`.placement`).

Streams (in-order lanes) and what runs on them:
- ``compute``: kernels (``simulation.detail: op``) or fused blocks, one per run of
  kernels between communications, per layer (``detail: layer``);
- ``tp``: TP all-reduce / SP all-gather and reduce-scatter. The kernel after a blocking
  one waits for it; the asynchronous backward ones overlap the next kernel (layer.py);
- ``cp_send`` / ``cp_recv``: the ring attention K/V exchange, one send to the next and
  one receive from the previous CP rank per ring step, overlapping the block's kernel;
- ``ep``: MoE all-to-all dispatch and combine (blocking); ``etp``: with MoE parallel folding, the
  experts' own tensor-parallel all-gather and reduce-scatter around their GEMMs;
- ``pp_send_fwd`` / ``pp_recv_fwd`` (activations) and ``pp_send_bwd`` / ``pp_recv_bwd``
  (gradients): one stream per direction, so each carries messages in the order both
  ends use them (no head-of-line deadlock; a V-shaped schedule's second leg, whose messages go to the
  previous rank, has its own ``pp_*_v`` streams, and its tip, both chunks on the last rank, sends
  nothing). A receive is posted when the compute
  stream reaches the task before the one that consumes it (like Megatron's batched
  send-and-receive calls);
- ``dp``: gradient all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2, Megatron's
  distributed optimizer) in buckets of ``grad_bucket`` bytes over DP×CP, each bucket
  after the last micro-batch's backward of its last layer (``overlap_grad_reduce``) or
  after the whole backward; tied-embedding all-reduce between the first and last stage;
  ZeRO-3's per-layer gradient reduce-scatter;
- ``zero``: parameter all-gathers: ZeRO-1/2 after the optimizer, or, with
  ``overlap_param_gather`` (by default as ``overlap_grad_reduce``), at the start of the
  iteration before each bucket's first forward (the steady state of Megatron's
  --overlap-param-gather: the previous step's gather overlaps this forward);
  ZeRO-3 before every layer's forward and backward, prefetched one layer ahead;
- ``d2h`` / ``h2d`` (``training.fine_grained_activation_offloading``): each layer's offloaded inputs copied to
  host memory after its forward, and back before its backward, issued as the backward layer before it begins
  (fixed-duration copies at the node's ``host_bandwidth``, on the copy engines: no SMs); with
  ``training.cpu_offloading`` the first K layers' whole saved activations, with Transformer Engine's waits
  (cpu_offload.py: layer L − K + i's forward waits for layer i's copy, whose reload is issued as layer
  L − 1 − K + i's backward begins).

Zero-bubble schedules (schedules.py) split some backwards into an input-gradient task, which
sends the gradient on, and a later weight-gradient task of the ``*.wgrad`` kernels, after which the
unit's gradient is ready for the data-parallel reduction. With Megatron-Core's all-to-all overlap
(``parallel.overlap_moe_expert_parallel_comm``) each steady-state forward and the backward after it
are one combined step (``run_pair``): layer by layer, each pass's token all-to-alls run on the
``ep`` stream under the other pass's compute.

Tags are unique per (src, dst): tag = 4·key + class, with key built from micro-batch,
chunk, layer, ring step and direction, and class 0 for pipeline, 1 for CP.
"""
from __future__ import annotations

from emulator.devices import compute
from emulator.meta import ProgramMeta, WorkloadFacts
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Fold, Op, Program, chained
from emulator.scenario.spec import ParallelSpec, Scenario
from emulator.scenario.stages import rank_of, virtual_stage
from emulator.workload import flops as F
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload import muon as MU
from emulator.workload.cpu_offload import finish_before, reload_at
from emulator.workload.cpu_offload import layer_bytes as cpu_layer_bytes
from emulator.workload.cpu_offload import offloaded_layers as cpu_offloaded_layers
from emulator.workload.emitter import Emitter, UnitTag
from emulator.workload.offload import chunk_offload, layer_offload
from emulator.workload.optimizer import adam_step_bytes
from emulator.workload.placement import hsdp_groups
from emulator.workload.plan import ADAM_FLOPS_PER_PARAM, Plan, Unit, make_plan
from emulator.workload.profiled import reshape_plan
from emulator.workload.schedules import Task, combined_steps, dualpipe_steps, dualpipev_steps, schedule


class _RankBuilder(Emitter):
    """Emits the ops of one rank into a shared list: its schedule's tasks, each a run of units whose step
    lists the emitter (emitter.py) turns into ops, then the data-parallel reduction and the optimizer."""

    def __init__(self, plan: Plan, rank: int, ops: list[Op], next_id: list[int], blocks: bool = False) -> None:
        super().__init__(plan, rank, ops, next_id, blocks)
        node = plan.sc.cluster.node
        assert node is not None  # make_plan checked it
        self._peers: dict[int, int] = {}  # virtual stage → this rank's peer there
        self.dpcp = self.lo.dp_cp_group(rank)
        self.edp = self.lo.edp_group(rank)
        # HSDP (parallel.num_distributed_optimizer_instances): the instance's ranks, and this rank's peers in the
        # other instances, of the dense and the expert data-parallel groups
        k = plan.sc.parallel.num_distributed_optimizer_instances
        self.dpcp_in, self.dpcp_out = hsdp_groups(self.dpcp, k, rank)
        self.edp_in, self.edp_out = hsdp_groups(self.edp, k, rank)
        self.grad_ready: dict[tuple[int, str], int] = {}  # (vs, unit) → op id of its last backward
        self.pp_sent: dict[str, int] = {}  # pipeline send stream → its last send so far
        # ZeRO-1/2 overlapped param gathers: each unit's bucket, each bucket's (first unit, stage, bytes), and the
        # op of each issued so far (``_zero_ag``)
        self._ag_bucket: dict[tuple[int, str], int] = {}
        self._ag_plan: list[tuple[Unit, int, float, float]] = []
        self._ag_ops: list[int | None] = []
        self._hsdp_ops: list[int] = []  # HSDP: the gradient shards' reductions across the instances
        self._hsdp_gathered: set[tuple[int, str]] = set()  # HSDP with optim: units whose shards are gathered
        self._z3_last: list[int] = []  # ZeRO-3: the last micro-batch's gradient reduce-scatters
        # fine-grained activation offloading: whether any layer sends anything to the host, the copy rate, each
        # offloaded unit's D2H copy, and the op before the last backward layer began (reloads wait on it)
        self._offloading = any(layer_offload(plan.sc, plan.model))
        # layer-wise CPU offloading (cpu_offload.py): K, the layers, each layer's bytes, and the op before each
        # backward layer began (a reload starts there)
        self._cpu_k = cpu_offloaded_layers(plan.sc)
        self._cpu_bytes = cpu_layer_bytes(plan.sc, plan.model) if self._cpu_k else (0.0, 0.0)
        self._offloading = self._offloading or self._cpu_k > 0
        self._bwd_start: dict[tuple[int, int], int | None] = {}
        self._layer_unit = {u.layer: u.name for units in plan.chunk_units.values() for u in units if u.layer >= 0}
        self._chunk_offload: dict[int, dict[str, float]] = {}  # per virtual stage: unit → bytes it sends
        self._host_bw = node.host_bandwidth
        self._offloaded: dict[tuple[int, int, str], int] = {}
        self._reload_gate: int | None = None
        # Megatron-Core's 1F1B synchronises the device after each batched send and receive (p2p_communication.py
        # @ d98e8a64dd: batch_p2p_sync, on by default; Megatron-LM takes batch_p2p_comm where the schedule is not
        # interleaved): where the host is modelled, it stops there (``_p2p_sync``). The sends since the last stop:
        self._p2p_syncs = bool(plan.host_bound) and plan.sc.parallel.schedule == "1f1b" and self.lo.sizes["pp"] > 1
        self._unsynced: list[int] = []

    # --- tasks ----------------------------------------------------------------------
    def _vs(self, chunk: int) -> int:
        return virtual_stage(chunk, self.c["pp"], self.lo.sizes["pp"], self.plan.v_shape)

    def _peer(self, vs: int) -> int:
        peer = self._peers.get(vs)
        if peer is None:
            stage = rank_of(vs, self.lo.sizes["pp"], self.plan.v_shape)
            peer = self._peers[vs] = self.lo.rank(pp=stage, dp=self.c["dp"], cp=self.c["cp"], tp=self.c["tp"])
        return peer

    def _leg(self, a: int, b: int) -> str:
        """The stream suffix of a message between virtual stages a and b: a V's second leg (both past the
        tip) has its own streams, so that each pipeline stream talks to one peer, in the order both ends
        use it (rank r sends the first leg's activations to r + 1 and the second leg's to r − 1)."""
        return "_v" if self.plan.v_shape and min(a, b) >= self.lo.sizes["pp"] else ""

    def _pp_tag(self, mb: int, vs: int, direction: int) -> int:
        return ((mb * self.lo.sizes["pp"] * self.plan.v + vs) * 2 + direction) * 4

    def _zero3_groups(self, dense: float, expert: float) -> list[tuple[str, tuple[int, ...], float]]:
        """ZeRO-3's collectives of a unit: its dense part over dp·cp and its experts over their expert-data-parallel
        group, as Megatron-FSDP shards an expert parameter group over the expert FSDP group (megatron_fsdp/
        param_and_grad_buffer.py @ d98e8a64dd: ``get_fsdp_group(is_expert_parallel=group.is_expert_param)``);
        with HSDP each within its instance. (name prefix, group, bytes), the experts' only where their group has
        several ranks."""
        out = [("", self.dpcp_in, dense)]
        if expert and len(self.edp_in) > 1:
            out.append(("expert_", self.edp_in, expert))
        return out

    def _zero3_gather(self, unit: Unit, vs: int, mb: int, phase: str, deps: list[int]) -> int:
        """ZeRO-3: the unit's weights (the TP shard) gathered before its pass; the last op. With HSDP's outer
        sharding, the unit's first forward gathers its shards across the instances first (:func:`_hsdp_gather`)."""
        if phase == "F" and self.plan.sc.parallel.outer_dp_sharding_strategy == "optim" \
                and (vs, unit.name) not in self._hsdp_gathered:
            self._hsdp_gathered.add((vs, unit.name))
            deps = deps + self._hsdp_gather(unit, vs, mb, deps)
        last = -1
        for prefix, group, nbytes in self._zero3_groups(*self.plan.gathered(unit)):
            last = self._emit(kind=COLLECTIVE, stream="zero", name=f"mb{mb}.{unit.name}.{phase}.{prefix}zero3_ag",
                              collective="all_gather", group=group, bytes=nbytes, deps=tuple(deps),
                              category="comm", microbatch=mb, stage=vs, layer=unit.layer)
        return last

    def _zero3_reduce(self, unit: Unit, vs: int, mb: int, after: int) -> None:
        """ZeRO-3: the unit's gradient reduce-scatter once its weight gradient is done."""
        g = self.plan.grad_dtype
        inner = [self._emit(kind=COLLECTIVE, stream="dp", name=f"mb{mb}.{unit.name}.{prefix}zero3_rs",
                            collective="reduce_scatter", group=group, bytes=nbytes, deps=(after,), category="comm",
                            microbatch=mb, stage=vs, layer=unit.layer)
                 for prefix, group, nbytes in self._zero3_groups(unit.params * g, unit.expert_params * g)]
        if mb == self.plan.micro - 1:  # the step waits for the last micro-batch's (finish_grad_sync)
            self._z3_last += inner
            if self.plan.sc.parallel.num_distributed_optimizer_instances > 1:
                self._hsdp_reduce(unit, vs, tuple(inner))

    def _weight_task(self, mb: int, chunk: int) -> None:
        """A split backward's W task: the wgrad kernels of the chunk's units, last unit first; no
        pipeline traffic (the input gradient left with I). Each unit's gradient is ready after it."""
        vs = self._vs(chunk)
        for unit in reversed(self.plan.chunk_units[vs]):
            steps = self._backward_part(unit.bwd, "W")
            if not steps:
                continue
            where = UnitTag(prefix=f"mb{mb}.{unit.name}.wgrad.", mb=mb, stage=vs, layer=unit.layer)
            _first, last = self._emit_steps(steps, [], where)
            assert last is not None  # a non-empty W part is kernels only
            self.grad_ready[(vs, unit.name)] = last
            if self.plan.sc.parallel.zero >= 3:
                self._zero3_reduce(unit, vs, mb, last)

    def _edge_layer(self, vs: int, first: bool) -> int:
        """The layer index of virtual stage ``vs``'s first (or last) unit; an empty stage (a layout's "||", which
        Megatron-Core accepts: it receives and passes on the hidden states) takes its model position, the index of
        the next layer."""
        units = self.plan.chunk_units[vs]
        if units:
            return int(units[0 if first else -1].layer)
        return sum(self.plan.chunk_layers[:self.plan.model_stage(vs)])

    def _recv(self, fwd: bool, mb: int, vs: int) -> list[int]:
        """The pipeline receive a task's first unit waits for (activations, or the gradient), if any."""
        p = self.lo.sizes["pp"]
        if not (p > 1 and ((fwd and not self.plan.starts(vs)) or (not fwd and not self.plan.ends(vs)))):
            return []
        src_vs = vs - 1 if fwd else vs + 1
        if self._peer(src_vs) == self.rank:  # the V's tip: both chunks here, in order on the compute stream
            return []
        stream = ("pp_recv_fwd" if fwd else "pp_recv_bwd") + self._leg(vs, src_vs)
        tag = self._pp_tag(mb, src_vs if fwd else vs, 0 if fwd else 1)
        return [self._emit(kind=RECV, stream=stream, name=f"mb{mb}.recv_{'act' if fwd else 'grad'}",
                           bytes=self._pp_bytes(vs - 1 if fwd else vs), peer=self._peer(src_vs), tag=tag,
                           deps=() if self.last_compute is None else (self.last_compute,),
                           category="comm", microbatch=mb, stage=vs, layer=self._edge_layer(vs, True))]

    def _send(self, fwd: bool, mb: int, vs: int) -> None:
        """The pipeline send after a task's last unit (activations on, or the gradient back), if any."""
        p = self.lo.sizes["pp"]
        if not (p > 1 and ((fwd and not self.plan.ends(vs)) or (not fwd and not self.plan.starts(vs)))):
            return
        dst_vs = vs + 1 if fwd else vs - 1
        if self._peer(dst_vs) == self.rank:
            return
        stream = ("pp_send_fwd" if fwd else "pp_send_bwd") + self._leg(vs, dst_vs)
        tag = self._pp_tag(mb, vs if fwd else dst_vs, 0 if fwd else 1)
        self.pp_sent[stream] = self._emit(
            kind=SEND, stream=stream, name=f"mb{mb}.send_{'act' if fwd else 'grad'}",
            bytes=self._pp_bytes(vs if fwd else vs - 1),
            peer=self._peer(dst_vs), tag=tag, deps=(self.last_compute,), category="comm", microbatch=mb,
            stage=vs, layer=self._edge_layer(vs, False))
        if self._p2p_syncs:
            self._unsynced.append(self.pp_sent[stream])

    def _p2p_sync(self, recvs: list[int], fwd: bool, mb: int, vs: int) -> None:
        """The host's stop after a pipeline exchange (``_p2p_syncs``): a zero-time ``cpu`` op that waits for the
        task's receive, the sends since the last stop and the GPU's work so far; the host issues the task's
        lists after it."""
        waits = [*recvs, *self._unsynced, *([self.last_compute] if self.last_compute is not None else [])]
        self._unsynced = []
        if self._p2p_syncs and (recvs or len(waits) > 1):
            name = f"mb{mb}.{'fwd' if fwd else 'bwd'}.host.p2p_sync"
            self._host_last = self._emit(kind=COMPUTE, stream="cpu", name=name, duration=0.0,
                                         deps=tuple(sorted(set(waits))), category="host", microbatch=mb, stage=vs,
                                         layer=self._edge_layer(vs, True))

    def _join(self, carry: list[int], fwd: bool, mb: int, vs: int) -> None:
        """An overlapped comm that outlives the task: a zero-cost join keeps it on the path."""
        if carry:
            self._compute([Ly.Kernel("join", "elementwise", 0.0, 0.0, "bwd" if not fwd else "fwd")],
                          carry, UnitTag(prefix=f"mb{mb}.", mb=mb, stage=vs,
                                          layer=self._edge_layer(vs, False)))

    def _where(self, unit: Unit, fwd: bool, mb: int, vs: int) -> UnitTag:
        V = self.lo.sizes["pp"] * self.plan.v
        stride = self.plan.model.layers + 2 + self.plan.model.mtp_num_layers  # unit.layer: -1 to layers + mtp
        return UnitTag(prefix=f"mb{mb}.{unit.name}.{'fwd' if fwd else 'bwd'}.", mb=mb, stage=vs,
                        layer=unit.layer, key=((mb * V + vs) * stride + unit.layer + 1) * 2 + (0 if fwd else 1))

    # --- fine-grained activation offloading (Megatron-Core fine_grained_activation_offload.py @ d98e8a64dd) ------
    def _offload_bytes(self, unit: Unit, vs: int) -> float:
        """What ``unit`` of virtual stage ``vs`` sends to the host per micro-batch: a transformer layer's (an MTP
        module's as its layer) offloaded inputs, of the chunk's groups that activation_offload_fraction sends
        (offload.py ``chunk_offload``); nothing for the embedding and the head, nor for the loss chunk's last
        layer, whose backward follows its forward at once (Megatron-Core's ``should_bulk_offload`` keeps a group
        whose chunk is the next backward's and that has no group after it)."""
        if not self._offloading:
            return 0.0
        if self._cpu_k:
            if not 0 <= unit.layer < self._cpu_k:
                return 0.0
            return self._cpu_bytes[0] if M.is_moe_layer(self.plan.model, unit.layer) else self._cpu_bytes[1]
        per = self._chunk_offload.get(vs)
        if per is None:
            units = [u for u in self.plan.chunk_units[vs] if u.layer >= 0 and u.name != "head"]
            per = self._chunk_offload[vs] = dict(zip((u.name for u in units), chunk_offload(
                self.plan.sc, self.plan.model, [u.layer for u in units])))
            if units and self.plan.ends(vs):  # its backward follows at once: kept (``should_bulk_offload``)
                per[units[-1].name] = 0.0
        return per.get(unit.name, 0.0)

    def _offload_out(self, unit: Unit, vs: int, mb: int, last: int) -> None:
        """After a layer's forward, its offloaded inputs go to the host on the ``d2h`` copy stream
        (``on_group_commit_forward``: d2h_stream.wait_stream(current), then ``bulk_offload_group``); the compute
        stream does not wait for it (``fine_grained_offloading_max_inflight_offloads`` None)."""
        nbytes = self._offload_bytes(unit, vs)
        if nbytes:
            self._offloaded[(mb, vs, unit.name)] = self._emit(
                kind=COMPUTE, stream="d2h", name=f"mb{mb}.{unit.name}.offload", duration=nbytes / self._host_bw,
                bytes=nbytes, deps=(last,), category="offload", microbatch=mb, stage=vs, layer=unit.layer)

    def _offload_done(self, unit: Unit, vs: int, mb: int) -> list[int]:
        """Layer-wise CPU offloading: layer L − K + i's forward waits for offloaded layer i's copy
        (cpu_offload.py; TE's ``release_activation_forward_gpu_memory``)."""
        i = unit.layer - finish_before(0, self.plan.model.layers, self._cpu_k)  # the layer whose copy it waits for
        if not 0 <= i < self._cpu_k or unit.layer >= self.plan.model.layers:
            return []
        out = self._offloaded.get((mb, vs, self._layer_unit[i]))
        return [] if out is None else [out]

    def _reload(self, unit: Unit, vs: int, mb: int) -> int | None:
        """Before a layer's backward, its inputs come back on the ``h2d`` stream, issued when the backward layer
        before it began (``bulk_reload`` at each group's backward start reloads the next group; a chunk's first
        reloads during the chunk before, ``pre_reload_last_layer``) and after its copy out; its backward waits
        for it (``on_group_commit_backward``: wait_reload_event)."""
        out = self._offloaded.pop((mb, vs, unit.name), None)
        if out is None:
            return None
        nbytes = self._offload_bytes(unit, vs)
        gate = self._reload_gate
        if self._cpu_k:  # TE: as the backward of layer L − 1 − K + i begins
            gate = self._bwd_start.get((mb, reload_at(unit.layer, self.plan.model.layers, self._cpu_k)))
        deps = (out,) if gate is None else (out, gate)
        return self._emit(kind=COMPUTE, stream="h2d", name=f"mb{mb}.{unit.name}.reload",
                          duration=nbytes / self._host_bw, bytes=nbytes, deps=deps, category="offload", microbatch=mb,
                          stage=vs, layer=unit.layer)

    def _reload_before(self, unit: Unit, vs: int, mb: int, deps: list[int]) -> list[int]:
        """``deps`` of a unit's backward, with its reload (``_reload``) where it sent anything; the layer's start
        is where the next layer's reload is issued."""
        if self._cpu_k and 0 <= unit.layer < self.plan.model.layers:
            self._bwd_start[(mb, unit.layer)] = self.last_compute
        reload = self._reload(unit, vs, mb)
        if unit.layer >= 0 and self._offloading:
            self._reload_gate = self.last_compute  # the next layer's reload starts as this one does
        return deps if reload is None else deps + [reload]

    def _backward_done(self, unit: Unit, vs: int, mb: int, last: int | None, split: bool) -> None:
        """A unit's backward has ended at op ``last``: its gradient is ready (unless a W task follows)."""
        assert last is not None  # every unit's backward emits at least one kernel
        if not (split and self._backward_part(unit.bwd, "W")):  # else its W task does this
            self.grad_ready[(vs, unit.name)] = last
            if self.plan.sc.parallel.zero >= 3:
                self._zero3_reduce(unit, vs, mb, last)

    def run_task(self, phase: str, mb: int, chunk: int) -> None:
        if phase == "W":
            self._weight_task(mb, chunk)
            return
        split = phase == "I"  # the input-gradient part of a split backward; its W task follows later
        if split:
            phase = "B"
        vs = self._vs(chunk)
        units = self.plan.chunk_units[vs]
        self._carry = []
        fwd = phase == "F"
        deps = self._recv(fwd, mb, vs)
        self._p2p_sync(deps, fwd, mb, vs)
        order = units if fwd else list(reversed(units))
        zero3 = self.plan.sc.parallel.zero >= 3
        prefetch: dict[int, int] = {}
        if zero3 and order:
            prefetch[0] = self._zero3_gather(order[0], vs, mb, phase, [])
        for i, unit in enumerate(order):
            udeps = deps + self._carry
            if zero3:
                udeps.append(prefetch[i])
            ag = self._zero_ag(vs, unit.name) if fwd else None
            if ag is not None:
                udeps.append(ag)
            if not fwd:
                udeps = self._reload_before(unit, vs, mb, udeps)
            elif self._cpu_k:
                udeps += self._offload_done(unit, vs, mb)
            before = self.last_compute
            steps = unit.fwd if fwd else (self._backward_part(unit.bwd, "I") if split else unit.bwd)
            _first, last = self._emit_steps(steps, udeps, self._where(unit, fwd, mb, vs))
            if fwd and last is not None:
                self._offload_out(unit, vs, mb, last)
            deps = []
            if zero3 and i + 1 < len(order):  # prefetch the next unit's weights during this one
                prefetch[i + 1] = self._zero3_gather(order[i + 1], vs, mb, phase,
                                                     [before] if before is not None else [])
            if not fwd:
                self._backward_done(unit, vs, mb, last, split)
        if not units:  # an empty stage passes the hidden states on: its send waits for its receive
            self._carry = deps
        self._join(self._carry, fwd, mb, vs)
        self._carry = []
        self._send(fwd, mb, vs)

    # --- Megatron-Core's 1F1B all-to-all overlap (overlap_moe_expert_parallel_comm) ----------------
    def _plain(self, unit: Unit, fwd: bool, mb: int, vs: int, deps: list[int]) -> list[int]:
        """One unit's forward or whole backward, alone; returns the comms it leaves running."""
        ag = self._zero_ag(vs, unit.name) if fwd else None
        if ag is not None:
            deps = deps + [ag]
        if not fwd:
            deps = self._reload_before(unit, vs, mb, deps)
        _first, last = self._emit_steps(unit.fwd if fwd else unit.bwd, deps, self._where(unit, fwd, mb, vs))
        if fwd and last is not None:
            self._offload_out(unit, vs, mb, last)
        if not fwd:
            self._backward_done(unit, vs, mb, last, False)
        return self._carry

    def _segment(self, steps: list[Ly.Step], deps: list[int], where: UnitTag) -> list[int]:
        """Emit one segment of a paired layer (nothing if empty); returns the comms it leaves running."""
        if not steps:
            return list(deps)  # nothing ran: what it would have waited for, the next segment waits for
        self._emit_steps(steps, deps, where)
        return self._carry

    def _paired_layer(self, fu: Unit, bu: Unit, f: tuple[int, int], b: tuple[int, int],
                      f_wait: list[int], b_wait: list[int]) -> tuple[list[int], list[int]] | None:
        """Layer ``fu``'s forward beside layer ``bu``'s backward, in the order of Megatron-Core's
        ``TransformerLayerSchedulePlan.run`` (models/common/model_chunk_schedule_plan.py @ d98e8a64dd):

            comm (ep stream): combine_bwd      | dispatch_fwd -> dispatch_bwd     | combine_fwd
            compute:          pre-dispatch fwd | mlp bwd -> mlp wgrad -> mlp fwd | pre-dispatch bwd

        so each all-to-all runs under the other pass's compute; the forward's few kernels after its combine
        (unpermute, residual add: Megatron's combine node) run last, where the combine has had the
        attention's backward to hide under. With delay_wgrad_compute the backward's dispatch starts
        after the experts' dgrad and runs under their wgrad (``mlp.backward_dw``); the attention's
        delayed wgrad (``pre_dispatch_computation.backward_dw``) still runs before the next layer, so it
        moves nothing here. ``f``/``b``: (micro-batch, virtual stage); ``*_wait``: what each pass's next
        kernel waits for. Returns the two passes' new waits, or None where a layer has no two all-to-alls."""
        fs, bs = self._a2a_segments(fu.fwd), self._a2a_segments(bu.bwd)
        if fs is None or bs is None:
            return None
        delay = self.plan.sc.parallel.delay_wgrad_compute
        fw, bw = self._where(fu, True, *f), self._where(bu, False, *b)
        ag = self._zero_ag(f[1], fu.name)
        if ag is not None:
            f_wait = f_wait + [ag]
        b_wait = self._segment(bs[0], self._reload_before(bu, b[1], b[0], b_wait), bw)  # the unpermute backward
        combine_bwd = self._a2a(bs[1], bw)
        f_wait = self._segment(fs[0], f_wait, fw)  # attention, router, permute
        dispatch_fwd = self._a2a(fs[1], fw)
        if delay:
            b_wait = self._segment(self._backward_part(bs[2], "I"), b_wait + combine_bwd, bw)
            dispatch_bwd = self._a2a(bs[3], bw)
            b_wait = self._segment(self._backward_part(bs[2], "W"), b_wait, bw)
        else:
            b_wait = self._segment(bs[2], b_wait + combine_bwd, bw)  # the experts' backward
            dispatch_bwd = self._a2a(bs[3], bw)
        f_wait = self._segment(fs[2], f_wait + dispatch_fwd, fw)  # the experts' forward
        combine_fwd = self._a2a(fs[3], fw)
        b_wait = self._segment(bs[4], b_wait + dispatch_bwd, bw)  # permute, router, attention backward
        b_last = self.last_compute
        f_wait = self._segment(fs[4], f_wait + combine_fwd, fw)  # unpermute, residual: after, as in Megatron
        if self.last_compute is not None:
            self._offload_out(fu, f[1], f[0], self.last_compute)  # the forward layer's inputs, once it is done
        self._backward_done(bu, b[1], b[0], b_last, False)
        return f_wait, b_wait

    def _a2a(self, segment: list[Ly.Step], where: UnitTag) -> list[int]:
        """Emit a segment that is one token all-to-all (``_a2a_segments``); returns its op ids."""
        comm = segment[0]
        assert isinstance(comm, Ly.Comm)
        return self._comm(comm, where)

    def run_pair(self, f: Task, b: Task) -> None:
        """A combined 1F1B step (Megatron-Core combined_1f1b.py ``combined_forward_backward_step`` and
        model_chunk_schedule_plan.py ``TransformerModelChunkSchedulePlan.run``): the forward's embedding
        and the backward's head first, then layer i of the forward beside layer n − 1 − i of the
        backward (``_paired_layer``), the unpaired layers alone, the forward's head, the backward's
        embedding, and both tasks' pipeline sends."""
        fvs, bvs = self._vs(f.chunk), self._vs(b.chunk)
        self._carry = []
        f_wait = self._recv(True, f.microbatch, fvs)
        b_wait = self._recv(False, b.microbatch, bvs)
        fu, bu = self.plan.chunk_units[fvs], list(reversed(self.plan.chunk_units[bvs]))

        def body(units: list[Unit]) -> tuple[int, int]:
            idx = [i for i, u in enumerate(units) if u.name.startswith(("layer", "mtp"))]
            return (idx[0], idx[-1] + 1) if idx else (len(units), len(units))

        (f0, f1), (b0, b1) = body(fu), body(bu)
        fm, bm = (f.microbatch, fvs), (b.microbatch, bvs)
        for u in bu[:b0]:  # the head's backward
            b_wait = self._plain(u, False, *bm, b_wait)
        for u in fu[:f0]:  # the embedding's forward
            f_wait = self._plain(u, True, *fm, f_wait)
        pairs = min(f1 - f0, b1 - b0)
        for i in range(pairs):
            both = self._paired_layer(fu[f0 + i], bu[b0 + i], fm, bm, f_wait, b_wait)
            if both is None:  # a dense layer: the backward's then the forward's, one after the other
                b_wait = self._plain(bu[b0 + i], False, *bm, b_wait)
                f_wait = self._plain(fu[f0 + i], True, *fm, f_wait)
            else:
                f_wait, b_wait = both
        for u in bu[b0 + pairs:]:  # the backward's unpaired layers and its embedding
            b_wait = self._plain(u, False, *bm, b_wait)
        for u in fu[f0 + pairs:]:  # the forward's unpaired layers and its head
            f_wait = self._plain(u, True, *fm, f_wait)
        self._join(f_wait, True, *fm)
        self._send(True, *fm)
        self._join(b_wait, False, *bm)
        self._send(False, *bm)
        self._carry = []

    def _pp_bytes(self, vs: int) -> float:
        """b·s·h activations (or gradients) of one micro-batch between virtual stages vs and vs + 1 (s/t
        each with SP, as Megatron's scatter-gather optimisation sends 1/t and all-gathers over NVLink);
        n times that with mHC's n residual streams; (1 + mtp_num_layers) times that after the MTP layers,
        whose hidden states go on beside the model's (mtp.py)."""
        m, tr, par = self.plan.model, self.plan.sc.training, self.plan.sc.parallel
        n = tr.micro_batch * (m.seq_len // par.cp) * m.hidden * self.plan.dtype
        if m.enable_mhc_connections:  # the n residual streams (hyper_connection.py)
            n *= m.mhc_num_residual_streams
        chunks = self.plan.chunks
        if chunks is not None and 0 <= chunks.mtp_chunk <= self.plan.model_stage(vs):
            n *= 1 + chunks.mtp
        return n / par.tp if par.sequence_parallel and par.tp > 1 else n

    # --- data parallelism and the optimizer -----------------------------------------
    def _buckets(self, grad_bytes: float, dtype: int = 0) -> list[tuple[list[tuple[int, Unit]], float, float]]:
        """Units grouped, in the order their gradients become ready, into buckets of ``grad_bytes``
        (elements of ``dtype`` bytes: gradients; 0: the parameters gathered after the step, Plan.gathered)."""
        items = sorted(((self.grad_ready[(vs, u.name)], vs, u) for vs in self._my_chunks()
                        for u in self.plan.chunk_units[vs]), key=lambda x: x[0])
        out, cur, dense, expert = [], [], 0.0, 0.0
        for _, vs, u in items:
            cur.append((vs, u))
            d, e = (u.params * dtype, u.expert_params * dtype) if dtype else self.plan.gathered(u)
            dense += d
            expert += e
            if dense + expert >= grad_bytes:
                out.append((cur, dense, expert))
                cur, dense, expert = [], 0.0, 0.0
        if cur:
            out.append((cur, dense, expert))
        return out

    def _my_chunks(self) -> list[int]:
        return [self._vs(c) for c in range(self.plan.v)]

    def _plan_param_gathers(self) -> None:
        """ZeRO-1/2 with overlap: this step's parameter all-gathers, a bucket each, in the forward's order (the
        reverse of the gradients'); the first is issued now, the others by ``_zero_ag``."""
        par = self.plan.sc.parallel
        if not (1 <= par.zero <= 2 and _overlap_param_gather(par) and len(self.dpcp) > 1):
            return
        units = [(vs, u) for vs in self._my_chunks() for u in self.plan.chunk_units[vs]]
        cur, nbytes, dense, expert = [], 0.0, 0.0, 0.0
        for i, (vs, u) in enumerate(units):
            cur.append((vs, u))
            d, e = self.plan.gathered(u)
            nbytes, dense, expert = nbytes + (d + e), dense + d, expert + e
            if nbytes >= par.grad_bucket or i == len(units) - 1:
                for key in cur:
                    self._ag_bucket[(key[0], key[1].name)] = len(self._ag_plan)
                self._ag_plan.append((cur[0][1], vs, dense, expert))
                cur, nbytes, dense, expert = [], 0.0, 0.0, 0.0
        self._issue_gathers(0)

    def _issue_gathers(self, last: int) -> None:
        """Issue the planned parameter all-gathers up to bucket ``last`` (``_plan_param_gathers``)."""
        while len(self._ag_ops) <= min(last, len(self._ag_plan) - 1):
            oid = self._param_gather(*self._ag_plan[len(self._ag_ops)], ())
            self._ag_ops.append(oid if oid >= 0 else None)

    def _zero_ag(self, vs: int, name: str) -> int | None:
        """The all-gather that unit ``name``'s forward waits for (None: none). As Megatron-Core's forward pre-hook
        (param_and_grad_buffer.py @ d98e8a64dd ``finish_param_sync``), the unit's bucket's wait issues the next
        bucket's all-gather: it runs under this bucket's forward, and a single hardware queue
        (``parallel.cuda_device_max_connections`` 1) sees it issued there, not all at the step's start."""
        b = self._ag_bucket.get((vs, name))
        if b is None:
            return None
        self._issue_gathers(b + 1)
        return self._ag_ops[b]

    def finish(self) -> None:
        par, tr = self.plan.sc.parallel, self.plan.sc.training
        end_bwd = self.last_compute
        reduce_ops: list[int] = []
        d_dense, d_exp = len(self.dpcp), len(self.edp)
        per_chunk = self._mirror_per_chunk()
        mirror = None if per_chunk else self._mirror_allreduce(par.zero >= 3)
        mirrors: dict[int, int] = {}  # per_chunk: virtual stage → its pair all-reduce, emitted before its buckets
        if par.zero < 3:
            for units, dense, expert in self._buckets(par.grad_bucket, self.plan.grad_dtype):
                vs, last_u = units[-1]
                dep = self.grad_ready[(vs, last_u.name)] if par.overlap_grad_reduce else end_bwd
                deps: tuple[int | None, ...] = (dep,) if mirror is None else (mirror,)
                if per_chunk:
                    deps = tuple(sorted({self._chunk_mirror(c, mirrors) for c in dict.fromkeys(c for c, _ in units)}))
                op = "all_reduce" if MU.all_reduces(tr, par) else "reduce_scatter"
                if d_dense > 1 and dense:
                    reduce_ops.append(self._emit(kind=COLLECTIVE, stream="dp", name=f"grad_{op}.{last_u.name}",
                                                 collective=op, group=self.dpcp, bytes=dense, deps=deps,
                                                 category="comm", stage=vs, layer=last_u.layer))
                if d_exp > 1 and expert:
                    reduce_ops.append(self._emit(kind=COLLECTIVE, stream="dp", name=f"expert_grad_{op}.{last_u.name}",
                                                 collective=op, group=self.edp, bytes=expert, deps=deps,
                                                 category="comm", stage=vs, layer=last_u.layer))
        outer = self._hsdp_ops
        reduce_ops += self._z3_last + outer + self._tied_embedding_allreduce()
        if mirror is not None:
            reduce_ops.append(mirror)
        reduce_ops += sorted(mirrors.values())
        held = [u for vs in self._my_chunks() for u in self.plan.chunk_units[vs]]
        psi = sum(u.params / (d_dense if par.zero >= 1 else 1) + u.expert_params / (d_exp if par.zero >= 1 else 1)
                  for u in held)
        nbytes, flops = psi * adam_step_bytes(tr), psi * ADAM_FLOPS_PER_PARAM
        chunks = self._muon_chunks()
        matrices = tuple(x for c in chunks for x in c.matrices)
        if matrices:  # Muon's parameters leave Adam's stream for Muon's (workload/muon.py)
            dense, expert = MU.muon_params(matrices)
            mine = dense / (d_dense if par.zero >= 1 else 1) + expert / (d_exp if par.zero >= 1 else 1)
            nbytes, flops = MU.step_bytes_and_flops(psi - mine, mine, adam_step_bytes(tr), ADAM_FLOPS_PER_PARAM, tr)
        per = self.plan.optimizer_s_per_param
        t_opt = compute.elementwise_time(nbytes, self.gpu) if per is None else psi * per
        costed = (0.0, 0.0, t_opt) if per is None else (t_opt, 0.0, 0.0)  # a profiled step: measured
        opt = self._emit(kind=COMPUTE, stream="compute", name="optimizer", category="optimizer",
                         duration=t_opt, costed=costed, flops=flops,
                         bytes=nbytes, deps=tuple(sorted(set(reduce_ops + ([end_bwd] if end_bwd is not None else []) +
                                                             ([self._host_last] if self._host_last is not None
                                                              else [])))))
        if matrices:
            opt = self._newton_schulz(chunks, opt, d_dense, d_exp)
        if 1 <= par.zero <= 2 and not _overlap_param_gather(par) and d_dense > 1:
            for bucket, dense, expert in self._buckets(par.grad_bucket):
                vs, u = bucket[-1]
                self._param_gather(u, vs, dense, expert, (opt,))

    def _hsdp_outer(self, dense: float, expert: float) -> list[tuple[str, tuple[int, ...], float]]:
        """A unit's shards (``dense`` and ``expert`` bytes of the whole unit, sharded within the instance) and the
        groups across the instances they go over: (name prefix, group, bytes of the instance's shard)."""
        out = []
        for prefix, inner, outer, nbytes in (("", self.dpcp_in, self.dpcp_out, dense),
                                             ("expert_", self.edp_in, self.edp_out, expert)):
            if nbytes and len(outer) > 1:
                out.append((prefix, outer, nbytes / len(inner)))
        return out

    def _hsdp_reduce(self, u: Unit, vs: int, inner: tuple[int, ...]) -> None:
        """HSDP, once a step: unit ``u``'s gradient shards reduced across the instances after its last micro-batch's
        reduce-scatters within the instance (``inner``; ``sync_model_each_microbatch`` off: megatron_fsdp "delay
        HSDP gather and reduce operations per optimization cycle"), on a stream of their own so they overlap the
        backward's tail: all-reduced (outer_dp_sharding_strategy no_shard) or reduce-scattered (optim)."""
        par = self.plan.sc.parallel
        op = "reduce_scatter" if par.outer_dp_sharding_strategy == "optim" else "all_reduce"
        g = self.plan.grad_dtype
        for prefix, group, nbytes in self._hsdp_outer(u.params * g, u.expert_params * g):
            self._hsdp_ops.append(self._emit(kind=COLLECTIVE, stream="hsdp", name=f"{u.name}.{prefix}hsdp_{op}",
                                             collective=op, group=group, bytes=nbytes,
                                             deps=inner or (self.grad_ready[(vs, u.name)],), category="comm",
                                             stage=vs, layer=u.layer))

    def _hsdp_gather(self, u: Unit, vs: int, mb: int, deps: list[int]) -> list[int]:
        """HSDP with outer sharding (outer_dp_sharding_strategy optim): unit ``u``'s updated shards all-gathered
        across the instances at its first forward of the step, before its gather within the instance, on a stream
        of their own (megatron_fsdp.py @ d98e8a64dd ``all_gather_and_wait_parameters_ready``: the DP-Outer gather
        "is performed at the beginning of a new optimization step cycle", with ``microbatch_count == 0``;
        param_and_grad_buffer.py ``all_gather_params`` runs it on ``outer_fsdp_group_param_gather_stream``, after
        the current stream, and the inner gather's stream waits for it). The step's gathers are the next step's, as
        ZeRO 1's overlapped ones (:func:`_plan_param_gathers`). ASSUMPTION: a unit's dense and expert gathers
        within the instance both wait for both its outer gathers. The ops (none without instances)."""
        return [self._emit(kind=COLLECTIVE, stream="hsdp", name=f"mb{mb}.{u.name}.{prefix}hsdp_all_gather",
                           collective="all_gather", group=group, bytes=nbytes, deps=tuple(deps), category="comm",
                           microbatch=mb, stage=vs, layer=u.layer)
                for prefix, group, nbytes in self._hsdp_outer(*self.plan.gathered(u))]

    def _muon_chunks(self) -> tuple[MU.Chunk, ...]:
        """Each model chunk's weights as Megatron-Core's Muon sees them (muon.chunk): the matrices it
        orthogonalises of its decoder layers and its MTP modules with their own weights (each, or the first with
        ``mtp_use_repeated_layer``), and the embedding and head that stay on Adam; () under Adam."""
        sc, m = self.plan.sc, self.plan.model
        if not MU.is_muon(sc.training) or m is None:
            return ()
        out = []
        for vs in self._my_chunks():
            units = self.plan.chunk_units[vs]
            names = {u.name for u in units}
            layers = [u.layer for u in units if u.name.startswith("layer") and 0 <= u.layer < m.layers]
            mtp = [u for u in units if u.name.startswith("mtp") and (u.name == "mtp0" or not m.mtp_use_repeated_layer)]
            out.append(MU.chunk(m, sc.parallel, sc.training, layers, len(mtp), "embed" in names, "head" in names))
        return tuple(out)

    def _newton_schulz(self, chunks: tuple[MU.Chunk, ...], after: int, d_dense: int, d_exp: int) -> int:
        """Muon's Newton–Schulz iterations after the step's elementwise stream (``after``): this rank's share of
        the matrices of its ``chunks`` (muon.rank_ns: the heaviest rank's under the layer-wise optimizer), after
        the TP all-gathers of their momenta (duplicated mode) on the ``tp`` and ``etp`` streams, one op of their
        summed bytes a group (ASSUMPTION: the per-matrix gathers' latencies left out). Returns the last op."""
        sc = self.plan.sc
        ns = MU.rank_ns(chunks, sc.training, sc.parallel, self.gpu, d_dense, d_exp,
                        MU.layout_bucket(sc.parallel, self.plan.grad_dtype))
        deps = [after]
        for stream, group, nbytes in (("tp", self.tp, ns.tp_gather), ("etp", self.etp, ns.etp_gather)):
            if nbytes and len(group) > 1:
                deps.append(self._emit(kind=COLLECTIVE, stream=stream, name="muon_momentum_ag",
                                       collective="all_gather", group=group, bytes=nbytes, deps=(after,),
                                       category="comm", stage=self._vs(0)))
        return self._emit(kind=COMPUTE, stream="compute", name="newton_schulz", category="optimizer",
                          duration=ns.seconds, costed=ns.costed, flops=ns.flops, bytes=0.0, deps=tuple(deps))

    def _param_gather(self, u: Unit, vs: int, dense: float, expert: float, deps: tuple[int, ...]) -> int:
        """The all-gather of updated weights (``dense`` and ``expert`` bytes) of the bucket named by unit ``u``:
        the dense weights over dp·cp and the experts' over their expert-data-parallel group, as Megatron-Core's DDP
        keeps the experts in buffers of their own over that group (distributed_data_parallel.py @ d98e8a64dd,
        ``expert_parallel_buffers``, ``data_parallel_group = self.intra_expt_dp_group``) and as the layer-wise
        optimizer gathers them (layer_wise_optimizer.py ``allgather_params``). Returns the last op (-1: none)."""
        last = -1
        for name, group, nbytes in (("param_ag", self.dpcp, dense), ("expert_param_ag", self.edp, expert)):
            if nbytes and len(group) > 1:
                last = self._emit(kind=COLLECTIVE, stream="zero", name=f"{name}.{u.name}", collective="all_gather",
                                  group=group, bytes=nbytes, deps=deps, category="comm", stage=vs, layer=u.layer)
        return last

    def _mirror_allreduce(self, sharded: bool) -> int | None:
        """DualPipe: rank r and rank pp − 1 − r hold the same two stages (r's module 0 is the other's
        module 1), and each copy's gradient is the sum of both: one all-reduce of the rank's gradients
        over the pair, once the pipeline has flushed, before the data-parallel reduction (or, ZeRO-3, of the
        shards it left); with the overlapped reduction one a chunk instead (``_mirror_per_chunk``). DualPipe
        sums them itself outside the schedule (deepseek-ai/DualPipe
        examples/example_dualpipe.py, "Check grads": ``p0.grad += p1all[pp_size - 1 - rank]`` and
        ``p1.grad += p0all[pp_size - 1 - rank]``, from an all-gather of each module's gradients over the
        pipeline group); the pair's all-reduce moves the same sums with the least traffic. None otherwise."""
        par = self.plan.sc.parallel
        if not self.plan.dual or par.pp < 2:
            return None
        units = [u for vs in self._my_chunks() for u in self.plan.chunk_units[vs]]
        d_dense, d_exp = (len(self.dpcp), len(self.edp)) if sharded else (1, 1)
        nbytes = sum(u.params / d_dense + u.expert_params / d_exp for u in units) * self.plan.grad_dtype
        other = self.lo.rank(pp=par.pp - 1 - self.c["pp"], dp=self.c["dp"], cp=self.c["cp"], tp=self.c["tp"])
        last = [self.last_compute] if self.last_compute is not None else []
        flush = {*self.grad_ready.values(), *last, *self.pp_sent.values()}
        return self._emit(kind=COLLECTIVE, stream="dp", name="dualpipe_grad_all_reduce", collective="all_reduce",
                          group=tuple(sorted((self.rank, other))), bytes=nbytes, deps=tuple(sorted(flush)),
                          category="comm", stage=self._vs(0))

    def _mirror_per_chunk(self) -> bool:
        """DualPipe with overlapped gradient reduction (ZeRO 0-2): the pair's all-reduce runs per chunk, as soon
        as the chunk's last backward (or weight-gradient pass) is done on both ranks of the pair, and that
        chunk's data-parallel buckets follow it while the other chunk still runs, as DDP's overlapped buckets
        start at their last backward. DualPipe leaves the sum to its caller: deepseek-ai/DualPipe
        examples/example_dualpipe.py sums after ``DualPipe.step`` returns (the flush), parameter by parameter;
        a module's gradient is final at its last weight-gradient pass (``WeightGradStore.pop`` in steps 6-8 of
        dualpipe/dualpipe.py), so its sum may start there. Without the overlap (or with ZeRO-3, whose shards the
        per-layer reduce-scatters leave on the same stream) the pair's all-reduce waits for the flush."""
        par = self.plan.sc.parallel
        return self.plan.dual and par.pp > 1 and par.zero < 3 and par.overlap_grad_reduce

    def _chunk_mirror(self, vs: int, done: dict[int, int]) -> int:
        """The pair's all-reduce of virtual stage ``vs``'s gradients (model stage s on this rank, the same
        stage's other copy on rank pp − 1 − s), emitted once, after the chunk's last backward; ``done``: the
        ones emitted so far. Both ranks of the pair finish the same model stage first (dualpipe_steps runs
        DualPipeV's order for the same half rank on both, the phases swapped with the modules), so each
        emits its two in the same order, as the pair's communicator matches them."""
        if vs not in done:
            par = self.plan.sc.parallel
            units = self.plan.chunk_units[vs]
            nbytes = sum(u.params + u.expert_params for u in units) * self.plan.grad_dtype
            other = self.lo.rank(pp=par.pp - 1 - self.c["pp"], dp=self.c["dp"], cp=self.c["cp"], tp=self.c["tp"])
            stage = self.plan.model_stage(vs)
            done[vs] = self._emit(kind=COLLECTIVE, stream="dp", name=f"dualpipe_grad_all_reduce.stage{stage}",
                                  collective="all_reduce", group=tuple(sorted((self.rank, other))), bytes=nbytes,
                                  deps=tuple(sorted(self.grad_ready[(vs, u.name)] for u in units)),
                                  category="comm", stage=vs, layer=units[-1].layer)
        return done[vs]

    def _tied_embedding_allreduce(self) -> list[int]:
        """Tied input/output embeddings on different stages: all-reduce their gradients (Megatron).

        Megatron does it in ``finalize_model_grads`` (megatron/core/distributed/finalize_model_grads.py,
        ``_allreduce_word_embedding_grads``), which runs once the pipeline schedule has ended (the
        flush: the rank's last backward and its last sends) and after ``finish_grad_sync`` (the DP
        buckets: before it on the ``dp`` stream here). Started at the head's last backward instead,
        the last stage's all-reduce could begin before its last gradient send; ASTRA-sim lets an
        NPU have one communication in flight besides receives (astra-sim/workload/HardwareResource.cc,
        ``HardwareResource::is_available``), so that send waited for the all-reduce, which waited
        for stage 0, which waited for that send: a pp 2, dp 1 export never finished there.
        It reduces ``main_grad`` (``_get_main_grad_attr``), which lives in the DP grad buffer, of the
        DP reduction's dtype (fp32 for bf16: ``grad_reduce_bytes``), not the parameter's."""
        m, par = self.plan.model, self.plan.sc.parallel
        if self.plan.dual:  # each end rank holds an embedding and a head; the pair's all-reduce sums them
            return []
        p = par.pp
        V = p * self.plan.v
        # the units that hold the word embedding (pretrain_gpt.py ``get_embedding_ranks``: the first stage,
        # the last when tied, and the MTP layers' stages, multi_token_prediction.py ``get_mtp_ranks``)
        holders = [(0, "embed")] + ([(V - 1, "head")] if m.tied_embeddings else [])
        chunks = self.plan.chunks
        if chunks is not None and chunks.mtp_chunk >= 0:
            holders += [(chunks.mtp_chunk, f"mtp{d}") for d in range(chunks.mtp)]
        v_shape = self.plan.v_shape  # a V: the first and last chunk on rank 0, one embedding, no all-reduce
        stages = {rank_of(vs, p, v_shape) for vs, _ in holders}
        mine = [(vs, u) for vs, u in holders if rank_of(vs, p, v_shape) == self.c["pp"]]
        if p == 1 or len(stages) < 2 or not mine:
            return []
        vs = mine[0][0]
        group = tuple(sorted(self.lo.rank(pp=s, dp=self.c["dp"], cp=self.c["cp"], tp=self.c["tp"]) for s in stages))
        last = [self.last_compute] if self.last_compute is not None else []
        flush = {*(self.grad_ready[key] for key in mine), *last, *self.pp_sent.values()}
        return [self._emit(kind=COLLECTIVE, stream="dp", name="embedding_grad_all_reduce", collective="all_reduce",
                           group=group, bytes=m.vocab * m.hidden / par.tp * self.plan.grad_dtype,
                           deps=tuple(sorted(flush)), category="comm", stage=vs)]

    def _run_steps(self, steps: list[tuple[Task, ...]]) -> None:
        """A schedule given as steps: a pair (a forward, a backward of another chunk) runs as one overlapped
        step (``run_pair``: DualPipe's ``_forward_backward_compute_chunk``, whose MoE overlap, DeepSeek-V3
        report §3.2.1, hides each pass's all-to-alls under the other's compute, as Megatron's combined step
        does); ZeRO-3's per-layer gathers are not paired, so there the pair runs one task after the other."""
        for step in steps:
            if len(step) == 2 and self.plan.sc.parallel.zero < 3:
                self.run_pair(*step)
            else:
                for t in step:
                    self.run_task(t.phase, t.microbatch, t.chunk)

    def build(self) -> None:
        par = self.plan.sc.parallel
        self._plan_param_gathers()
        tasks = schedule(par.schedule, self.c["pp"], par.pp, self.plan.micro, par.virtual_stages,
                         par.overlap_moe_expert_parallel_comm)
        if par.schedule in ("dualpipev", "dualpipe"):
            steps_of = dualpipev_steps if par.schedule == "dualpipev" else dualpipe_steps
            self._run_steps(steps_of(self.c["pp"], par.pp, self.plan.micro, par.virtual_stages))
        elif par.overlap_moe_expert_parallel_comm:
            for step in combined_steps(tasks):
                if len(step) == 2:
                    self.run_pair(*step)
                else:
                    self.run_task(step[0].phase, step[0].microbatch, step[0].chunk)
        else:
            for task in tasks:
                self.run_task(task.phase, task.microbatch, task.chunk)
        self.finish()


def _overlap_param_gather(par: ParallelSpec) -> bool:
    """``parallel.overlap_param_gather``, whose default follows ``overlap_grad_reduce``."""
    return par.overlap_grad_reduce if par.overlap_param_gather is None else par.overlap_param_gather


def build_program(sc: Scenario, fold: Fold | None = None, blocks: bool = False) -> Program:
    """The Program of one training iteration of ``sc`` (ops for the simulated ranks only; with
    ``blocks``, a unit whose ops can run as one is one block op: ``Op.parts``). With MoE loads drawn from
    ``model.moe_load_seed`` and several ``simulation.iterations``, each step is built with its own draw
    and the program holds them all, back to back (``Program.iterations``)."""
    steps = max(1, sc.simulation.iterations)
    if sc.model is None or sc.model.moe_load_seed is None or steps == 1:
        return _step_program(sc, fold, blocks, 0)
    return chained([_step_program(sc, fold, blocks, k) for k in range(steps)])


def _step_program(sc: Scenario, fold: Fold | None, blocks: bool, step: int) -> Program:
    """The Program of training step ``step`` of ``sc`` (its drawn MoE loads: make_plan)."""
    plan = make_plan(sc, step)
    if sc.workload.profile is not None:  # the user's own script: its profiled parts replace the generated layers
        reshape_plan(plan, sc)
    ops: list[Op] = []
    next_id = [0]
    for rank in range(plan.layout.world):
        if fold is None or fold.is_representative(rank):
            _RankBuilder(plan, rank, ops, next_id, blocks).build()
    assert sc.model is not None  # make_plan checked it
    m, tr, par = M.resolve(sc.model), sc.training, sc.parallel  # the model's own vocabulary, not the padded one
    facts = WorkloadFacts(
        model_flops=F.model_flops(m, tr.global_batch),
        hardware_flops=F.hardware_flops(m, tr.global_batch, tr.recompute, plan.flash, tr.recompute_modules),
        tokens=tr.global_batch * m.seq_len, samples=tr.global_batch, pp=par.pp, microbatches=plan.micro,
        tp=par.tp, dp=par.dp, cp=par.cp, ep=par.ep, virtual_stages=plan.v, schedule=par.schedule,
        params=M.total_params(m))
    return Program(plan.layout.world, ops, fold, ProgramMeta(workload=facts))

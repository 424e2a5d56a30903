"""A closed-form iteration time: the search's ranking estimate (no SimPy, no topology).

For a model workload it adds up, per pipeline stage and micro-batch, the same kernels and
tensor-parallel communications the builder emits (workload/plan.py, workload/layer.py:
``forward_steps``, ``backward_steps``, the embedding and the head, costed by
``kernel_cost.pass_time`` with ``devices/compute.py``), and prices communication with the
uncontended ring formulas of network/collectives.py:

    all-reduce       L + 2(n−1)·α + 2(n−1)/n · S/B
    reduce-scatter,
    all-gather       L + (n−1)·α + (n−1)/n · S/B
    send/recv        L + α + S/B
    all-to-all       L + (n−1)·α + (n−1)/n · S/B   (but on the expert-parallel group, below)

where B is the NVLink rate (line rate × ``intra_efficiency``) for a group inside one node, and
across nodes k·B_nic, the node's NIC capacity shared evenly by its GPUs (``nics`` ·
``nic_bandwidth`` · ``nic_efficiency`` / ``gpus_per_node``) times the k members the group has
on each node (k rings, one per rail); divided by the fabric's oversubscription when the
group spans more than one leaf. α is the links' latency plus the calibrated per-step
software latency of the class (intra or inter), L the collective launch cost. A MoE token
exchange on the expert-parallel group (a dispatch or combine: all-to-all-v, DeepEP, HybridEP, or
the alltoall dispatcher's plain all-to-all) is priced as its own plan runs alone on the group's
nodes (studies/exchange_cost.py): the top-k copies, DeepEP's forwarding and each GPU's own NIC share.

Pipeline: with T_s the time of one micro-batch (forward and backward, all its chunks) on
stage s, m micro-batches, p stages and v chunks per stage,

    1f1b, gpipe:      m·max T_s + (Σ T_s − max T_s)       (bubble (p − 1)/m when equal)
    interleaved-1f1b: m·max T_s + (Σ T_s − max T_s)/v   (bubble (p − 1)/(v·m))
    others:           m·max T_s + (Σ T_s − max T_s)·k, k the schedule's bubble over 1F1B's with
                      F = B = W (a third of T each, the zero-bubble paper's assumption):
                      zb-h1 (F + B − W)/(F + B + W) = 1/3 (Qi et al. ICLR'24 Table 1);
                      zb-v 1/6 (F/2 a chunk: the V's fill, tests/test_schedules.py test_bubble_zb_v);
                      dualpipev 1/3 (DualPipe README: (PP/2 − 1)(F&B + B − 3W) over 2p chunks of T/6
                      each, F&B = F + B: (p − 1)·T/3); dualpipe (p/2 − 1)·2T/3 over (p − 1)·T,
                      with T_s the mean of the rank's two stages

plus 2(p·v − 1) activation/gradient transfers on the fill and drain. T_s counts a stage's layers as
workload/plan.py holds them (``Split``): an MoE model's ``first_dense_layers`` as dense layers with no
experts, and the MTP modules (with the head's passes over their hidden states) on the stage of the loss
or where the layout puts them. Then the data-parallel
gradient reduction of the rank with the most parameters (the experts' over their expert-data-parallel
group, the rest over dp·cp, as workload/builder.py reduces them; all-reduce with ZeRO 0,
reduce-scatter and the parameter all-gather with ZeRO 1–2, exposed whole unless
``overlap_grad_reduce`` / ``overlap_param_gather``, then one bucket each; ZeRO 3's
per-micro-batch gathers and reduce-scatters count where they exceed that micro-batch's
compute, plus the gather of each task's first layer, which nothing hides), the tied-embedding all-reduce, and the
optimizer step (optimizer.adam_step_bytes per local parameter at streaming speed, as the builder).
A rank's parameters are its stage's, or with dualpipe its two stages' (s and p − 1 − s,
workload/memory.py ``held_stages``: DualPipe's two copies), so dualpipe reduces and steps twice
a stage's parameters, and adds the pair's gradient all-reduce over ranks s and p − 1 − s
(workload/builder.py), which the DP reduction follows: with ``overlap_grad_reduce`` per chunk, so
the chunk that finishes last (stage min(s, p − 1 − s)) has its pair all-reduce and its whole DP
reduction exposed; without, both chunks' after the flush. The head holds its own copy of a tied
word embedding only on another rank than the embedding's (not under a V, whose head sits on rank 0,
nor dualpipe, whose end ranks hold both: no copy and no tied-embedding all-reduce, as
workload/plan.py).

What it leaves out, and why the search still simulates its best layouts: contention between
flows, the schedule's exact dependencies (p2p waits inside the steady state), hierarchical
and NVLS collectives. It is a ranking, measured against the emulator by Spearman's ρ in
every search's output.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from emulator.devices import compute
from emulator.network.collectives import ring_factors
from emulator.network.domain import domain_size
from emulator.program import is_token_exchange
from emulator.scenario.spec import QUANTISED, GpuSpec, ModelSpec, NodeSpec, ParallelSpec, Scenario
from emulator.scenario.stages import V_SHAPED, model_chunks, rank_of, stage_layers
from emulator.scenario.stages import head_apart as stages_head_apart
from emulator.studies.exchange_cost import EpNodes, ep_nodes, exchange_time
from emulator.workload import host as HOST
from emulator.workload import hybrid
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload import mtp as MTP
from emulator.workload import muon as MU
from emulator.workload.cpu_offload import offloaded_bytes, offloaded_layers, pass_with_copies
from emulator.workload.memory import chunk_plan_of, expert_dp, held_stages, muon_chunks
from emulator.workload.offload import layer_offload, offload_share
from emulator.workload.optimizer import adam_step_bytes
from emulator.workload.placement import ORDER, Layout, hsdp_groups
from emulator.workload.plan import (
    DTYPE_BYTES,
    grad_reduce_bytes,
    layer_backward,
    non_tn_fp8,
    param_gather_bytes,
)

# the host's launch seconds, the modules CUDA graphs capture, whether the shared experts overlap the dispatch (host.py)
HostCost = tuple[float, frozenset[str], bool]
NO_HOST: HostCost = (0.0, frozenset(), False)


@dataclass(frozen=True)
class Estimate:
    """A closed-form iteration (seconds) and its parts; they add up to ``iteration_s``."""

    iteration_s: float
    compute_s: float  # m · T of the slowest stage (its kernels and blocking TP/CP/EP comm)
    bubble_s: float  # the pipeline fill and drain, p2p transfers included
    dp_comm_s: float  # exposed data-parallel (and tied-embedding) communication
    optimizer_s: float


@dataclass(frozen=True)
class Link:
    """One class of path: bandwidth B (B/s), per-step latency α (s), launch L (s)."""

    bandwidth: float
    alpha: float
    launch: float


def ring_time(op: str, n: int, nbytes: float, link: Link) -> float:
    """Uncontended time of collective ``op`` on n members for a buffer of ``nbytes`` (module docstring)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    if op == "p2p":
        return link.launch + link.alpha + nbytes / link.bandwidth
    factor, steps = ring_factors(op, n)
    return link.launch + steps * link.alpha + factor * nbytes / link.bandwidth


def intra_link(node: NodeSpec) -> Link:
    """Inside one node: GPU → switch → GPU."""
    return Link(node.intra_bandwidth * node.intra_efficiency, 2 * node.intra_latency + node.step_latency_intra,
                node.collective_launch)


def inter_link(sc: Scenario, per_node: int, nodes: int) -> Link:
    """Across ``nodes`` nodes, ``per_node`` members of the group on each (one ring per rail)."""
    node = sc.cluster.node
    assert node is not None
    fab = sc.cluster.fabric
    share = node.nics * node.nic_bandwidth * node.nic_efficiency / node.gpus_per_node
    bw = share * per_node
    cross_leaf = fab.kind == "fat_tree" and nodes > fab.leaf_size
    if cross_leaf and fab.oversubscription > 1:
        bw /= fab.oversubscription
    hops = 4 if cross_leaf else 2  # NIC → leaf (→ spine → leaf) → NIC
    return Link(bw, 2 * node.nic_latency + hops * fab.latency + node.step_latency_inter, node.collective_launch)


def group_link(sc: Scenario, stride: int, n: int) -> Link:
    """The path class of a group of n ranks ``stride`` apart (ranks fill nodes in order): NVLink inside one NVLink
    domain (a node, or ``nvlink_domain`` GPUs of an NVL72 rack's trays, as network/domain.py joins them), else the
    NICs."""
    node = sc.cluster.node
    assert node is not None
    g = domain_size(node)
    if stride * (n - 1) < g:
        return intra_link(node)
    per_node = max(1, g // stride)
    return inter_link(sc, min(per_node, n), -(-n // per_node))


def strides(sc: Scenario) -> dict[str, int]:
    """Rank distance between neighbours along each axis of the placement (workload/placement.py)."""
    par = sc.parallel
    sizes = {"pp": par.pp, "dp": par.dp, "cp": par.cp, "tp": par.tp}
    out, step = {}, 1
    for axis in reversed(tuple(par.order or ORDER)):
        out[axis] = step
        step *= sizes[axis]
    return out


@dataclass(frozen=True)
class Split:
    """What each pipeline stage holds (``stage_layers``' indexing, ``[stage][chunk]``): its chunks' layers,
    how many of them are an MoE model's ``first_dense_layers`` (``leads``), and the stage whose chunk holds
    the MTP modules (-1: none; ``ChunkPlan.mtp_chunk``)."""

    layers: list[tuple[int, ...]]
    leads: tuple[int, ...]
    mtp: int = -1
    parts: tuple[str, ...] = ()  # a hybrid model's: each stage's layers, a pattern symbol each (workload/hybrid.py)
    mtp_parts: str = ""  # a hybrid model's MTP depth's symbols (hybrid.mtp_pattern)
    # a model whose layers' attention differs (models.layers_differ): each stage's layers' kinds (ratio, whether a
    # DSA layer reuses the top-k, whether a dense leading layer), and the MTP modules' kind
    kinds: tuple[tuple[tuple[int, bool, bool], ...], ...] = ()
    mtp_kind: tuple[int, bool, bool] = (0, False, False)

    def count(self, s: int) -> int:
        """The transformer layers of stage s (MTP modules apart)."""
        return sum(self.layers[s])


def split_of(m: ModelSpec, par: ParallelSpec) -> Split:
    """The layers of each stage (workload/plan.py's chunks): chunk k holds the model's layers from
    Σ layers[:k] on, so it holds min(start + n, first_dense_layers) − start leading dense layers."""
    p, v = par.pp, par.virtual_stages
    vee = par.schedule in V_SHAPED  # a V: the head on the first stage (scenario/stages.py)
    plan = model_chunks(m.layers, p, v, par.first_chunk_layers, par.last_chunk_layers,
                        par.pipeline_model_parallel_layout, m.mtp_num_layers)
    dense = m.first_dense_layers if m.experts else 0
    starts = [sum(plan.layers[:k]) for k in range(len(plan.layers))]
    lead = tuple(max(0, min(a + n, dense) - a) for a, n in zip(starts, plan.layers))
    mtp = rank_of(plan.mtp_chunk, p, vee) if plan.mtp and plan.mtp_chunk >= 0 else -1
    parts: tuple[str, ...] = ()
    if m.hybrid_layer_pattern:  # each stage's chunks' slices of the pattern
        chunk_parts = [hybrid.main_pattern(m)[a:a + n] for a, n in zip(starts, plan.layers)]
        parts = tuple("".join(chunk_parts[k] for k in ks)
                      for ks in stage_layers(tuple(range(len(plan.layers))), p, vee))
    kinds: tuple[tuple[tuple[int, bool, bool], ...], ...] = ()
    if M.layers_differ(m):  # each stage's chunks' layers' kinds
        chunk = [tuple(M.layer_kind(m, i) for i in range(a, a + n)) for a, n in zip(starts, plan.layers)]
        kinds = tuple(sum((chunk[k] for k in ks), ()) for ks in stage_layers(tuple(range(len(plan.layers))), p, vee))
    return Split(stage_layers(plan.layers, p, vee), tuple(sum(c) for c in stage_layers(lead, p, vee)), mtp, parts,
                 hybrid.mtp_pattern(m) if m.hybrid_layer_pattern else "", kinds, M.layer_kind(m, m.layers + 1))


@dataclass(frozen=True)
class Params:
    """Parameters on one GPU (workload/plan.py's units): per layer dense and expert, what the first stage
    (embedding) and the last stage (head) hold besides their layers, an MoE model's leading dense layer
    (``lead``), and all its MTP modules, dense and expert (``mtp``)."""

    layer_dense: float
    layer_expert: float
    first: float
    last: float
    lead: float = 0.0
    mtp: tuple[float, float] = (0.0, 0.0)
    parts: tuple[tuple[str, float, float], ...] = ()  # a hybrid model's (part, dense, expert) of one layer each

    def layers(self, split: Split, s: int) -> tuple[float, float]:
        """(dense, expert) parameters of stage s's layers and MTP modules."""
        if split.parts:  # a hybrid model: each of its layers' part, and its MTP modules
            of = {part: (d, e) for part, d, e in self.parts}
            mine = [of[c] for c in split.parts[s]] + ([self.mtp] if s == split.mtp else [])
            return sum(d for d, _ in mine), sum(e for _, e in mine)
        n, k = split.count(s), split.leads[s]
        dense = self.layer_dense * (n - k) + self.lead * k
        expert = self.layer_expert * (n - k)
        if s == split.mtp:
            dense, expert = dense + self.mtp[0], expert + self.mtp[1]
        return dense, expert

    def stage(self, split: Split, s: int, p: int) -> tuple[float, float]:
        """(dense, expert) parameters of stage s of p."""
        dense, expert = self.layers(split, s)
        return dense + (self.first if s == 0 else 0.0) + (self.last if s == p - 1 else 0.0), expert

    def rank(self, split: Split, r: int, par: ParallelSpec) -> tuple[float, float]:
        """(dense, expert) parameters pipeline rank r holds: its stage's, or with dualpipe its two stages'
        (``held_stages``), with the embedding on rank 0 and the head on the last virtual stage's rank (rank 0
        under a V)."""
        held = held_stages(par, r)
        head = rank_of(par.pp * par.virtual_stages - 1, par.pp, par.schedule in V_SHAPED)  # a V: rank 0
        both = [self.layers(split, s) for s in held]
        dense = sum(d for d, _ in both) + (self.first if 0 in held else 0.0) + (self.last if head in held else 0.0)
        return dense, sum(e for _, e in both)


def head_apart(par: ParallelSpec) -> bool:
    """The LM head on another rank than the embedding (scenario/stages.py ``head_apart``)."""
    return stages_head_apart(par.pp, par.schedule)


def params_of(m: ModelSpec, sc: Scenario, split: Split | None = None) -> Params:
    """A GPU's parameters, as workload/plan.py's units hold them; ``split`` places the MTP modules (a copy
    of the word embedding with them off rank 0)."""
    par = sc.parallel
    t = par.tp
    # an MoE layer's: the experts' own width (expert_ffn_hidden), split over etp·ep; the rest over tp
    dense = M.dense_layer_params(m, bool(m.experts)) / t
    expert = M.routed_params(m) / ((par.etp or t) * par.ep) if m.experts else 0.0
    first = m.vocab * m.hidden / t + (m.seq_len * m.hidden if M.learned_positions(m) else 0)
    last = M.head_params(m) + (m.vocab * m.hidden / t if (m.tied_embeddings and head_apart(par)) else 0)
    if not m.tied_embeddings:
        last -= m.vocab * m.hidden * (1 - 1 / t)
    lead = M.dense_layer_params(m, False) / t if m.experts else 0.0
    mtp = (0.0, 0.0)
    if split is not None and split.mtp >= 0:  # plan.py _mtp_units: eh_proj over tp, the norms whole
        copy = par.schedule != "dualpipe" and split.mtp != 0
        layer = M.shared_layer_params(m, m.layers + 1) / t  # an MTP module's layer (models.layer_parts)
        one = layer + 2 * m.hidden * m.hidden / t + MTP.mtp_extra_params(m) - 2 * m.hidden * m.hidden
        n = 1 if m.mtp_use_repeated_layer else m.mtp_num_layers  # one module's weights for all depths
        mtp = (one * n + (m.vocab * m.hidden / t if copy else 0),
               (expert if M.is_moe_layer(m, m.layers + 1) else 0.0) * n)
    main = hybrid.main_pattern(m) if m.hybrid_layer_pattern else ""
    parts = tuple((part, M.part_params(m, part) / t, expert if part == hybrid.MOE else 0.0)
                  for part in sorted(set(main)))  # as workload/plan.py's units hold them
    return Params(dense, expert, first, last, lead, mtp, parts)


# each schedule's bubble over 1F1B's, with F = B = W (module docstring); interleaved-1f1b: 1/v
BUBBLE_VS_1F1B = {"gpipe": 1.0, "1f1b": 1.0, "zb-h1": 1 / 3, "zb-v": 1 / 6, "dualpipev": 1 / 3}


def _fill_share(schedule: str, v: int, p: int) -> float:
    if schedule == "dualpipe":  # README: (p/2 − 1)(F&B + B − 3W) = (p/2 − 1)·2T/3 over (p − 1)·T
        return (p // 2 - 1) * 2 / 3 / (p - 1) if p > 1 else 0.0
    return 1 / v if schedule == "interleaved-1f1b" else BUBBLE_VS_1F1B[schedule]


def _per_rank(schedule: str, stage_t: list[float]) -> list[float]:
    """A micro-batch's time on each rank: its stage's, or with dualpipe the mean of its two stages'
    (half the micro-batches run stage r, half stage p − 1 − r)."""
    if schedule != "dualpipe":
        return stage_t
    p = len(stage_t)
    return [(stage_t[s] + stage_t[p - 1 - s]) / 2 for s in range(p)]


def estimate_iteration(sc: Scenario) -> Estimate:
    """The closed-form iteration time of ``sc`` (a model workload whose layout passes the rule book)."""
    par, tr = sc.parallel, sc.training
    node = sc.cluster.node
    if sc.model is None or node is None:
        raise ValueError("an iteration estimate needs a model and a node type")
    if sc.workload.profile is not None:
        return _estimate_profiled(sc)
    gpu = node.gpu
    m = replace(M.resolve(sc.model), vocab=M.padded_vocab(M.resolve(sc.model).vocab, par.tp))
    dtype = DTYPE_BYTES[tr.precision]
    flash = getattr(tr, "attention", "unfused") in ("flash", "fa2")
    L = Ly.layer_shape(m, tr.micro_batch, par.tp, par.sequence_parallel, par.cp, par.ep, dtype, flash,
                       fa2=tr.attention == "fa2", etp=par.etp, recipe=Ly.recipe_of(tr.precision, tr.fp8_recipe),
                       non_tn=non_tn_fp8(gpu), parallel=par, sm_count=gpu.sm_count,
                       fp8_dpa=tr.fp8_dot_product_attention,
                       fp8_head=tr.fp8_output_proj)
    st = strides(sc)
    hier = par.hierarchical_context_parallel_sizes if par.cp_comm_type == "a2a+p2p" else None
    a = hier[0] if hier else 1  # a2a+p2p: the all-to-all level's consecutive ranks; the ring's step a ranks along CP
    links = {"tp": group_link(sc, st["tp"], par.tp), "cp": group_link(sc, st["cp"] * a, par.cp // a),
             "cp_a2a": group_link(sc, st["cp"], a)}
    links["ep"] = group_link(sc, st["cp"] if par.cp > 1 else st["dp"], par.ep)
    sizes = {"tp": par.tp, "cp": par.cp // a, "ep": par.ep, "cp_a2a": a}
    comm = tuple((name, sizes[name], links[name]) for name in ("tp", "cp", "ep", "cp_a2a"))
    lo = Layout.from_parallel(par, sc.gpus, par.order or None)
    args = (tr.recompute, M.learned_positions(m), m.vocab, gpu, comm, tr.recompute_modules)
    split = split_of(m, par)
    p, v = par.pp, par.virtual_stages
    last = rank_of(p * v - 1, p, par.schedule in V_SHAPED)  # a V: the head on the first stage
    mtp_n = m.mtp_num_layers if split.mtp >= 0 else 0
    def stage_times(a: tuple) -> list[float]:
        if m.experts:  # each stage as its slowest expert-parallel group (the others wait for it at the reduction)
            variants = ep_variants(lo, node)
            by_group = {ep: _stage_times(L, (*a, ep), split, mtp_n, p, last) for eps in variants.values() for ep in eps}
            return [max(by_group[ep][s] for ep in variants[s]) for s in range(p)]
        return _stage_times(L, (*a, None), split, mtp_n, p, last)
    stage_t = stage_times(args)
    if tr.recompute == "full" and tr.recompute_method == "block":  # each stage's share of rerun layers (plan.py)
        plain = stage_times(("none", *args[1:]))
        n = tr.recompute_num_layers
        shares = [sum(min(n, c) for c in split.layers[s]) / max(1, split.count(s)) for s in range(p)]
        stage_t = [f * sh + t * (1 - sh) for f, t, sh in zip(stage_t, plain, shares)]
    host = host_cost(sc)
    if host[0] > 0:  # a stage's micro-batch takes at least the host's issuing of it (workload/host.py)
        stage_t = [max(t, h) for t, h in zip(stage_t, _stage_times(L, (*args, None), split, mtp_n, p, last, host))]
    stage_t = _per_rank(par.schedule, _offload_bound(sc, m, split, stage_t))
    micro = max(1, tr.global_batch // (tr.micro_batch * par.dp))
    slow = max(stage_t)
    compute_s = micro * slow
    fill = (sum(stage_t) - slow) * _fill_share(par.schedule, v, p)
    pp_bytes = float(tr.micro_batch * (m.seq_len // par.cp) * m.hidden * dtype)
    if m.enable_mhc_connections:  # mHC's residual streams (workload/builder.py)
        pp_bytes *= m.mhc_num_residual_streams
    if par.sequence_parallel and par.tp > 1:
        pp_bytes /= par.tp
    p2p = ring_time("p2p", 2, pp_bytes, group_link(sc, st["pp"], 2)) if p > 1 else 0.0
    bubble_s = max(0.0, fill) + 2 * (p * v - 1) * p2p
    params = params_of(m, sc, split)
    dp_comm_s = _dp_exposed(sc, m, params, split, stage_t, micro, st)
    optimizer_s = _optimizer(sc, params, split, gpu)
    total = compute_s + bubble_s + dp_comm_s + optimizer_s
    return Estimate(total, compute_s, bubble_s, dp_comm_s, optimizer_s)


def _stage_times(L: Ly.LayerShape, args: tuple, split: Split, mtp_n: int, p: int, last: int,
                 host: HostCost = NO_HOST) -> list[float]:
    """Each stage's forward and backward of one micro-batch (``pass_times``, ``extra_times``; ``mtp_n`` MTP
    modules), or with ``host`` the host's issuing of them."""
    if split.parts:
        return _hybrid_stage_times(L, args, split, mtp_n, p, last, host)
    if split.kinds:
        return _kind_stage_times(L, args, split, mtp_n, p, last, host)
    per_layer, embed, head = pass_times(L, *args, host)
    lead, mtp, mtp_head = extra_times(L, *args, mtp_n, any(split.leads), host)
    return [split.count(s) * per_layer + split.leads[s] * (lead - per_layer) + (embed if s == 0 else 0.0)
            + (head + mtp_head if s == last else 0.0) + (mtp if s == split.mtp else 0.0) for s in range(p)]


def _kind_stage_times(L: Ly.LayerShape, args: tuple, split: Split, mtp_n: int, p: int, last: int,
                      host: HostCost) -> list[float]:
    """:func:`_stage_times` of a model whose layers' attention differs: each layer its kind's passes (Split.kinds),
    an MTP module at its own."""
    def shape(kind: tuple[int, bool, bool]) -> Ly.LayerShape:
        Lk = replace(L, csa=kind[0], dsa_skip=kind[1])
        return Ly.dense_shape(Lk) if kind[2] else Lk
    each = {k: pass_times(shape(k), *args, host) for k in sorted({*sum(split.kinds, ()), split.mtp_kind})}
    _, embed, head = each[split.mtp_kind]
    _, mtp, mtp_head = extra_times(shape(split.mtp_kind), *args, mtp_n, False, host)
    return [sum(each[k][0] for k in split.kinds[s]) + (embed if s == 0 else 0.0)
            + (head + mtp_head if s == last else 0.0) + (mtp if s == split.mtp else 0.0) for s in range(p)]


def _hybrid_stage_times(L: Ly.LayerShape, args: tuple, split: Split, mtp_n: int, p: int, last: int,
                        host: HostCost) -> list[float]:
    """:func:`_stage_times` of a hybrid model: each layer its part's passes (the embedding's and the head's do not
    depend on the part), an MTP module around a layer of its depth's symbols."""
    each = {part: pass_times(Ly.part_shape(L, part), *args, host) for part in sorted(set("".join(split.parts)))}
    _, embed, head = next(iter(each.values()))
    _, mtp, mtp_head = extra_times(Ly.part_shape(L, split.mtp_parts), *args, mtp_n, False, host)
    return [sum(each[c][0] for c in split.parts[s]) + (embed if s == 0 else 0.0)
            + (head + mtp_head if s == last else 0.0) + (mtp if s == split.mtp else 0.0) for s in range(p)]


def ep_variants(lo: Layout, node: NodeSpec) -> dict[int, list[EpNodes]]:
    """Per pipeline stage, one expert-parallel group of each placement over the NVLink domains (the domains its
    members fall in, relative to its first; the group moved by whole domains to start in the first). A group that
    straddles two domains (EP 16 over 72-GPU racks: ranks 64-79) runs its token exchange over the NICs, and it
    sets the step of every group, which waits for it at the data-parallel reduction."""
    out: dict[int, dict[tuple[int, ...], tuple[int, ...]]] = {}
    covered: set[int] = set()
    for r in range(lo.world):
        if r in covered:
            continue
        g = lo.ep_group(r)
        covered.update(g)
        domains = [x // node.domain for x in g]
        shift = domains[0] * node.domain  # moved to the first domain: the same placement, the same EpNodes (cached)
        out.setdefault(lo.coords(r)["pp"], {}).setdefault(tuple(d - domains[0] for d in domains),
                                                          tuple(x - shift for x in g))
    return {s: [ep_nodes(g, node) for g in shapes.values()] for s, shapes in out.items()}


def host_cost(sc: Scenario) -> HostCost:
    """The host's launch seconds and the modules CUDA graphs capture (workload/host.py); no host under a
    whole-iteration graph, as the run has none."""
    node, tr = sc.cluster.node, sc.training
    if node is None or node.host_launch <= 0 or tr.cuda_graph_impl == "full_iteration":
        return NO_HOST
    return (node.host_launch, HOST.captured_modules(tr.cuda_graph_impl, tr.cuda_graph_modules),
            sc.parallel.moe_shared_expert_overlap)


def _offload_bound(sc: Scenario, m: ModelSpec, split: Split, stage_t: list[float]) -> list[float]:
    """With fine-grained activation offloading, a stage's micro-batch takes at least the copies of its layers:
    each of the d2h and h2d streams moves every offloaded byte once a micro-batch, beside the compute
    (workload/builder.py), at the node's host_bandwidth; of them the share activation_offload_fraction sends
    (offload.py ``offload_share``). Layer-wise CPU offloading (pipeline parallelism 1: one stage): the micro-batch
    with TE's waits for its copies (cpu_offload.py ``pass_with_copies``), its layers alike, each backward twice
    its forward (an ASSUMPTION of this bound), each copy the offloaded layers' mean."""
    k = offloaded_layers(sc)
    if k:
        node = sc.cluster.node
        assert node is not None  # estimate_iteration checked it
        copy = offloaded_bytes(sc, m) / k / node.host_bandwidth
        n = m.layers
        return [max(t, pass_with_copies(t / (3 * n), 2 * t / (3 * n), copy, n, k)) for t in stage_t]
    moe, dense = layer_offload(sc, m)
    if not moe + dense:
        return stage_t
    node = sc.cluster.node
    assert node is not None  # estimate_iteration checked it
    rate = node.host_bandwidth
    plan = chunk_plan_of(sc, m)
    vee = sc.parallel.schedule in V_SHAPED
    copies = [((split.count(s) - split.leads[s]) * moe + split.leads[s] * dense
               + (m.mtp_num_layers * moe if s == split.mtp else 0.0)) * offload_share(sc, m, plan, s, vee) / rate
              for s in range(len(stage_t))]
    return [max(t, c) for t, c in zip(stage_t, copies)]


def _passes(gpu: GpuSpec, comm: tuple[tuple[str, int, Link], ...],
            ep: EpNodes | None, host: HostCost = NO_HOST, moe: bool = False) -> Callable[[list, list], float]:
    """A forward's and a backward's steps priced together (``kernel_cost.pass_time``): the CP ring's
    steps as sends, a token exchange on the expert group as its plan runs alone, the rest as rings. With
    ``host`` (``HostCost``), the seconds the host takes to issue them instead (workload/host.py; ``moe``: the
    steps are an MoE layer's)."""
    groups = {name: (n, link) for name, n, link in comm}

    def comm_time(c: Ly.Comm) -> float:
        n, link = groups[c.group]
        if c.collective == "ring":
            return ring_time("p2p", 2, c.bytes, link)
        if ep is not None and c.group == "ep" and is_token_exchange(c.collective):
            return exchange_time(c.collective, c.bytes, ep)
        return ring_time(c.collective, n, c.bytes, link)

    def one(steps: list) -> float:
        return HOST.issue_time(steps, host[0], host[1], moe, host[2]).total if host[0] > 0 else \
            KC.pass_time(steps, gpu, comm_time)

    def both(fwd: list, bwd: list) -> float:
        return one(fwd) + one(bwd)

    return both


@functools.lru_cache(maxsize=4096)
def pass_times(L: Ly.LayerShape, recompute: str, learned_positions: bool, vocab: int, gpu: GpuSpec,
               comm: tuple[tuple[str, int, Link], ...], modules: tuple[str, ...] | None = None,
               ep: EpNodes | None = None, host: HostCost = NO_HOST) -> tuple[float, float, float]:
    """(layer, embedding, head) forward + backward of one micro-batch, by ``kernel_cost.pass_time``.
    ``comm`` is (group, size, link) for tp, cp and ep; ``modules`` the recompute_modules (plan.py
    ``layer_backward``); ``ep`` the expert-parallel group on its nodes, whose token exchanges are priced
    as their plans run alone (studies/exchange_cost.py); with ``host`` (the host's launch cost and captured
    modules), the host's seconds to issue them instead. Cached: a search's layouts share few shapes."""
    layer = _passes(gpu, comm, ep, host, bool(L.experts))
    other = _passes(gpu, comm, ep, host)
    return (layer(Ly.forward_steps(L), layer_backward(L, recompute, modules)),
            other(Ly.embedding_forward(L, learned_positions), Ly.embedding_backward(L)),
            other(Ly.head_forward(L, vocab), Ly.head_backward(L, vocab)))


@functools.lru_cache(maxsize=4096)
def extra_times(L: Ly.LayerShape, recompute: str, learned_positions: bool, vocab: int, gpu: GpuSpec,
                comm: tuple[tuple[str, int, Link], ...], modules: tuple[str, ...] | None = None,
                ep: EpNodes | None = None, mtp: int = 0, lead: bool = False,
                host: HostCost = NO_HOST) -> tuple[float, float, float]:
    """(a leading dense layer of an MoE model, the ``mtp`` MTP modules, the output head's passes over their
    hidden states) forward + backward of one micro-batch, as workload/plan.py's units (``Ly.dense_shape``;
    mtp.py's ``mtp_forward`` around the decoder's last layer's kind: an MoE one where there are experts, as
    first_dense_layers < layers); 0 where there is none. Arguments as :func:`pass_times`."""
    dense = 0.0
    if lead:
        Ld = Ly.dense_shape(L)
        dense = pass_times(Ld, recompute, learned_positions, vocab, gpu, comm, modules, ep, host)[0]
    if not mtp:
        return dense, 0.0, 0.0
    both = _passes(gpu, comm, ep, host)
    fwd, bwd = Ly.forward_steps(L), layer_backward(L, recompute, modules)
    module = both(MTP.mtp_forward(L, fwd, learned_positions), MTP.mtp_backward(L, bwd))
    return dense, mtp * module, both(MTP.mtp_head_forward(L, vocab, mtp), MTP.mtp_head_backward(L, vocab, mtp))


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of their positions."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation ρ (Pearson's r of the ranks); None below 3 pairs or with a constant side."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    n = len(rx)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return None
    return float(cov / (vx * vy) ** 0.5)


def _estimate_profiled(sc: Scenario) -> Estimate:
    """The closed form of a profiled workload (workload/profiled.py): its own kernels at the
    scenario's per-GPU shape, the GPU's idle time waiting on the script's host (the ``host``
    kernels of ``profiled._parts``) and Megatron's tensor-parallel all-reduces, priced per part as
    generated layers are; the optimizer step at the profile's seconds per parameter; the DDP gradient
    reduction in the script's gradient type (``profiled.grad_bytes``)."""
    from emulator.devices import reshape as R
    from emulator.workload import profiled as PW

    par, tr = sc.parallel, sc.training
    node = sc.cluster.node
    assert node is not None and sc.model is not None
    prof = PW.profile_of(sc)
    Q = PW.target_shape(sc).per_gpu(par.tp)
    parts: dict[str, list] = dict(PW._parts(prof, Q, node.gpu, PW.source_gpu(sc, prof)))
    if par.tp > 1:
        parts = PW._tp_comms(parts, Q, prof.param_bytes)
    st = strides(sc)
    tp_link = group_link(sc, st["tp"], par.tp)

    def comm_time(c: Ly.Comm) -> float:
        return ring_time(c.collective, par.tp, c.bytes, tp_link)

    def both(fwd: str, bwd: str) -> float:
        return KC.pass_time(parts[fwd], node.gpu, comm_time) + KC.pass_time(parts[bwd], node.gpu, comm_time)

    per_layer, embed, head = both("block_fwd", "block_bwd"), both("embed_fwd", "embed_bwd"), \
        both("head_fwd", "head_bwd")
    p, v = par.pp, par.virtual_stages
    vee = par.schedule in V_SHAPED  # a V: the head on the first stage (scenario/stages.py)
    last = rank_of(p * v - 1, p, vee)
    split = Split(stage_layers(model_chunks(Q.layers, p, v, par.first_chunk_layers, par.last_chunk_layers,
                                            par.pipeline_model_parallel_layout).layers, p, vee), (0,) * p)
    stage_t = _per_rank(par.schedule, [split.count(s) * per_layer + (embed if s == 0 else 0.0)
                                       + (head if s == last else 0.0) for s in range(p)])
    micro = max(1, tr.global_batch // (tr.micro_batch * par.dp))
    slow = max(stage_t)
    fill = (sum(stage_t) - slow) * _fill_share(par.schedule, v, p)
    pp_bytes = float(Q.b * Q.s * Q.h * prof.param_bytes)
    p2p = ring_time("p2p", 2, pp_bytes, group_link(sc, st["pp"], 2)) if p > 1 else 0.0
    table = Q.V * Q.h if prof.tied and head_apart(par) else 0
    params = Params(R.params(prof.block_params, Q), 0.0, R.params(prof.embed_params, Q),
                    R.params(prof.head_params, Q) + table)
    m = replace(sc.model, tied_embeddings=prof.tied, vocab=Q.V * par.tp)
    grad = PW.grad_bytes(sc, prof)
    dp_comm_s = _dp_exposed(sc, m, params, split, stage_t, micro, st, grad, prof.param_bytes)
    total = params.layer_dense * Q.layers + params.first + params.last  # one GPU's tensor-parallel share
    per_param = sum(t.seconds for t in parts["optimizer"]) / total if total else 0.0
    d = par.dp * par.cp
    optimizer_s = max(params.rank(split, s, par)[0] / (d if par.zero >= 1 else 1) for s in range(p)) * per_param
    bubble_s = max(0.0, fill) + 2 * (p * v - 1) * p2p
    compute_s = micro * slow
    return Estimate(compute_s + bubble_s + dp_comm_s + optimizer_s, compute_s, bubble_s, dp_comm_s, optimizer_s)


def group_link_of(sc: Scenario, group: Sequence[int]) -> Link:
    """The path class of the ranks ``group`` (ranks fill nodes in order): NVLink inside one node, else the
    NICs with as many rings as the group has members on a node."""
    node = sc.cluster.node
    assert node is not None
    per: dict[int, int] = {}
    for r in group:
        per[r // node.gpus_per_node] = per.get(r // node.gpus_per_node, 0) + 1
    return intra_link(node) if len(per) == 1 else inter_link(sc, max(per.values()), len(per))


def _dp_exposed(sc: Scenario, m: ModelSpec, params_: Params, split: Split, stage_t: list, micro: int,
                st: dict[str, int], grad: int | None = None, dtype: float | None = None) -> float:
    """Exposed data-parallel communication of the rank with the most parameters (with dualpipe its two
    stages', and the pair's gradient all-reduce), plus the tied embedding all-reduce between the first and
    last stage (``grad``, ``dtype``: bytes of a reduced gradient and of a weight; absent, by the training
    precision). The dense parameters reduce over the dp·cp ranks, the experts' over their expert-data-parallel
    group (tp·dp·cp / (etp·ep) ranks, placement.py ``edp_group``), one after the other."""
    par, tr = sc.parallel, sc.training
    p = par.pp
    d = par.dp * par.cp
    grad = grad_reduce_bytes(tr.precision, tr.grad_reduce) if grad is None else grad
    if dtype is None:  # a weight as gathered: bf16 in a quantised run but with fp8_params (plan.Plan.gathered)
        dtype = (param_gather_bytes(tr) or 2) if tr.precision in QUANTISED else DTYPE_BYTES[tr.precision]
    dp_link = group_link(sc, min(st["dp"], st["cp"]) if par.cp > 1 else st["dp"], d)
    edp = Layout.from_parallel(par, sc.gpus, par.order or None).edp_group(0) if params_.layer_expert else ()
    worst = 0.0
    for s in range(p):
        dense, expert = params_.rank(split, s, par)
        if par.zero >= 3:  # every unit's weights gathered and reduced: the experts' over their expert-DP group
            if par.num_distributed_optimizer_instances > 1:
                t = _hsdp(sc, params_, (dense, expert), edp, grad, dtype, micro, stage_t[s], s)
            else:
                groups = ((dense, params_.layer_dense, d, dp_link),
                          (expert, params_.layer_expert, len(edp),
                           group_link_of(sc, edp) if len(edp) > 1 else dp_link))
                per_mb, t = _zero3(sc, s, groups, grad, dtype, micro)
                t += micro * max(0.0, per_mb - stage_t[s])  # hidden under the micro-batch's compute
        else:
            t = _reduction(sc, params_, split, s, 0, dense, d, dp_link, grad)
            if expert and len(edp) > 1:  # the experts' gradients over their own group, after the dense ones
                t += _reduction(sc, params_, split, s, 1, expert, len(edp), group_link_of(sc, edp), grad)
            if par.zero in (1, 2):  # the updated weights: the experts' over their expert-DP group
                t += _param_gather(dense * dtype, d, dp_link, par)
                if expert and len(edp) > 1:
                    t += _param_gather(expert * dtype, len(edp), group_link_of(sc, edp), par)
        worst = max(worst, t)
    if m.tied_embeddings and head_apart(par):
        worst += ring_time("all_reduce", 2, m.vocab * m.hidden / par.tp * dtype,
                           group_link(sc, st["pp"] * (p - 1), 2))
    return worst


def _pair_link(sc: Scenario, s: int) -> Link:
    """dualpipe: the link between pipeline ranks s and p − 1 − s."""
    return group_link(sc, strides(sc)["pp"] * abs(sc.parallel.pp - 1 - 2 * s), 2)


def _zero3(sc: Scenario, s: int, groups: tuple[tuple[float, float, int, Link], ...], grad: int, dtype: float,
           micro: int) -> tuple[float, float]:
    """(traffic per micro-batch, the rest exposed) of ZeRO-3 on pipeline rank ``s``, whose ``groups`` are (its
    parameters, a layer's, the ranks that shard them, their link): the dense over dp·cp, the experts over their
    expert-DP group (workload/builder.py ``_zero3_groups``). Each micro-batch gathers its weights twice (forward,
    backward) and reduce-scatters their gradients; each task's first unit waits for its own gather (the next ones
    are prefetched); dualpipe adds the pair's all-reduce of the shards after the flush."""
    par = sc.parallel
    held = len(held_stages(par, s))
    per_mb = rest = pair = 0.0
    for params, layer, n, link in groups:
        pair += params * grad / max(1, n)  # the pair's shards (builder.py ``_mirror_allreduce``)
        if not params or n < 2:
            continue
        one = params / held  # a task runs one of the held stages: their mean (ring_time is affine in bytes)
        per_mb += 2 * ring_time("all_gather", n, one * dtype, link) + ring_time("reduce_scatter", n, one * grad, link)
        rest += micro * 2 * par.virtual_stages * ring_time("all_gather", n, layer * dtype, link)
    if held > 1:
        rest += ring_time("all_reduce", 2, pair, _pair_link(sc, s))
    return per_mb, rest


def _hsdp(sc: Scenario, params_: Params, held: tuple[float, float], edp: Sequence[int], grad: int, dtype: float,
          micro: int, stage_s: float, s: int) -> float:
    """Exposed HSDP traffic of pipeline rank ``s`` holding ``held`` (dense, expert) parameters, as workload/
    builder.py emits it: ZeRO-3 within each instance (:func:`_zero3`, the part above the micro-batch's compute
    exposed), then once a step each gradient shard reduced across the instances, beside the backward's tail but the
    last layer's (whole without overlap_grad_reduce), and, with outer sharding, the updated shards all-gathered
    across the instances in the first micro-batch's forward, before each unit's gather (``_hsdp_gather``): the part
    of that micro-batch's traffic above its compute exposed, and a chunk's first layer's whole."""
    par = sc.parallel
    k, optim = par.num_distributed_optimizer_instances, par.outer_dp_sharding_strategy == "optim"
    lay = Layout.from_parallel(par, sc.gpus, par.order or None)
    dpcp = lay.dp_cp_group(0)
    groups, outer, gather, first = [], 0.0, 0.0, 0.0
    for params, layer, group in ((held[0], params_.layer_dense, dpcp), (held[1], params_.layer_expert, tuple(edp))):
        inner, across = hsdp_groups(group, k, group[0]) if group else ((), ())
        if not params or not inner:
            continue
        link = group_link_of(sc, inner) if len(inner) > 1 else group_link_of(sc, group)
        groups.append((params, layer, len(inner), link))
        if len(across) > 1:
            shard, out_link = params / len(inner), group_link_of(sc, across)
            tail = layer / len(inner) if par.overlap_grad_reduce else shard
            outer += ring_time("reduce_scatter" if optim else "all_reduce", len(across), tail * grad, out_link)
            if optim:
                gather += ring_time("all_gather", len(across), shard * dtype, out_link)
                first += ring_time("all_gather", len(across), layer / len(inner) * dtype, out_link)
    per_mb, t = _zero3(sc, s, tuple(groups), grad, dtype, micro)
    mb0 = max(0.0, per_mb + gather - stage_s) - max(0.0, per_mb - stage_s) + par.virtual_stages * first
    return t + micro * max(0.0, per_mb - stage_s) + outer + (mb0 if gather else 0.0)


def _reduction(sc: Scenario, params_: Params, split: Split, s: int, which: int, params: float, d: int,
               link: Link, grad: int) -> float:
    """Exposed gradient reduction (ZeRO 0-2) of pipeline rank ``s``'s dense (``which`` 0) or expert (1)
    ``params`` over ``d`` ranks on ``link``: the last bucket with ``overlap_grad_reduce``, else all of it;
    dualpipe first all-reduces over the pair, per chunk from the chunk's last backward
    (workload/builder.py ``_mirror_per_chunk``) with the overlap: the chunk that finishes last, stage
    min(s, p − 1 − s) (DualPipeV's phase 0 on both ranks of the pair), exposed whole; else both."""
    par = sc.parallel
    op = "all_reduce" if MU.all_reduces(sc.training, par) else "reduce_scatter"
    if len(held_stages(par, s)) > 1:
        k = min(s, par.pp - 1 - s)
        tail = params_.stage(split, k, par.pp)[which] if par.overlap_grad_reduce else params
        return ring_time("all_reduce", 2, tail * grad, _pair_link(sc, s)) + ring_time(op, d, tail * grad, link)
    t = ring_time(op, d, params * grad, link)
    if par.overlap_grad_reduce and params * grad > par.grad_bucket:
        t *= par.grad_bucket / (params * grad)  # only the last bucket is exposed
    return t


def _param_gather(nbytes: float, d: int, link: Link, par: ParallelSpec) -> float:
    """ZeRO 1-2: the all-gather of the updated weights, under the next forward but its first bucket with
    ``overlap_param_gather``."""
    gather = ring_time("all_gather", d, nbytes, link)
    overlap = par.overlap_grad_reduce if par.overlap_param_gather is None else par.overlap_param_gather
    if overlap and nbytes > par.grad_bucket:
        gather *= par.grad_bucket / nbytes
    return gather


def _optimizer(sc: Scenario, params: Params, split: Split, gpu: GpuSpec) -> float:
    """The Adam step of the rank with the most local parameters (workload/builder.py's cost); with Megatron-Core's
    Muon its matrices' stream, Newton–Schulz iterations and TP momentum all-gathers (:func:`_muon_step`)."""
    par = sc.parallel
    d = par.dp * par.cp
    best = 0.0
    for s in range(par.pp):
        dense, expert = params.rank(split, s, par)
        psi = dense / (d if par.zero >= 1 else 1) + expert / (max(1, d // par.ep) if par.zero >= 1 else 1)
        if MU.is_muon(sc.training):
            best = max(best, _muon_step(sc, s, psi, gpu))
            continue
        best = max(best, compute.elementwise_time(psi * adam_step_bytes(sc.training), gpu))
    return best


def _muon_step(sc: Scenario, r: int, psi: float, gpu: GpuSpec) -> float:
    """Pipeline rank ``r``'s step under Megatron-Core's Muon, as workload/builder.py emits it: the elementwise
    stream of its ``psi`` local parameters (Muon's matrices at muon.MUON_STEP_BYTES, the rest at Adam's), then the
    TP all-gathers of the momenta (duplicated mode) and its share of the Newton–Schulz iterations (muon.rank_ns)
    of its model chunks' matrices (memory.muon_chunks)."""
    par, tr = sc.parallel, sc.training
    assert sc.model is not None
    m = M.resolve(sc.model)
    chunks = muon_chunks(sc, m, held_stages(par, r))
    d, d_exp = par.dp * par.cp, expert_dp(par)
    dense, expert = MU.muon_params(tuple(x for c in chunks for x in c.matrices))
    mine = dense / (d if par.zero >= 1 else 1) + expert / (d_exp if par.zero >= 1 else 1)
    nbytes, _ = MU.step_bytes_and_flops(psi - mine, mine, adam_step_bytes(tr), 0.0, tr)
    ns = MU.rank_ns(chunks, tr, par, gpu, d, d_exp,
                    MU.layout_bucket(par, grad_reduce_bytes(tr.precision, tr.grad_reduce)))
    tp_link = group_link(sc, strides(sc)["tp"], par.tp)
    gather = max((ring_time("all_gather", par.tp, b, tp_link) for b in (ns.tp_gather, ns.etp_gather) if b),
                 default=0.0)  # the two streams run side by side
    return compute.elementwise_time(nbytes, gpu) + gather + ns.seconds

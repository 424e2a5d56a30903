"""Memory per GPU: model states, activations and workspace, and whether they fit.

Model states (mixed-precision Adam, Rajbhandari et al. 2020): 2 bytes of bf16 weight,
g bytes of gradient and 12 of fp32 master weight, momentum and variance per parameter (10 with
``training.optimizer: apex``, whose master is a 16-bit remainder; less with Megatron-Core's precision-aware
optimizer: workload/optimizer.py ``optimizer_state_bytes``; with Megatron-Core's Muon, ``training.optimizer``
muon or dist_muon, 8 for the weight matrices it orthogonalises: workload/muon.py),
with Ψ = parameters on this GPU after TP/PP/EP sharding and d = the ranks that share them
(DP·CP for dense weights, as Megatron's distributed optimizer; DP·CP/EP for experts, or with MoE
parallel folding TP·DP·CP/(ETP·EP), the expert grid's expert-DP; experts split over ETP, not TP):
    ZeRO-0 (14 + g)Ψ,  ZeRO-1 (2 + g)Ψ + 12Ψ/d,  ZeRO-2 2Ψ + (12 + g)Ψ/d,  ZeRO-3 (14 + g)Ψ/d.
The gradient lives in Megatron-Core's main_grad buffer, whose type is that of the
data-parallel reduction (``training.grad_reduce``): g = 4 with fp32, Megatron-LM's default
for bf16 training (megatron/training/arguments.py, Megatron-Core 0.20.0: "bfloat16
requires gradient accumulation and all-reduce to be done in fp32"); g = 2 with bf16, as
NeMo's Nemotron-4 340B recipe sets (nemo/collections/llm/recipes/nemotron4_340b.py:
grad_reduce_in_fp32 = False). Until this version g was 2 whatever the reduction.

Activations of one layer and one micro-batch: workload/activations.py (Korthikanti et al.'s terms, counted
term by term). A stage that holds one of an MoE model's dense leading layers is charged the larger of the
dense and the MoE layer's activations for each of its layers (an upper bound). A stage holds as many
micro-batches (model chunks, interleaved) as its schedule has in flight at the worst moment (1F1B: p − s on
stage s; GPipe: m; interleaved: Megatron's p·(1 + (p − 1)/(p·v)) chunks' worth on stage 0), read off the
schedule itself; each in-flight chunk counts its own layers, so an uneven split (scenario/stages.py) lightens
the stages it lightens. Stage 0's in-flight count is Megatron's warm-up (megatron/core/pipeline_parallel/
schedules.py lines 696-701 at 791b70e0) plus the one forward that 1F1B runs before its first backward; the
current version says the same (get_pp_rank_microbatches @ d98e8a64dd, lines 964-978: (p − r − 1)·2 + (v − 1)·g
with g = microbatch_group_size_per_vp_stage, p by default, capped at the m·v chunk passes there are). For
NeMo's Nemotron-4 340B layout (p 8, v 12, m 16) stage 0 holds 14 + 88 = 102 (< 16·12 = 192, so the cap
does not bind) + 1 = 103 one-layer chunks. fp8 weights: :func:`fp8_weight_bytes` (``training.fp8_params``).

Fine-grained activation offloading (``training.offload_modules``, workload/offload.py): what the listed
modules save leaves each layer in flight for host memory, but three layers' worth (OFFLOAD_RESIDENT_LAYERS).
Layer-wise CPU offloading (``training.cpu_offloading``, workload/cpu_offload.py): K of the layers in flight are on
the host, as Transformer Engine's synchronizer keeps the forward's activations to (L − K) layers' worth.

Workspace: WORKSPACE_BYTES for the CUDA context, cuBLAS workspace and NCCL buffers, with
``tp_comm_overlap`` TE's Userbuffers (:func:`userbuffers_bytes`), with all-gather CP the backward's gathered
K/V and their gradients (:func:`cp_gather_bytes`), with the flex dispatcher DeepEP's or HybridEP's buffers
(:func:`deepep_bytes`, :func:`hybridep_bytes`),
plus with ZeRO-3 the gathered bf16 weights of two layers (the one running and the
prefetched one), plus on the last stage the fp32 logits of one micro-batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from emulator.scenario import deepep_buffers as DEEPEP
from emulator.scenario import hybridep_buffers as HYBRIDEP
from emulator.scenario.spec import QUANTISED, ModelSpec, ParallelSpec, Scenario, TrainingSpec
from emulator.scenario.stages import V_SHAPED, ChunkPlan, model_chunks, rank_of, stage_layers
from emulator.workload import hybrid, routing
from emulator.workload import models as M
from emulator.workload import mtp as MTP
from emulator.workload import muon as MU
from emulator.workload.activations import (
    differing_layer_bytes,
    hybrid_layer_bytes,
    layer_activation_bytes,
    scenario_layer_bytes,
)
from emulator.workload.cpu_offload import offloaded_layers
from emulator.workload.layer import BLOCK_WEIGHT_COPY, MXFP8_COPY, NVFP4_WEIGHT_COPY, recipe_of
from emulator.workload.offload import OFFLOAD_RESIDENT_LAYERS, layer_offload, offload_share
from emulator.workload.optimizer import optimizer_state_bytes
from emulator.workload.plan import grad_reduce_bytes, non_tn_fp8
from emulator.workload.schedules import max_in_flight, schedule

if TYPE_CHECKING:
    from emulator.devices.reshape import Shape
    from emulator.importers.profile import Profile

# ASSUMPTION: CUDA context (~0.5 GiB, no source on disk) + cuBLAS workspace (TE: 32 MiB on Hopper, 4 MiB
# before, TransformerEngine 3b2a7b00 transformer_engine/pytorch/module/base.py lines 55-58, three of them
# with Userbuffers, line 266) + NCCL buffers (Simple protocol 4 MiB per channel and peer: NCCL 5067397c
# src/init.cc line 813, DEFAULT_BUFFSIZE) come to about 1 GiB per GPU in Megatron-style runs.
WORKSPACE_BYTES = 2**30
ADAM_STATE_BYTES = 12  # fp32 master weight, momentum, variance (workload/optimizer.py)
# TE's Userbuffers (parallel.tp_comm_overlap): Megatron registers one buffer of the global (s·b/cp) × h shape per
# overlapped GEMM (Megatron-LM training/initialize.py _initialize_tp_communicators @ d98e8a64dd), 12 at TE d0067d0da
# (module/base.py lines 336-360: 4 ring exchange, 2 pipeline, 4 bulk, 2 external); bf16 (initialize_ub's dtype),
# but under FP8 the 8 all-gather ones hold one byte an element (fp8_buf, buffer_dtype uint8), and an FP8 run with
# BF16 first/last layers registers the BF16 set as well (quantization_modes FP8 and NONE).
UB_BUFFERS, UB_AG_BUFFERS = 12, 8
WEIGHT_BYTES = 2  # bf16 weight


@dataclass(frozen=True)
class MemoryReport:
    peak_bytes_per_gpu: float
    capacity_bytes: float
    fits: bool
    breakdown: dict = field(default_factory=dict)  # params, grads, optimizer, activations, workspace
    stage: int = 0  # the pipeline stage with the peak
    stash_bytes: float = 0.0  # of the activations, the paged stash's GPU pages (model.moe_paged_stash)
    host_bytes: float = 0.0  # pinned host memory per GPU: the paged stash's host buffer, CPU-offloaded layers


def model_state_bytes(psi: float, d: int, zero: int, grad_bytes: int = 2,
                      state_bytes: float = ADAM_STATE_BYTES, instances: int = 1, outer_shard: bool = False) -> dict:
    """{'params', 'grads', 'optimizer'} bytes for Ψ parameters shared by d ranks under ZeRO ``zero``,
    gradients held in ``grad_bytes``-byte elements (the main_grad buffer's type), ``state_bytes`` of
    optimizer state per parameter (:func:`optimizer_state_bytes`). HSDP (``instances`` > 1, ZeRO 3): weights and
    gradients sharded over the d/instances ranks of an instance, the states too, or with ``outer_shard``
    (outer_dp_sharding_strategy optim) over all d."""
    inner = d // instances if instances > 1 and d >= instances else d
    params = WEIGHT_BYTES * psi / (inner if zero >= 3 else 1)
    grads = grad_bytes * psi / (inner if zero >= 2 else 1)
    optim = state_bytes * psi / ((d if outer_shard else inner) if zero >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer": optim}


def _stage_params(m: ModelSpec, sc: Scenario, stage: int, layers: float) -> tuple[float, float]:
    """(dense, expert) parameters held by one GPU of pipeline stage ``stage``, which holds ``layers``."""
    r = M.resolve(m)
    par = sc.parallel
    t = par.tp
    if hybrid.is_hybrid(r):
        dense, expert = _hybrid_layer_params(r, par, _layers_of(sc, stage))
        return _with_ends(r, par, stage, dense), expert
    biases = M.has_biases(r)
    rep = M.replicated_attention_params(r)  # MLA's down projections, DSA's indexer: whole on every TP rank
    attn = M.attention_params(r) - (r.hidden if biases else 0) - rep
    dense = attn / t + rep + (r.hidden if biases else 0) + M.norm_params(r)
    mlp = M.mlp_params(r) - (r.hidden if biases else 0)
    mlp_gpu = mlp / t + (r.hidden if biases else 0)
    expert = 0.0
    lead = _dense_layers_of(sc, stage) if r.experts else 0
    if r.experts:
        shared = M.mlp_of_width(r, M.shared_ffn(r)) / t if r.shared_experts else 0.0
        one = M.expert_params(r) - (r.hidden if biases else 0)
        moe_dense = dense + r.hidden * r.experts + shared + M.latent_params(r)  # router, projections: replicated
        expert = (one / (par.etp or t) + (r.hidden if biases else 0)) * r.experts / par.ep  # etp: experts' TP
        dense = moe_dense * (layers - lead) + (dense + mlp_gpu) * lead
        expert *= layers - lead
    else:
        dense += mlp_gpu
        dense *= layers
    return _with_ends(r, par, stage, dense), expert


def _with_ends(r: ModelSpec, par: ParallelSpec, stage: int, dense: float) -> float:
    """``dense`` plus the embedding on stage 0 and the head (with a word embedding it does not share) on the
    head's stage."""
    t = par.tp
    if stage == 0:
        dense += r.vocab * r.hidden / t + (r.seq_len * r.hidden if M.learned_positions(r) else 0)
    head = head_stage(par)
    if stage == head:
        dense += M.head_params(r) - r.vocab * r.hidden * (0 if r.tied_embeddings else 1)
        # tied on the embedding's rank (pp 1, a V; dualpipe's end ranks hold an embedding and a head, of the
        # two copies, which the pair's all-reduce keeps equal): one shared weight
        if not r.tied_embeddings or (head != 0 and par.schedule != "dualpipe"):
            dense += r.vocab * r.hidden / t
    return dense


def _hybrid_layer_params(r: ModelSpec, par: ParallelSpec, layers: list[int]) -> tuple[float, float]:
    """(dense, expert) parameters one GPU holds of a hybrid model's ``layers``: each part's over tp but its pre-norm
    (whole on every rank) and an E layer's router (replicated, as _stage_params counts it); the routed experts over
    etp·ep."""
    t = par.tp
    norm = M.norm_params(r) / 2
    dense = expert = 0.0
    for i in layers:
        part = M.layer_parts(r, i)
        own = M.part_params(r, part) - norm
        if part == hybrid.MOE:  # the router and the latent projections on every rank
            whole = r.hidden * r.experts + M.latent_params(r)
            dense += (own - whole) / t + whole + norm
            expert += M.routed_params(r) / ((par.etp or t) * par.ep)
        else:
            dense += own / t + norm
    return dense, expert


def _mtp_stage_params(r: ModelSpec, par: ParallelSpec, mtp: int, embedding_copy: bool) -> tuple[float, float]:
    """(dense, expert) parameters one GPU holds for ``mtp`` MTP modules (workload/mtp.py): each a layer
    of the last decoder layer's kind, eh_proj 2h·h/t and three norms, and a copy of the word embedding
    V·h/t when the stage is not the embedding's (a hybrid model's: a layer of its MTP depth's symbols)."""
    moe = M.is_moe_layer(r, r.layers + 1 if hybrid.is_hybrid(r) else r.layers - 1)
    norms = MTP.mtp_extra_params(r) - 2 * r.hidden * r.hidden
    layer = M.shared_layer_params(r, r.layers + 1) if hybrid.is_hybrid(r) else M.dense_layer_params(r, moe)
    rep = M.replicated_attention_params(r)  # whole on every TP rank (_stage_params)
    dense = (layer - rep) / par.tp + rep + 2 * r.hidden * r.hidden / par.tp + norms
    expert = M.routed_params(r) / ((par.etp or par.tp) * par.ep) if moe else 0.0
    return mtp * dense + (r.vocab * r.hidden / par.tp if mtp and embedding_copy else 0.0), mtp * expert


def held_stages(par: ParallelSpec, stage: int) -> list[int]:
    """The pipeline stages (of the model's split) whose parameters pipeline rank ``stage`` holds: its own,
    or with dualpipe its own and pp − 1 − stage's (deepseek-ai/DualPipe examples/example_dualpipe.py:
    ``local_full_modules = nn.Sequential(full_modules[rank], full_modules[pp_size - 1 - rank])``)."""
    return [stage, par.pp - 1 - stage] if par.schedule == "dualpipe" else [stage]


def head_stage(par: ParallelSpec) -> int:
    """The pipeline stage that holds the LM head: the last, or under a V-shaped schedule the first."""
    return rank_of(par.pp * par.virtual_stages - 1, par.pp, par.schedule in V_SHAPED)


def chunk_plan_of(sc: Scenario, m: ModelSpec) -> ChunkPlan:
    """What each virtual stage holds (scenario/stages.py ``model_chunks``)."""
    par = sc.parallel
    return model_chunks(m.layers, par.pp, par.virtual_stages, par.first_chunk_layers, par.last_chunk_layers,
                        par.pipeline_model_parallel_layout, M.resolve(m).mtp_num_layers)


def _stage_linear_params(m: ModelSpec, sc: Scenario, stage: int, layers: float) -> tuple[float, float]:
    """(dense, expert) GEMM weights of the transformer layers held by one GPU of pipeline stage
    ``stage`` (as :func:`_stage_params`, without embeddings, head, norms, biases and routers)."""
    r = M.resolve(m)
    par = sc.parallel
    if hybrid.is_hybrid(r):
        mine = _layers_of(sc, stage)
        moe = sum(M.is_moe_layer(r, i) for i in mine)
        whole = 2 * r.hidden * r.moe_latent_size  # an E layer's latent projections, whole on every rank
        dense = (sum(M.part_linear(r, M.layer_parts(r, i)) for i in mine) - moe * whole) / par.tp + moe * whole
        return dense, moe * M.expert_linear(r) * r.experts / par.ep / (par.etp or par.tp) if r.experts else 0.0
    attn_w, per_width = M.linear_weights(r)
    attn = float(attn_w)
    if M.layers_differ(r):  # each layer's own attention (its ratio, its indexer): their mean over the stage's
        mine = _layers_of(sc, stage)
        attn = sum(M.linear_weights(r, i)[0] for i in mine) / len(mine) if mine else attn
    lead = _dense_layers_of(sc, stage) if r.experts else 0
    dense_layer = (attn + per_width * r.ffn_hidden) / par.tp
    if not r.experts:
        return dense_layer * layers, 0.0
    moe_layer = (attn + (per_width * M.shared_ffn(r) if r.shared_experts else 0)) / par.tp \
        + 2 * r.hidden * r.moe_latent_size  # the latent projections, whole on every rank
    experts = M.expert_linear(r) * r.experts / par.ep / (par.etp or par.tp)
    return dense_layer * lead + moe_layer * (layers - lead), experts * (layers - lead)


def quant_weight_bytes(linear: float, recipe: str, fp8_params: bool, non_tn: bool = False) -> float:
    """Bytes that a quantised recipe (layer.py) adds to (or, negative, takes from) the bf16 weights of
    ``linear`` GEMM weights. Per-tensor FP8 (delayed, tensorwise): :func:`fp8_weight_bytes`, less the
    cached transpose on a GPU that makes none (``non_tn``: Blackwell, layer.py). MXFP8: TE caches a
    row-wise and a column-wise copy, each with an E8M0 scale per 32 elements (transformer_engine/
    pytorch/tensor/mxfp8_tensor.py @ d0067d0: both usages made from the high-precision weight),
    2·(1 + 1/32) B; with ``fp8_params`` those copies are the parameters, in place of the 2-byte bf16
    weight. NVFP4: both copies of 4-bit values with an E4M3 scale per 16×16 block, 2·(1/2 + 1/256) B."""
    if recipe == "mxfp8":
        return (2 * MXFP8_COPY - (2.0 if fp8_params else 0.0)) * linear
    if recipe == "blockwise":  # Float8BlockScaling: both copies, a 128x128 block's fp32 scale each
        return (2 * BLOCK_WEIGHT_COPY - (2.0 if fp8_params else 0.0)) * linear
    if recipe == "nvfp4":  # with fp4_param (passed as fp8_params) the copies are the parameters
        return (2 * NVFP4_WEIGHT_COPY - (2.0 if fp8_params else 0.0)) * linear
    if non_tn:
        return (-1.0 if fp8_params else 1.0) * linear
    return fp8_weight_bytes(linear, fp8_params)


def fp8_weight_bytes(linear: float, fp8_params: bool) -> float:
    """Bytes that fp8 adds to (or, negative, takes from) the bf16 weights of ``linear`` GEMM weights:
    -1 B each when they are stored in fp8 (NeMo's fp8_params: TE Float8Tensor parameters, which
    Megatron-Core 0.11's DDP keeps in a uint8 buffer, megatron/core/distributed/distributed_data_parallel.py
    lines 115-122 at Megatron-LM 791b70e0); else +2 B each, TE's fp8 copy of each bf16 weight and its
    transpose, cached across micro-batches (TransformerEngine 3b2a7b00, v1.14,
    transformer_engine/pytorch/module/base.py lines 1106 and 1119; Megatron-Core passes the cache key,
    megatron/core/extensions/transformer_engine.py lines 246-247)."""
    return (-1.0 if fp8_params else 2.0) * linear


def expert_dp(par: ParallelSpec) -> int:
    """Expert-data-parallel size (``ParallelSpec.expert_dp``)."""
    return par.expert_dp()


def _layers_of(sc: Scenario, stage: int) -> list[int]:
    """The global indices of the decoder layers pipeline stage ``stage`` holds (its chunks')."""
    m, par = M.resolve(sc.model) if sc.model else None, sc.parallel
    if m is None:
        return []
    out: list[int] = []
    start = 0
    for vs, count in enumerate(chunk_plan_of(sc, m).layers):
        if rank_of(vs, par.pp, par.schedule in V_SHAPED) == stage:
            out += range(start, start + count)
        start += count
    return out


def _dense_layers_of(sc: Scenario, stage: int) -> int:
    """How many of an MoE model's dense leading layers pipeline stage ``stage`` holds."""
    m, par = M.resolve(sc.model) if sc.model else None, sc.parallel
    if m is None or not m.first_dense_layers:
        return 0
    chunks = chunk_plan_of(sc, m).layers
    n, start = 0, 0
    for vs, count in enumerate(chunks):
        if rank_of(vs, par.pp, par.schedule in V_SHAPED) == stage:
            n += max(0, min(start + count, m.first_dense_layers) - start)
        start += count
    return n


def profiled_memory(sc: Scenario) -> MemoryReport | None:
    """A profiled workload's peak memory (:func:`profiled_stages`' worst stage; None when not given)."""
    stages = profiled_stages(sc)
    return _worst(stages) if stages is not None else None


def _worst(stages: list[MemoryReport]) -> MemoryReport:
    """The stage with the peak (the first on ties)."""
    best = stages[0]
    for r in stages[1:]:
        if r.peak_bytes_per_gpu > best.peak_bytes_per_gpu:
            best = r
    return best


def profiled_stages(sc: Scenario) -> list[MemoryReport] | None:
    """A profiled workload's memory per pipeline stage, from the peak its profiled run measured
    (``workload.profiled.peak_memory``; None when not given).

    The measured peak M splits into the model states the script's optimizer keeps, the weight
    copies its forward makes, and the rest. States: torch.optim.AdamW holds the parameters, their
    gradients and two moments, all in the parameters' dtype, so states = 4·p·Ψ (p bytes an
    element; 16 B a parameter for fp32 weights; ``training.optimizer``: :func:`profiled_state_bytes`).
    Weight copies C: the forward's casts of parameter-shaped tensors (autocast's bf16 copy of each
    weight and bias, saved for the backward), read off the profile's kernels. The rest R = M −
    states − C (activations, the logits, workspaces). At the scenario's shape and layout:

    - the states are the GPU's parameters (its stage's blocks, one tensor-parallel share), sharded
      over dp as ZeRO / FSDP shard them;
    - the weight copies scale with the parameters they copy: each in-flight layer's copies at the
      GPU's share (:func:`weight_copy_bytes`), the embedding's and head's once on their stages;
    - the rest scales as activations do (Korthikanti et al. 2022, no s² term with fused attention):
      R/L per layer × (b'·s'·h')/(b·s·h), times the layers the schedule holds in flight, and
      under tensor parallelism without sequence parallelism by the share of a layer's activations
      one TP rank keeps, :func:`layer_activation_bytes` at tp over that at 1 (the norm inputs, dropout
      masks and the QKV and MLP inputs replicated, the rest split: (10 + 24/t)/34 for a GPT).
    An estimate from one measurement: the logits' share of the rest scales as activations do, not
    with the vocabulary.
    """
    from emulator.devices import reshape as R
    from emulator.workload import profiled as PW

    pr = sc.workload.profiled
    if sc.workload.profile is None or pr is None or not pr.peak_memory or sc.cluster.node is None:
        return None
    prof = PW.profile_of(sc)
    P, Q = prof.shape, PW.target_shape(sc)
    par, tr = sc.parallel, sc.training
    per = 4 * prof.param_bytes  # the profiled run's: parameter, gradient and AdamW's two moments
    w_b, g_b, o_b = profiled_state_bytes(prof.param_bytes, prof.dtype, tr.optimizer, tr.grad_reduce)
    psi_p = R.params(prof.embed_params + prof.head_params) + P.layers * R.params(prof.block_params)
    copies_p = sum(weight_copy_bytes(prof, part, P) * (P.layers if part.startswith("block") else 1)
                   for part in ("embed_fwd", "block_fwd", "head_fwd"))
    rest = max(0.0, pr.peak_memory - per * psi_p - copies_p)
    tp_share = _tp_activation_share(sc.model, Q, par.tp) if sc.model is not None else 1.0 / par.tp
    per_layer = rest / P.layers * (Q.b * Q.s * Q.h) / (P.b * P.s * P.h) * tp_share
    Qg = Q.per_gpu(par.tp)
    copies = {part: weight_copy_bytes(prof, part, Qg) for part in ("embed_fwd", "block_fwd", "head_fwd")}
    micro = max(1, tr.global_batch // (tr.micro_batch * par.dp))
    split = stage_layers(model_chunks(Q.layers, par.pp, par.virtual_stages, par.first_chunk_layers,
                                      par.last_chunk_layers, par.pipeline_model_parallel_layout).layers, par.pp,
                         par.schedule in V_SHAPED)
    out: list[MemoryReport] = []
    for stage in range(par.pp):
        stages = held_stages(par, stage)  # dualpipe: two of them
        first, last = 0 in stages, head_stage(par) in stages
        mine = tuple(n for k in stages for n in split[k])
        psi = sum(mine) * R.params(prof.block_params, Qg)
        psi += (R.params(prof.embed_params, Qg) if first else 0) + (R.params(prof.head_params, Qg) if last else 0)
        d, z = par.dp, par.zero
        states = {"params": w_b * psi / (d if z >= 3 else 1), "grads": g_b * psi / (d if z >= 2 else 1),
                  "optimizer": o_b * psi / (d if z >= 1 else 1)}
        held = max_in_flight(schedule(par.schedule, stage, par.pp, micro, par.virtual_stages,
                                      par.overlap_moe_expert_parallel_comm), mine,
                             combined=par.overlap_moe_expert_parallel_comm)
        own = (copies["embed_fwd"] if first else 0.0) + (copies["head_fwd"] if last else 0.0)
        breakdown = {**states, "activations": per_layer * held, "weight_copies": copies["block_fwd"] * held + own}
        peak = sum(breakdown.values())
        out.append(MemoryReport(peak, sc.cluster.node.gpu.memory_bytes, peak <= sc.cluster.node.gpu.memory_bytes,
                                breakdown, stage))
    return out


_PARAM_SYMBOLS = frozenset(("h", "ffn", "ffn2", "qkv", "kv", "q", "V", "hd", "heads", "kvh", ""))
_CASTS = ("aten::copy_", "aten::_to_copy", "aten::to")


def weight_copy_bytes(prof: "Profile", part: str, at: "Shape") -> float:
    """Bytes of the copies that ``part``'s forward kernels make of parameter-shaped tensors (casts
    whose every dimension is a model width, none the tokens), at shape ``at``, in the GEMMs' dtype."""
    from emulator.devices import reshape as R
    from emulator.devices.kernels import DTYPE_BYTES

    n = sum(R.elements(k.tensors[0], at) for k in getattr(prof, part)
            if k.op in _CASTS and k.tensors and all(d[0] in _PARAM_SYMBOLS for d in k.tensors[0]))
    return float(n * DTYPE_BYTES.get(prof.dtype, 2))


def _tp_activation_share(m: ModelSpec, Q: "Shape", tp: int) -> float:
    """The share of a layer's activations one of ``tp`` ranks keeps without sequence parallelism
    (fused attention, as a profiled script's SDPA runs)."""
    if tp == 1:
        return 1.0
    return layer_activation_bytes(m, Q.b, Q.s, tp, flash=True) / layer_activation_bytes(m, Q.b, Q.s, 1, flash=True)


def profiled_state_bytes(p: int, dtype: str, optimizer: str, grad_reduce: str) -> tuple[float, float, float]:
    """(weight, gradient, optimizer state) bytes per parameter of a profiled script whose weights
    are ``p``-byte elements and whose GEMMs ran in ``dtype``.

    The script's own optimizer (``training.optimizer`` absent; checks.SCRIPT_OPTIMIZER):
    torch.optim.AdamW keeps the gradient and its two moments in the weights' type: (p, p, 2p).
    ``megatron`` or ``apex`` (given; over 16-bit weights only, the rule book refuses them over fp32
    weights, which are their own main copy): the gradient in Megatron-Core's DDP buffer of the
    reduction's type (``training.grad_reduce``; auto: fp32, Megatron-LM's default for bf16 and fp16
    weights alike, plan.grad_reduce_bytes), and :func:`optimizer_state_bytes`' states: 12 B (an
    fp32 main copy, two fp32 moments), 10 with apex over bf16 weights."""
    if optimizer not in ("megatron", "apex"):
        return float(p), float(p), 2.0 * p
    grad = 4 if grad_reduce == "auto" else grad_reduce_bytes("bf16", grad_reduce)
    bf16 = dtype == "bf16"
    return float(p), float(grad), optimizer_state_bytes(TrainingSpec(precision="bf16" if bf16 else "fp16",
                                                                     optimizer=optimizer))


def memory_report(sc: Scenario) -> MemoryReport:
    """Peak memory over the pipeline stages of ``sc`` (one GPU of the worst stage)."""
    return _worst(stage_memory(sc))


def stash_summary(sc: Scenario, r: MemoryReport) -> dict[str, float | bool] | None:
    """The summary's ``memory.paged_stash`` for the report ``r`` of a run with model.moe_paged_stash (None
    without): its GPU pages and host buffer in bytes, the busiest EP rank's load over the mean (its busiest
    layer's), what of it goes to the host buffer, and whether it passes both (routing.stash_spill). The busiest
    layer's load stands for every layer in flight: an upper bound, as if one rank were the busiest in each."""
    if sc.model is None:
        return None
    m = M.resolve(sc.model)
    if not (m.experts and m.moe_paged_stash and m.moe_expert_rank_capacity_factor is not None):
        return None
    load = M.moe_rank_load(m, sc.parallel.ep, sc.training.micro_batch * (m.seq_len // sc.parallel.cp))
    host, over = routing.stash_spill(m, load)
    return {"gpu_bytes": r.stash_bytes, "host_bytes": r.host_bytes, "busiest_load": load, "spill_to_host": host,
            "overflow": over > 0}


def userbuffers_bytes(par: ParallelSpec, tr: TrainingSpec, seq_hidden: float) -> float:
    """Bytes of TE's Userbuffers on each GPU with ``tp_comm_overlap`` (see UB_BUFFERS): UB_BUFFERS of
    b·``seq_hidden`` elements (s/cp × h), 0 without the overlap or at tp 1."""
    if not par.tp_comm_overlap or par.tp == 1:
        return 0.0
    elements = tr.micro_batch * seq_hidden
    bf16 = UB_BUFFERS * 2.0 * elements
    if tr.precision not in QUANTISED:
        return bf16
    fp8 = (UB_AG_BUFFERS * 1.0 + (UB_BUFFERS - UB_AG_BUFFERS) * 2.0) * elements
    both = tr.first_last_layers_bf16 and (tr.num_layers_at_start_in_bf16 > 0 or tr.num_layers_at_end_in_bf16 > 0)
    return fp8 + (bf16 if both else 0.0)


def cp_gather_bytes(m: ModelSpec, par: ParallelSpec, tr: TrainingSpec, dtype: float) -> float:
    """The all-gather CP's transient (``cp_comm_type`` all_gather, cp > 1): the attention's backward holds the
    whole sequence's K and V, gathered again, and its dK and dV before their reduce-scatter, all four in the
    forward's dtype (TE context_parallel.py @ d0067d0da, AttnFuncWithCPAndKVAllGather.backward: dk, dv
    torch.zeros of cp·s rows, lines 3768-3777; k_ag, v_ag, lines 3788-3789): 2 · b · s · kv_l · (d_qk + d_v)
    bytes for the whole sequence s, kv_l = max(1, kv heads / tp) (MLA: every head). The forward's K/V gather
    is half of it, and what it saves is the local K and V, as the ring's. DeepSeek Sparse Attention gathers its one
    latent key of r + d_r and the indexer's key of D instead, and their gradients."""
    if par.cp <= 1 or par.cp_comm_type != "all_gather":
        return 0.0
    if M.is_dsa(m):  # DSA gathers the one latent key (r + d_r) and the indexer's key (sparse_attention.py)
        return 2.0 * tr.micro_batch * m.seq_len * (m.kv_lora_rank + m.qk_rope_head_dim + m.dsa_indexer_head_dim) * dtype
    d_qk, d_v = M.head_dims(m)
    kv = m.heads if M.is_mla(m) else m.kv_heads
    return 2.0 * tr.micro_batch * m.seq_len * max(1, kv // par.tp) * (d_qk + d_v) * dtype


def deepep_bytes(m: ModelSpec, par: ParallelSpec, dtype: int) -> float:
    """DeepEP's buffers (scenario/deepep_buffers.py) on each GPU of an MoE model under the flex dispatcher with
    DeepEP: one ``Buffer`` for the EP group, rows of h (a latent MoE's: its latent size) · max(dtype, 2) bytes
    (Megatron-Core ``get_hidden_bytes``)."""
    if not m.experts or par.moe_token_dispatcher_type != "flex" or par.moe_flex_dispatcher_backend != "deepep" \
            or par.ep not in DEEPEP.CONFIGS:
        return 0.0
    width = m.moe_latent_size or m.hidden  # the dispatched rows' (get_hidden_bytes of the latent tokens)
    return float(DEEPEP.buffer_bytes(width * max(dtype, 2), par.ep, par.moe_flex_dispatcher_num_sms))


def hybridep_bytes(m: ModelSpec, par: ParallelSpec, tr: TrainingSpec, domain: int) -> float:
    """HybridEP's buffer (scenario/hybridep_buffers.py) on each GPU of an MoE model under the flex dispatcher with
    HybridEP, for the EP group that holds the most: rows of one rank's dispatch input (its sequence shard of the
    micro-batch: with expert TP 1 the tensor-parallel ranks route their own tokens), ``domain`` GPUs an NVLink
    domain. The groups are ep consecutive ranks (Megatron's rank order, as checks.py's ``check_hybridep``)."""
    if not m.experts or par.moe_token_dispatcher_type != "flex" or par.moe_flex_dispatcher_backend != "hybridep" \
            or par.ep <= 1:
        return 0.0
    tokens = tr.micro_batch * (m.seq_len // par.cp) // par.tp
    span = min(par.tp * par.pp * par.dp * par.cp, math.lcm(domain, par.ep))  # the groups' placements repeat
    per_domain = {min(sum(1 for r in range(first, first + par.ep) if r // domain == d)
                      for d in {r // domain for r in range(first, first + par.ep)})
                  for first in range(0, span, par.ep)}
    width = m.moe_latent_size or m.hidden  # the dispatched rows' (fused_a2a.py: x.shape of the latent tokens)
    return float(max(HYBRIDEP.buffer_bytes(tokens, width, m.experts // par.ep, r, par.ep) for r in per_domain))


def stage_memory(sc: Scenario) -> list[MemoryReport]:
    """Memory of one GPU of each pipeline stage of ``sc``, stage 0 first."""
    profiled = profiled_stages(sc)
    if profiled is not None:
        return profiled
    par, tr = sc.parallel, sc.training
    if sc.model is None or sc.cluster.node is None:
        raise ValueError("a memory report needs a model and a node type")
    m = replace(M.resolve(sc.model), vocab=M.padded_vocab(M.resolve(sc.model).vocab, par.tp))
    gpu = sc.cluster.node.gpu
    dtype = 4 if tr.precision in ("fp32", "tf32") else 2
    grad_bytes = grad_reduce_bytes(tr.precision, tr.grad_reduce)
    state_bytes = optimizer_state_bytes(tr)
    s = m.seq_len // par.cp
    micro = max(1, tr.global_batch // (tr.micro_batch * par.dp))
    plan = chunk_plan_of(sc, m)
    v_shape = par.schedule in V_SHAPED
    split = stage_layers(plan.layers, par.pp, v_shape)
    # the MTP layers' activations count as layers of their chunk (the module's norms and eh_proj input, 5h
    # per token, are left out)
    with_mtp = stage_layers(tuple(n + (plan.mtp if k == plan.mtp_chunk else 0) for k, n in enumerate(plan.layers)),
                            par.pp, v_shape)
    fp8 = tr.precision in QUANTISED
    recipe = recipe_of(tr.precision, tr.fp8_recipe)
    per_layer = scenario_layer_bytes(sc, m)
    per_dense = scenario_layer_bytes(sc, m, False) if m.experts and m.first_dense_layers else per_layer
    off_layer, off_dense = layer_offload(sc, m)
    cpu_k = offloaded_layers(sc)
    transient, pages, host_layer = paged_stash_bytes(m, lambda x: scenario_layer_bytes(sc, x))
    out: list[MemoryReport] = []
    for stage in range(par.pp):
        held = held_stages(par, stage)
        mine = tuple(n for k in held for n in split[k])  # layers of each of this stage's chunks
        dense = expert = 0.0
        for k in held:
            d_k, e_k = _stage_params(m, sc, k, sum(split[k]))
            dense, expert = dense + d_k, expert + e_k
        if plan.mtp_chunk >= 0 and rank_of(plan.mtp_chunk, par.pp, v_shape) in held:
            d_mtp, e_mtp = _mtp_stage_params(m, par, 1 if m.mtp_use_repeated_layer else plan.mtp, 0 not in held)
            dense, expert = dense + d_mtp, expert + e_mtp
        d = par.dp * par.cp
        hsdp = (par.num_distributed_optimizer_instances, par.outer_dp_sharding_strategy == "optim")
        states = model_state_bytes(dense, d, par.zero, grad_bytes, state_bytes, *hsdp)
        if expert:
            ex = model_state_bytes(expert, expert_dp(par), par.zero, grad_bytes, state_bytes, *hsdp)
            states = {k: states[k] + ex[k] for k in states}
        if MU.is_muon(tr):
            states["optimizer"] -= _muon_saving(sc, m, held, state_bytes)
        if fp8:
            lin = [_stage_linear_params(m, sc, k, sum(split[k])) for k in held]
            lin_dense, lin_expert = sum(x for x, _ in lin), sum(y for _, y in lin)
            k = par.num_distributed_optimizer_instances  # HSDP: within an instance
            z3 = par.zero >= 3  # ZeRO-3 shards the weights, and so their fp8 forms
            states["params"] += quant_weight_bytes(lin_dense / (max(1, d // k) if z3 else 1)
                                                   + lin_expert / (max(1, expert_dp(par) // k) if z3 else 1), recipe,
                                                   tr.fp8_params or tr.fp4_param, non_tn_fp8(gpu))
        tasks = schedule(par.schedule, stage, par.pp, micro, par.virtual_stages,
                         par.overlap_moe_expert_parallel_comm)  # its one more warm-up forward holds one more
        chunks = max_in_flight(tasks)
        share = offload_share(sc, m, plan, stage, v_shape) if off_layer + off_dense else 1.0
        off_l, off_d = off_layer * share, off_dense * share
        lead = any(_dense_layers_of(sc, k) for k in held) and bool(m.experts)
        worst = _layer_mean(sc, m, held, (per_layer, per_dense), (off_l, off_d), lead)
        if tr.recompute == "full" and (tr.recompute_method == "block" or tr.recompute_num_layers > 1):
            mtp_here = sum(sum(with_mtp[k]) - sum(split[k]) for k in held)  # the MTP layers this stage holds
            worst = _grouped_recompute_mean(sc, m, held, [n for k in held for n in split[k]], mtp_here, worst,
                                            (off_l, off_d), lead)
        weights = tuple(n for k in held for n in with_mtp[k])
        in_flight = max_in_flight(tasks, weights, combined=par.overlap_moe_expert_parallel_comm)  # layers in flight
        kept = max(in_flight - cpu_k, 0.0)  # layer-wise CPU offloading: (L − K) layers' worth (cpu_offload.py)
        acts = worst * kept + max(off_l, off_d if lead else 0.0) * min(OFFLOAD_RESIDENT_LAYERS, in_flight)
        acts += transient if in_flight else 0.0
        if 0 in held and M.has_dropout(m):  # embedding dropout mask of each in-flight micro-batch
            acts += s * tr.micro_batch * m.hidden * chunks / (par.tp if par.sequence_parallel else 1)
        work = float(WORKSPACE_BYTES) + userbuffers_bytes(par, tr, s * m.hidden) + cp_gather_bytes(m, par, tr, dtype) \
            + deepep_bytes(m, par, dtype) + hybridep_bytes(m, par, tr, sc.cluster.node.domain)
        if par.zero >= 3:
            work += 2 * WEIGHT_BYTES * (dense + expert) / max(sum(mine), 1)
        if head_stage(par) in held:
            work += 4.0 * s * tr.micro_batch * m.vocab / par.tp * (1 + m.mtp_num_layers)  # the MTP heads' too
            if tr.fp8_output_proj and recipe == "mxfp8":  # the MXFP8 head's two cached copies beside its bf16 weight
                states["params"] += quant_weight_bytes(m.vocab * m.hidden / par.tp, recipe, False)
        breakdown = {**states, "activations": acts, "workspace": work}
        peak = sum(breakdown.values())
        out.append(MemoryReport(peak, gpu.memory_bytes, peak <= gpu.memory_bytes, breakdown, stage,
                                pages * in_flight, host_layer * in_flight + worst * min(cpu_k, in_flight)))
    return out


def muon_chunks(sc: Scenario, m: ModelSpec, held: list[int]) -> tuple[MU.Chunk, ...]:
    """The Muon Chunks (workload/muon.py) of the model chunks of pipeline stages ``held``, in order: each its
    decoder layers, the MTP modules' own weights (one module's with ``mtp_use_repeated_layer``), the embedding
    on chunk 0 and the head on the last. Layers alike list the first of their kind's matrices."""
    par, tr = sc.parallel, sc.training
    plan, v_shape = chunk_plan_of(sc, m), par.schedule in V_SHAPED
    first: dict[tuple[int, bool, bool], int] = {}
    out, start = [], 0
    for vs, count in enumerate(plan.layers):
        if rank_of(vs, par.pp, v_shape) in held:
            layers = [first.setdefault(M.layer_kind(m, i), i) for i in range(start, start + count)]
            mtp = (1 if m.mtp_use_repeated_layer else plan.mtp) if vs == plan.mtp_chunk else 0
            out.append(MU.chunk(m, par, tr, layers, mtp, vs == 0, vs == len(plan.layers) - 1))
        start += count
    return tuple(out)


def _muon_saving(sc: Scenario, m: ModelSpec, held: list[int], adam_bytes: float) -> float:
    """What Megatron-Core's Muon keeps less than Adam (``adam_bytes`` a parameter, sharded evenly at ZeRO 1) on one
    GPU of the pipeline rank that holds stages ``held``: its weight matrices (workload/muon.py) take 8 B a
    parameter, and under the layer-wise optimizer (dist_muon and muon at parallel.zero 1, over dp·cp and the
    expert-data-parallel group) each is whole on one rank, as under the legacy path (dist_muon) are Adam's
    embeddings and output layer: the rank dealt the most state bytes (muon.dealt_state_bytes) holds them."""
    par, tr = sc.parallel, sc.training
    chunks = muon_chunks(sc, m, held)
    dense, expert = MU.muon_params(tuple(x for c in chunks for x in c.matrices))
    d, d_exp = (par.dp * par.cp, expert_dp(par)) if par.zero >= 1 else (1, 1)
    if MU.layer_wise(tr, par) and MU.legacy(tr):
        dense += sum(n for c in chunks for n in c.adam)
    held_bytes = MU.dealt_state_bytes(chunks, tr, par, d, d_exp, adam_bytes,
                                      MU.layout_bucket(par, grad_reduce_bytes(tr.precision, tr.grad_reduce)))
    return adam_bytes * (dense / d + expert / d_exp) - held_bytes


def _layer_mean(sc: Scenario, m: ModelSpec, held: list[int], per: tuple[float, float], off: tuple[float, float],
                lead: bool) -> float:
    """What one layer of the stage that holds pipeline stages ``held`` keeps in flight, of a model ``m`` (padded):
    the larger of an MoE layer's and, with ``lead``, a dense leading layer's (``per``: their bytes at scenario
    ``sc``, ``off``: what fine-grained offloading sends of each); a hybrid model's or one whose layers' attention
    differs, the mean of its layers', the MTP modules' with them."""
    if not (hybrid.is_hybrid(m) or M.layers_differ(m)):
        return max(per[0] - off[0], per[1] - off[1]) if lead else per[0] - off[0]
    par = sc.parallel
    plan, v_shape = chunk_plan_of(sc, m), par.schedule in V_SHAPED
    mtp = [m.layers + 1 + d for d in range(plan.mtp)] \
        if plan.mtp_chunk >= 0 and rank_of(plan.mtp_chunk, par.pp, v_shape) in held else []
    layers = [i for k in held for i in _layers_of(sc, k)] + mtp
    return hybrid_layer_bytes(sc, m, layers) if hybrid.is_hybrid(m) else differing_layer_bytes(sc, m, layers, off)


def _grouped_recompute_mean(sc: Scenario, m: ModelSpec, held: list[int], chunks: list[int], mtp: int, full: float,
                            off: tuple[float, float], lead: bool) -> float:
    """What one layer keeps on average, of the stage that holds pipeline stages ``held`` (their model chunks of
    ``chunks`` layers, and ``mtp`` MTP layers), under a full recompute by Megatron-Core's recompute_method
    (recompute.py @ d98e8a64dd, _checkpointed_forward; ``full``: a layer's kept input). uniform: each group of
    recompute_num_layers keeps its input, ceil(n/N) of a chunk of n, an MTP layer its input; block: the first N layers
    of a chunk keep their input, the others and the MTP layers (multi_token_prediction.py skips them under block)
    what they keep without recompute (:func:`_layer_mean`, ``off`` and ``lead`` as there). The rerun group's
    activations, alive during its backward, are left out, as for one layer under full."""
    tr, n, total = sc.training, sc.training.recompute_num_layers, max(1, sum(chunks) + mtp)
    if tr.recompute_method == "uniform":
        return full * (sum(-(-c // n) for c in chunks) + mtp) / total
    share = sum(min(n, c) for c in chunks) / total
    plain = replace(sc, training=replace(tr, recompute="none"))
    per_layer = scenario_layer_bytes(plain, m)
    per = (per_layer, scenario_layer_bytes(plain, m, False) if m.experts and m.first_dense_layers else per_layer)
    return share * full + (1 - share) * _layer_mean(plain, m, held, per, off, lead)


def paged_stash_bytes(m: ModelSpec, layer_bytes: Callable[[ModelSpec], float]) -> tuple[float, float, float]:
    """(one MoE layer's static-size originals, its pages in the GPU buffer, its share of the pinned host buffer)
    under Megatron-Core's paged stash (model.moe_paged_stash; zeros without it), from ``layer_bytes``, one layer's
    stored activations for a model. The layers in flight keep their routed experts' tensors in the GPU buffer's pages
    (routing.stashed_load, in ``layer_bytes(m)`` already); the layer that ran last also keeps its budget-size
    originals until its stash is done (paged_stash.py @ d98e8a64dd, ``wait_for_stash_to_complete`` frees them as
    the next layer's experts start), and a layer's backward reloads into a tensor of that size. The host buffer
    is sized as the GPU one by moe_paged_stash_buffer_size_factor_cpu."""
    if not (m.experts and m.moe_paged_stash and m.moe_expert_rank_capacity_factor is not None):
        return 0.0, 0.0, 0.0
    none = layer_bytes(replace(m, moe_paged_stash_buffer_size_factor_cuda=0.0))  # no routed rows kept
    originals = layer_bytes(replace(m, moe_paged_stash=False)) - none  # the budget's rows
    host = layer_bytes(replace(m, moe_paged_stash_buffer_size_factor_cuda=m.moe_paged_stash_buffer_size_factor_cpu))
    return originals, layer_bytes(m) - none, host - none

"""The rule book: Megatron's layout rules, written once, and the cross-key checks of a loaded scenario.

:func:`layout_violations` is the one place that says whether a model, its training
batch and a parallel layout go together (heads, FFN and KV heads over tp, layers over
the pipeline chunks, batches over micro-batches and data-parallel replicas, experts
over ep, sequence over cp·tp, the interleaved schedule's micro-batch rule). The
loader (:class:`ScenarioChecks`), the workload plan and the layout search all call it,
so a layout the search keeps is a layout the loader accepts.

:class:`ScenarioChecks` adds what needs the whole scenario: world = tp·pp·dp·cp against
the cluster's GPUs (deriving dp when it was left out), override targets, NVLS, a mirrored
trace's ranks against the GPUs. Each
failure is a ScenarioError that names the file, line and key path.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import re
from dataclasses import dataclass
from typing import Callable

import yaml

from emulator.errors import ScenarioError
from emulator.scenario.allocation import LEAF_FABRICS, AllocationError, Request, allocate
from emulator.scenario.spec import (
    PRECISION_PEAK,
    QUANTISED,
    SCHEDULES,
    JobSpec,
    ModelSpec,
    ParallelSpec,
    Scenario,
    TrainingSpec,
    precision_refusal,
)
from emulator.scenario.stages import LAYOUT_KEY, V_SHAPED, model_chunks, parse_layout
from emulator.scenario.yamltree import show

TARGET = re.compile(r"^(gpu|node):(\d+)$")  # an override target that names a GPU or a node
FABRIC_ONLY = {  # fabric keys that only some kinds read
    "spines": ("fat_tree", "rail", "fat_tree3", "multi_plane"),
    "pod_size": ("fat_tree3",),
    "cores": ("fat_tree3",),
    "group_size": ("dragonfly",),
    "global_links": ("dragonfly",),
}
# The fabric kinds that read each fabric key (topology.py, BUILDERS): a key given for another kind
# would be ignored, so the loader refuses it. single_switch reads none (its ports are the NICs').
_SPINES = ("fat_tree", "rail", "fat_tree3", "multi_plane")  # leaf/rail switches joined by spines
_LINKS = (*_SPINES, "dragonfly", "ring", "torus")  # kinds with fabric links of their own
FABRIC_KEY_KINDS: dict[str, tuple[str, ...]] = {
    "oversubscription": _SPINES,
    "leaf_size": (*_SPINES, "dragonfly"),
    "link_bandwidth": _LINKS,
    "latency": _LINKS,
    "torus_dims": ("torus",),
    "graph": ("custom",),
}


@dataclass(frozen=True)
class Violation:
    """One broken rule: the key path to change and what is wrong, in the loader's words."""

    key: str
    message: str

    def error(self) -> ScenarioError:
        return ScenarioError(self.message, key=self.key)


def model_violations(model: ModelSpec) -> list[Violation]:
    """The rules of the model's own shape (sizes at least 1, heads over hidden, KV heads, experts)."""
    out: list[Violation] = []
    for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
        if getattr(model, name) < 1:
            out.append(Violation(f"model.{name}", f"the model needs {name} of at least 1, got {getattr(model, name)}"))
    if out:
        return out
    m = model
    if m.hidden % m.heads and not m.head_dim:  # head_dim decouples the heads from hidden (Qwen3)
        out.append(Violation("model.heads", f"hidden ({m.hidden}) must be divisible by heads ({m.heads}), "
                                            "or model.head_dim be given"))
    if m.kv_heads and (m.kv_heads > m.heads or m.heads % m.kv_heads):
        out.append(Violation("model.kv_heads", f"kv_heads ({m.kv_heads}) must divide heads ({m.heads})"))
    if m.experts and m.top_k > m.experts:  # top_k 0: the model's default (1)
        out.append(Violation("model.top_k", f"top_k ({m.top_k}) must be at most experts ({m.experts})"))
    if not m.experts and m.top_k:
        out.append(Violation("model.top_k", f"top_k ({m.top_k}) needs experts > 0 (an MoE model)"))
    if m.swiglu and m.activation not in ("", "swiglu"):
        out.append(Violation("model.activation", f"activation {m.activation} contradicts swiglu: true "
                                                 "(yours or the preset's; set swiglu: false with it)"))
    return out + _moe_violations(m) + _mla_violations(m)


def _moe_violations(m: ModelSpec) -> list[Violation]:
    """The MoE keys need experts; the dense leading layers leave at least one MoE layer; the busiest
    expert cannot receive more than every token (imbalance ≤ experts/top_k)."""
    out: list[Violation] = []
    if not m.experts:
        for name in ("expert_ffn_hidden", "shared_experts", "shared_expert_ffn_hidden", "first_dense_layers"):
            if getattr(m, name):
                out.append(Violation(f"model.{name}", f"{name} ({getattr(m, name)}) needs experts > 0 (an MoE model)"))
        if m.moe_imbalance != 1.0:
            out.append(Violation("model.moe_imbalance", f"moe_imbalance ({m.moe_imbalance:g}) needs experts > 0 "
                                                        "(an MoE model)"))
        for name in ("moe_expert_load", "moe_load_seed", "moe_load_concentration"):
            if getattr(m, name) not in ((), None):
                out.append(Violation(f"model.{name}", f"{name} needs experts > 0 (an MoE model)"))
        for name in ("moe_router_force_load_balancing", "moe_expert_capacity_factor",
                     "moe_pad_expert_input_to_capacity", "moe_router_num_groups", "moe_router_group_topk",
                     "moe_router_fusion"):
            if getattr(m, name):
                out.append(Violation(f"model.{name}", f"{name} needs experts > 0 (an MoE model)"))
        return out
    out += _expert_load_violations(m) + _router_violations(m)
    if m.first_dense_layers >= m.layers:
        out.append(Violation("model.first_dense_layers", f"first_dense_layers ({m.first_dense_layers}) must be "
                                                         f"less than layers ({m.layers}): no MoE layer would be left"))
    if m.shared_expert_ffn_hidden and not m.shared_experts:
        out.append(Violation("model.shared_expert_ffn_hidden", "shared_expert_ffn_hidden needs shared_experts > 0"))
    top_k = m.top_k or 1
    if not 1.0 <= m.moe_imbalance <= m.experts / top_k:
        out.append(Violation("model.moe_imbalance", f"moe_imbalance ({m.moe_imbalance:g}) must be between 1 and "
                                                    f"experts/top_k = {m.experts}/{top_k} = {m.experts / top_k:g} "
                                                    "(the busiest expert gets at most every token)"))
    return out


def _router_violations(m: ModelSpec) -> list[Violation]:
    """Megatron-Core's router rules (transformer_config.py ``__post_init__``): force balance draws the load
    itself, so it excludes the given load; padding needs a capacity factor; group-limited routing needs both
    group keys, groups that divide the experts, and enough experts in the chosen groups for top_k."""
    out: list[Violation] = []
    if m.moe_router_force_load_balancing:
        for name in ("moe_imbalance", "moe_expert_load"):
            if getattr(m, name) not in (1.0, ()):
                out.append(Violation(f"model.{name}", f"moe_router_force_load_balancing draws the load (binomial); "
                                                      f"give {name} or force balance, not both"))
    if m.moe_pad_expert_input_to_capacity and m.moe_expert_capacity_factor is None:
        out.append(Violation("model.moe_pad_expert_input_to_capacity", "moe_pad_expert_input_to_capacity needs "
                                                                       "model.moe_expert_capacity_factor"))
    groups, topk = m.moe_router_num_groups, m.moe_router_group_topk
    if bool(groups) != bool(topk):
        key = "model.moe_router_group_topk" if groups else "model.moe_router_num_groups"
        out.append(Violation(key, "group-limited routing needs moe_router_num_groups and moe_router_group_topk "
                                  "both"))
    elif groups:
        if m.experts % groups:
            out.append(Violation("model.moe_router_num_groups", f"moe_router_num_groups ({groups}) must divide "
                                                                f"experts ({m.experts})"))
        elif topk > groups:
            out.append(Violation("model.moe_router_group_topk", f"moe_router_group_topk ({topk}) must be at most "
                                                                f"moe_router_num_groups ({groups})"))
        elif topk * m.experts // groups < (m.top_k or 1):
            out.append(Violation("model.moe_router_group_topk", f"{topk} groups of {m.experts // groups} experts "
                                                                f"hold fewer than top_k ({m.top_k}) experts"))
    return out


def _dispatch_violations(m: ModelSpec, p: ParallelSpec) -> list[Violation]:
    """The dispatcher keys: flex with DeepEP refuses padding to capacity (Megatron-Core transformer_config.py;
    HybridEP takes it);
    the emulator's flex dispatch runs the experts without tensor parallelism (etp 1, or tp 1); shared expert
    overlap needs shared experts and the alltoall or flex dispatcher (transformer_config.py)."""
    out: list[Violation] = []
    etp = p.etp or p.tp
    if p.moe_token_dispatcher_type == "flex":
        if m.moe_pad_expert_input_to_capacity and p.moe_flex_dispatcher_backend == "deepep":
            out.append(Violation("parallel.moe_token_dispatcher_type", "the flex dispatcher with deepep does not "
                                                                       "support model.moe_pad_expert_input_to_"
                                                                       "capacity (Megatron-Core refuses it)"))
        if etp > 1:
            out.append(Violation("parallel.moe_token_dispatcher_type", f"flex dispatch is modelled with the experts' "
                                                                       f"tensor parallelism 1; got {etp} (set "
                                                                       f"parallel.etp: 1)"))
    if p.moe_shared_expert_overlap:
        if not m.shared_experts:
            out.append(Violation("parallel.moe_shared_expert_overlap", "moe_shared_expert_overlap needs "
                                                                       "model.shared_experts > 0"))
        if p.moe_token_dispatcher_type == "allgather":
            out.append(Violation("parallel.moe_shared_expert_overlap", "moe_shared_expert_overlap works with the "
                                                                       "alltoall or flex dispatcher only "
                                                                       "(Megatron-Core)"))
    return out


def _expert_load_violations(m: ModelSpec) -> list[Violation]:
    """A measured distribution: one row for every MoE layer or one per MoE layer, each one number per expert,
    not all zero, no expert above every token; not together with moe_imbalance (it says the same thing,
    measured). A drawn load (moe_load_seed) excludes both; its concentration needs the seed."""
    out = _seed_violations(m)
    rows = m.moe_expert_load
    if not rows:
        return out
    moe_layers = m.layers - m.first_dense_layers
    if len(rows) not in (1, moe_layers):
        return out + [Violation("model.moe_expert_load", f"moe_expert_load has {len(rows)} rows; expected one (every "
                                                         f"MoE layer) or one per MoE layer ({moe_layers}: layers "
                                                         f"{m.layers} − first_dense_layers {m.first_dense_layers})")]
    for i, load in enumerate(rows):
        broken = _load_row_violation(m, load, "model.moe_expert_load" + (f"[{i}]" if len(rows) > 1 else ""))
        if broken is not None:
            return out + [broken]
    if m.moe_imbalance != 1.0:
        out.append(Violation("model.moe_imbalance", "give moe_imbalance or moe_expert_load, not both"))
    return out


def _load_row_violation(m: ModelSpec, load: tuple[float, ...], where: str) -> Violation | None:
    if len(load) != m.experts:
        return Violation(where, f"moe_expert_load has {len(load)} numbers; expected one per expert ({m.experts})")
    total = sum(load)
    if total <= 0:
        return Violation(where, "moe_expert_load must not be all zero")
    top_k = m.top_k or 1
    if max(load) / (total / len(load)) > m.experts / top_k:
        return Violation(where, f"the busiest expert ({max(load):g} of {total:g}) gets more than every token: at "
                                f"most experts/top_k = {m.experts / top_k:g} times the mean")
    return None


def _seed_violations(m: ModelSpec) -> list[Violation]:
    """moe_load_seed draws the load, so it excludes every key that gives it; the concentration needs it."""
    if m.moe_load_seed is None:
        if m.moe_load_concentration is not None:
            return [Violation("model.moe_load_concentration", "moe_load_concentration needs model.moe_load_seed")]
        return []
    given = [name for name, unset in (("moe_imbalance", 1.0), ("moe_expert_load", ()),
                                      ("moe_router_force_load_balancing", False)) if getattr(m, name) != unset]
    return [Violation(f"model.{name}", f"moe_load_seed draws the load; give {name} or moe_load_seed, not both")
            for name in given]


def _mla_violations(m: ModelSpec) -> list[Violation]:
    """Multi-latent attention: its dims need kv_lora_rank, and it is multi-head (no separate KV heads)."""
    out: list[Violation] = []
    if not m.kv_lora_rank:
        for name in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(m, name):
                out.append(Violation(f"model.{name}", f"{name} ({getattr(m, name)}) needs kv_lora_rank > 0 "
                                                      "(multi-latent attention)"))
        return out
    if m.kv_heads and m.kv_heads != m.heads:
        out.append(Violation("model.kv_heads", f"multi-latent attention has one key/value head per query head: "
                                               f"kv_heads ({m.kv_heads}) must be 0 or heads ({m.heads})"))
    return out


def layout_violations(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> list[Violation]:
    """Every rule that ``parallel`` breaks for ``model`` and ``training``, in the order the loader
    reports them; the model's own shape first (a broken shape stops there)."""
    out = model_violations(model) + _size_violations(training, parallel)
    if out:
        return out
    m, t, p = model.resolved(), training, parallel
    out += _schedule_violations(p)
    if t.optimizer == "apex" and p.zero not in (1, 2):
        out.append(Violation("training.optimizer", f"optimizer apex (DistributedFusedAdam) shards the optimizer "
                                                   f"state over the data-parallel ranks: it needs parallel.zero 1 "
                                                   f"or 2, got {p.zero}"))
    out += _expert_grid_violations(m, p) + _dispatch_violations(m, p)
    if p.ep > 1 and not m.experts:
        out.append(Violation("parallel.ep", f"ep = {p.ep} needs an MoE model (model.experts > 0)"))
    if m.experts and m.experts % p.ep:
        out.append(Violation("parallel.ep", f"ep ({p.ep}) must divide model.experts ({m.experts})"))
    per_step = t.micro_batch * p.dp
    if t.global_batch % per_step:
        out.append(Violation("training.global_batch", f"global_batch ({t.global_batch}) must be divisible "
                                                      f"by micro_batch*dp = {t.micro_batch}*{p.dp} = {per_step}"))
    out += _layout_violations(p)
    try:
        model_chunks(m.layers, p.pp, p.virtual_stages, p.first_chunk_layers, p.last_chunk_layers,
                     p.pipeline_model_parallel_layout, m.mtp_num_layers)
    except ScenarioError as err:
        out.append(Violation(err.key or "parallel.pp", err.message))
    out += _recompute_violations(m, t) + _offload_violations(m, t, p)
    out += _tensor_violations(m, p)
    out += _a2a_overlap_violations(m, t, p)
    micro_batches = t.global_batch // per_step
    if p.schedule == "dualpipev" and micro_batches < 2 * p.pp:
        out.append(Violation("training.global_batch",
                             f"dualpipev needs at least 2*pp = {2 * p.pp} micro-batches per pipeline (global_batch/"
                             f"(micro_batch*dp) = {micro_batches}; deepseek-ai/DualPipe dualpipev.py: num_chunks >= "
                             f"num_ranks * 2)"))
    if p.schedule == "dualpipe" and p.pp % 2:
        out.append(Violation("parallel.pp", f"dualpipe needs an even pp (rank i and pp-1-i hold the same two stages), "
                                            f"got {p.pp} (deepseek-ai/DualPipe dualpipe.py: num_ranks % 2 == 0)"))
    if p.schedule == "dualpipe" and (micro_batches < 2 * p.pp or micro_batches % 2):
        out.append(Violation("training.global_batch",
                             f"dualpipe needs an even number of micro-batches per pipeline, at least 2*pp = "
                             f"{2 * p.pp} (global_batch/(micro_batch*dp) = {micro_batches}; deepseek-ai/DualPipe "
                             f"dualpipe.py: num_chunks % 2 == 0 and num_chunks >= num_ranks * 2)"))
    if p.schedule == "interleaved-1f1b" and p.pp > 1 and micro_batches % p.pp:
        out.append(Violation("training.global_batch",
                             f"interleaved-1f1b needs the micro-batches per pipeline (global_batch/(micro_batch*dp) "
                             f"= {micro_batches}) to be a multiple of pp ({p.pp})"))
    return out


def _ub_cfg_violations(p: ParallelSpec) -> list[Violation]:
    """tp_comm_overlap_cfg: one of NeMo's configuration names (scenario/ub_configs.py), with tp_comm_overlap."""
    if not p.tp_comm_overlap_cfg:
        return []
    from emulator.scenario.ub_configs import configs

    key = "parallel.tp_comm_overlap_cfg"
    names = configs()
    if p.tp_comm_overlap_cfg not in names:
        near = difflib.get_close_matches(p.tp_comm_overlap_cfg, list(names), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(near)}" if near else ""
        return [Violation(key, f"{p.tp_comm_overlap_cfg!r} is not one of NeMo's Userbuffers configurations "
                               f"(emulator/data/userbuffers.yaml){hint}")]
    if not p.tp_comm_overlap:
        return [Violation(key, "is read with tp_comm_overlap: true; set it, or remove this key")]
    return []


def _hierarchical_cp_violations(m: ModelSpec, p: ParallelSpec, kv: int) -> list[Violation]:
    """cp_comm_type a2a+p2p (Transformer Engine's AttnFuncWithCPAndKVP2P with a list of CP groups): two
    hierarchical_context_parallel_sizes whose product is cp, the first splitting each TP rank's heads; the
    sizes only with a2a+p2p."""
    key = "parallel.hierarchical_context_parallel_sizes"
    sizes = p.hierarchical_context_parallel_sizes
    if p.cp_comm_type != "a2a+p2p":
        if sizes is not None:
            return [Violation(key, f"is for cp_comm_type a2a+p2p (got {p.cp_comm_type}); remove it")]
        return []
    if sizes is None or len(sizes) != 2 or sizes[0] * sizes[1] != p.cp or min(sizes) < 1:
        return [Violation(key, f"cp_comm_type a2a+p2p needs [a2a, p2p] sizes whose product is cp ({p.cp}); "
                               f"got {list(sizes) if sizes is not None else 'none'}")]
    a = sizes[0]
    if m.heads % (p.tp * a) or max(1, kv // p.tp) % a:  # TE: the heads split over the a2a level
        return [Violation(key, f"its a2a level ({a}) splits each TP rank's heads: model.heads {m.heads} and kv "
                               f"heads {kv} over tp {p.tp} must each leave a multiple of {a}")]
    return []


def _a2a_overlap_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """Megatron-Core's preconditions of the 1F1B all-to-all overlap, each an assert of
    ``TransformerConfig.__post_init__`` (megatron/core/transformer/transformer_config.py @ d98e8a64dd,
    lines 3002-3077), in its order: virtual pipeline stages when pp > 1, ep > 1, the alltoall or flex
    dispatcher, no full recompute (nor recompute of the moe module), a bf16 or fp16 model (fp8 runs are bf16
    models with fp8 GEMMs), no moe_shared_expert_overlap, at most one MTP layer; and delay_wgrad_compute only
    with the overlap. The emulator's own limits: the combined steps are 1F1B's (schedule 1f1b or
    interleaved-1f1b), and its pairing does not model ZeRO-3's per-layer gathers."""
    key, rule = "parallel.overlap_moe_expert_parallel_comm", "overlap_moe_expert_parallel_comm"
    out: list[Violation] = []
    if p.delay_wgrad_compute and not p.overlap_moe_expert_parallel_comm:
        out.append(Violation("parallel.delay_wgrad_compute", "delay_wgrad_compute needs overlap_moe_expert_parallel_"
                                                             "comm: true (Megatron-Core transformer_config.py)"))
    if not p.overlap_moe_expert_parallel_comm:
        return out
    cite = "(Megatron-Core transformer_config.py)"
    if p.schedule in (*V_SHAPED, "dualpipe"):  # their own pairs of a forward and a backward
        out.append(Violation(key, f"{rule} runs Megatron's combined 1F1B steps: schedule 1f1b (pp 1) or "
                                  f"interleaved-1f1b, not {p.schedule} (which pairs its own forward and backward "
                                  f"chunks)"))
    elif p.pp > 1 and p.virtual_stages == 1:  # a layout sets them
        out.append(Violation(key, f"{rule} with pp > 1 needs virtual pipeline stages (schedule: interleaved-1f1b "
                                  f"with virtual_stages > 1, or a pipeline_model_parallel_layout of more than pp "
                                  f"stages); pp is {p.pp} with schedule {p.schedule} and {p.virtual_stages} "
                                  f"virtual stage(s) {cite}"))
    elif p.schedule not in ("1f1b", "interleaved-1f1b"):
        out.append(Violation(key, f"{rule} runs Megatron's combined 1F1B steps: schedule 1f1b (pp 1) or "
                                  f"interleaved-1f1b, not {p.schedule}"))
    if p.ep < 2:
        out.append(Violation(key, f"{rule} needs expert parallelism, ep > 1 (ep is {p.ep}) {cite}"))
    if p.moe_token_dispatcher_type not in ("alltoall", "flex"):
        out.append(Violation(key, f"{rule} needs the alltoall or flex dispatcher (moe_token_dispatcher_type is "
                                  f"{p.moe_token_dispatcher_type}) {cite}"))
    if t.recompute == "full":
        out.append(Violation(key, f"{rule} refuses full recompute (training.recompute is full) {cite}"))
    if t.recompute_modules and "moe" in t.recompute_modules:
        out.append(Violation(key, f"{rule} refuses recompute of the moe module (training.recompute_modules) {cite}"))
    if t.precision in ("fp32", "tf32"):
        out.append(Violation(key, f"{rule} needs a bf16 or fp16 model (training.precision is {t.precision}) {cite}"))
    if p.moe_shared_expert_overlap:
        out.append(Violation(key, f"{rule} refuses moe_shared_expert_overlap: true {cite}"))
    if m.mtp_num_layers > 1:
        out.append(Violation(key, f"{rule} supports at most one MTP layer (model.mtp_num_layers is "
                                  f"{m.mtp_num_layers}) {cite}"))
    if p.zero >= 3:
        out.append(Violation(key, f"{rule} is not modelled with ZeRO-3's per-layer parameter gathers (zero is "
                                  f"{p.zero}); use zero 0 to 2"))
    return out


def _layout_violations(p: ParallelSpec) -> list[Violation]:
    """Megatron's flexible layout excludes the first/last split (arguments.py: the layout sets the stages;
    NeMo and Megatron-Bridge clear num_layers_in_first/last_pipeline_stage with it)."""
    if not p.pipeline_model_parallel_layout:
        return []
    return [Violation(LAYOUT_KEY, f"pipeline_model_parallel_layout places every layer itself: remove "
                                  f"parallel.{key} (Megatron takes the layout or the first/last split, not both)")
            for key in ("first_chunk_layers", "last_chunk_layers") if getattr(p, key) is not None]


def _recompute_violations(m: ModelSpec, t: TrainingSpec) -> list[Violation]:
    """recompute_modules are read under selective recompute only (Megatron's recompute_granularity
    "selective"), and mla_up_proj needs multi-latent attention (transformer_config.py raises)."""
    mods = t.recompute_modules
    if mods is None:
        return []
    if t.recompute != "selective":
        return [Violation("training.recompute_modules", f"recompute_modules are recomputed under recompute: "
                                                        f"selective (Megatron's --recompute-granularity selective); "
                                                        f"recompute is {t.recompute}")]
    if "mla_up_proj" in mods and not m.kv_lora_rank:
        return [Violation("training.recompute_modules", "mla_up_proj needs multi-latent attention "
                                                        "(model.kv_lora_rank > 0)")]
    return []


def _offload_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """Fine-grained activation offloading as Megatron-Core's TransformerConfig checks it (transformer_config.py @
    d98e8a64dd, ``__post_init__``: offload_modules not empty, attn_proj only with core_attn, no expert module
    offloaded while the whole MoE layer is recomputed), plus what the emulator cannot honour: modules without the
    switch, expert modules without experts, full recompute (a layer then keeps only its input), and the steps that
    pair a forward with a backward (DualPipe's, the 1F1B all-to-all overlap), whose copies are not modelled."""
    key, mods = "training.offload_modules", t.offload_modules or ()
    if not t.fine_grained_activation_offloading:
        return [Violation(key, "offload_modules are offloaded with training.fine_grained_activation_offloading: "
                               "true")] if mods else []
    out: list[Violation] = []
    if not mods:
        out.append(Violation(key, "fine_grained_activation_offloading needs at least one module in offload_modules "
                                  "(Megatron-Core asserts it)"))
    if "attn_proj" in mods and "core_attn" not in mods:
        out.append(Violation(key, "attn_proj is offloaded only with core_attn (Megatron-Core: the input of attn_proj "
                                  "is the output of core_attn, which core_attn's backward needs)"))
    moe = [x for x in ("expert_fc1", "moe_act") if x in mods]
    if moe and not m.experts:
        out.append(Violation(key, f"{', '.join(moe)} needs an MoE model (model.experts > 0)"))
    if moe and t.recompute == "selective" and "moe" in (t.recompute_modules or ()):
        out.append(Violation(key, f"{', '.join(moe)} cannot be offloaded while recompute_modules recomputes the whole "
                                  "moe layer (Megatron-Core refuses it: the layer keeps only its input)"))
    if t.recompute == "full":
        out.append(Violation("training.fine_grained_activation_offloading",
                             "under recompute: full a layer keeps only its input; offload with selective or none"))
    if p.schedule in ("dualpipe", "dualpipev") or p.overlap_moe_expert_parallel_comm:
        paired = f"schedule {p.schedule}" if p.schedule in ("dualpipe", "dualpipev") else \
            "overlap_moe_expert_parallel_comm"
        out.append(Violation("training.fine_grained_activation_offloading",
                             f"offloading is not modelled with {paired}, whose steps pair a forward with a backward"))
    return out


def _expert_grid_violations(m: ModelSpec, p: ParallelSpec) -> list[Violation]:
    """The expert layers' grid: etp × ep × expert-dp × pp = world (Megatron-Core's MoE parallel folding,
    parallel_state.py ``initialize_model_parallel``: world % (etp·ep·pp) == 0). With etp = tp (the default)
    that is ep | dp·cp, Megatron's rule before folding, and its message stays."""
    out: list[Violation] = []
    etp = p.etp or p.tp
    if etp == p.tp:
        if (p.dp * p.cp) % p.ep:
            hint = (f"; or give the experts their own grid with parallel.etp (etp*ep must divide tp*dp*cp = "
                    f"{p.tp * p.dp * p.cp}; etp 1 folds the tensor-parallel ranks into ep)" if p.tp > 1 else "")
            out.append(Violation("parallel.ep", f"ep ({p.ep}) must divide dp*cp = {p.dp}*{p.cp} = {p.dp * p.cp}"
                                                + hint))
        return out
    world = p.tp * p.dp * p.cp
    if world % (etp * p.ep):
        out.append(Violation("parallel.ep", f"etp*ep = {etp}*{p.ep} = {etp * p.ep} must divide tp*dp*cp = "
                                            f"{p.tp}*{p.dp}*{p.cp} = {world} (the expert layers' grid etp x ep x "
                                            "expert-dp x pp is the world: Megatron-Core's MoE parallel folding)"))
    if not m.experts:
        out.append(Violation("parallel.etp", f"etp ({etp}) other than tp ({p.tp}) needs an MoE model (model.experts "
                                             "> 0)"))
    if p.tp > 1 and not p.sequence_parallel:  # Megatron-Core moe_layer.py: MoE with TP needs SP in training
        out.append(Violation("parallel.sequence_parallel", f"folded expert layers (etp {etp}, tp {p.tp}) need "
                                                           "sequence_parallel: true (Megatron-Core refuses MoE "
                                                           "with tensor parallelism and no sequence parallelism)"))
    return out


def _size_violations(t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """Sizes of at least 1 (the key table enforces them in files; specs made in code may break them)."""
    sizes = [(f"parallel.{n}", getattr(p, n)) for n in ("tp", "pp", "dp", "cp", "ep", "virtual_stages")]
    sizes += [("parallel.etp", p.etp)] if p.etp is not None else []  # None: as tp
    sizes += [("training.micro_batch", t.micro_batch), ("training.global_batch", t.global_batch)]
    return [Violation(key, f"expected at least 1, got {x}") for key, x in sizes if x < 1]


SCRIPT_OPTIMIZER = "script"  # training.optimizer of a profiled workload not given: the script's own (AdamW)
# model keys a profile cannot honour: the profiled script's own kernels fix them (what each fixes)
_MLP = "MLP (dense or experts)"
PROFILE_FIXES = {
    "experts": _MLP, "top_k": _MLP, "expert_ffn_hidden": _MLP, "shared_experts": _MLP, "shared_expert_ffn_hidden": _MLP,
    "first_dense_layers": _MLP, "moe_imbalance": _MLP, "moe_expert_load": _MLP, "moe_load_seed": _MLP,
    "moe_load_concentration": _MLP, "swiglu": "MLP activation",
    "activation": "MLP activation", "biases": "biases", "dropout": "dropout", "norm": "norms",
    "q_lora_rank": "attention projections", "kv_lora_rank": "attention projections",
    "qk_nope_head_dim": "attention projections", "qk_rope_head_dim": "attention projections",
    "v_head_dim": "attention projections",
}


# keys whose value the profile records (its GEMMs' precision, attention kernel and mask, a tied head, its
# weights' type, its peak): given, each is checked against the profile once it is read (profiled.check_keys)
PROFILE_RECORDS = ("training.precision", "training.attention", "model.causal", "model.tied_embeddings",
                   "training.optimizer", "workload.profiled.peak_memory")


def shown(v: object) -> str:
    """A key's value as the user wrote it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def _schedule_violations(p: ParallelSpec) -> list[Violation]:
    out: list[Violation] = []
    if p.schedule not in SCHEDULES:
        out.append(Violation("parallel.schedule", f"expected one of {', '.join(SCHEDULES)}, got {p.schedule!r}"))
    if p.schedule in V_SHAPED and p.virtual_stages != 2 and p.pipeline_model_parallel_layout:
        out.append(Violation(LAYOUT_KEY, f"{p.schedule} places two chunks on each pipeline rank in a V: the layout "
                                         f"needs 2*pp = {2 * p.pp} stages in model order, got "
                                         f"{p.pp * p.virtual_stages}"))
    elif p.schedule in V_SHAPED and p.virtual_stages != 2:
        out.append(Violation("parallel.virtual_stages", f"{p.schedule} places two chunks on each pipeline rank in a "
                                                        f"V: virtual_stages must be 2 (or unset), got "
                                                        f"{p.virtual_stages}"))
    elif p.virtual_stages > 1 and p.schedule not in ("interleaved-1f1b", *V_SHAPED):
        out.append(Violation("parallel.virtual_stages", f"virtual_stages > 1 needs schedule: interleaved-1f1b "
                                                        f'(schedule is "{p.schedule}")'))
    if not 0 <= p.zero <= 3:
        out.append(Violation("parallel.zero", f"expected 0 to 3, got {p.zero}"))
    return out


def _tensor_violations(m: ModelSpec, p: ParallelSpec) -> list[Violation]:
    """Heads, FFN and KV heads over tp; the sequence over cp (and tp with sequence parallelism)."""
    out: list[Violation] = []
    if m.heads % p.tp:
        out.append(Violation("parallel.tp", f"model.heads ({m.heads}) must be divisible by tp ({p.tp})"))
    if m.ffn_hidden % p.tp:
        out.append(Violation("parallel.tp", f"model.ffn_hidden ({m.ffn_hidden}) must be divisible by tp ({p.tp})"))
    etp = p.etp or p.tp  # the routed experts split over etp, the shared ones over tp (Megatron-Core)
    expert_width = ("expert_ffn_hidden", m.expert_ffn_hidden) if m.expert_ffn_hidden else \
        ("ffn_hidden", m.ffn_hidden if m.experts else 0)
    for (name, width), size, key in ((expert_width, etp, "etp" if p.etp else "tp"),
                                     (("shared_expert_ffn_hidden", m.shared_expert_ffn_hidden), p.tp, "tp")):
        if width % size and (name != "ffn_hidden" or key == "etp"):  # ffn_hidden over tp: checked above
            out.append(Violation(f"parallel.{key}", f"model.{name} ({width}) must be divisible by {key} ({size})"))
    if m.kv_heads % p.tp and p.tp % m.kv_heads:  # kv heads may be replicated over tp
        out.append(Violation("parallel.tp", f"model.kv_heads ({m.kv_heads}) and tp ({p.tp}) must divide one another"))
    out += _ub_cfg_violations(p)
    if p.tp_comm_overlap and p.tp > 1 and not p.sequence_parallel:  # Megatron-LM arguments.py (d98e8a64dd) l. 1441
        out.append(Violation("parallel.tp_comm_overlap", f"tp_comm_overlap with tp {p.tp} needs sequence_parallel: "
                                                         "true (Megatron-LM: \"Tensor parallel communication/GEMM "
                                                         "overlap can happen only when sequence parallelism is "
                                                         "enabled\")"))
    kv = m.heads if m.kv_lora_rank else m.kv_heads  # MLA: a key and value head per query head
    if p.cp > 1 and p.cp_comm_type == "a2a" and (m.heads % (p.tp * p.cp) or max(1, kv // p.tp) % p.cp):
        # TE's AttnFuncWithCPAndQKVOA2A: num_heads % cp_size == 0 for Q, K and V on each TP rank
        out.append(Violation("parallel.cp_comm_type", f"cp_comm_type a2a splits each TP rank's heads over cp "
                                                      f"({p.cp}): model.heads {m.heads} and kv heads {kv} over tp "
                                                      f"{p.tp} must each leave a multiple of cp"))
    out += _hierarchical_cp_violations(m, p, kv)
    if p.cp > 1 and p.cp_comm_type == "all_gather" and (m.seq_len // p.cp) % 2:  # TE: two query chunks a rank
        out.append(Violation("parallel.cp_comm_type", f"cp_comm_type all_gather splits each rank's "
                                                      f"{m.seq_len // p.cp} tokens in two (Transformer Engine: "
                                                      "seq_len % 2 == 0 for Q, K, V): make seq_len/cp even"))
    split = p.cp * (p.tp if p.sequence_parallel else 1)
    if m.seq_len % split:
        what = f"cp*tp = {p.cp}*{p.tp}" if p.sequence_parallel else "cp"
        out.append(Violation("parallel.cp", f"model.seq_len ({m.seq_len}) must be divisible by {what} = {split}"))
    return out


def require_workload(s: Scenario) -> None:
    """For ``emulator run``: a scenario needs a model or a workload.trace."""
    if s.model is None and s.workload.trace is None and not s.jobs:
        raise ScenarioError("a run needs a workload: give a model (model.preset, or layers, hidden, "
                            "heads, seq_len, vocab) or a workload.trace", s.path or "<string>", "model")


def graph_gpus(path: str | None) -> int | None:
    """Best effort: the number of gpu nodes in a custom graph file (None if unknown)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(64 << 20)
        data = json.loads(text) if not path.endswith((".yaml", ".yml")) else yaml.safe_load(text)
        return sum(1 for n in data["nodes"] if isinstance(n, dict) and n.get("kind") == "gpu") or None
    except Exception:  # the topology builder reports a bad graph file
        return None


class ScenarioChecks:
    """The cross-key checks of a freshly read scenario. ``where(key path)`` says where a key (or its
    nearest given parent) is in the file; ``given(key path)`` whether the file gave it."""

    def __init__(self, s: Scenario, where: Callable[[str], str], given: Callable[[str], bool]) -> None:
        self.s = s
        self.where = where
        self.given = given

    def fail(self, kp: str, message: str) -> ScenarioError:
        return ScenarioError(message, self.where(kp), kp)

    def gpus(self) -> int:
        s = self.s
        if s.cluster.fabric.kind == "custom" and not self.given("cluster.nodes"):
            return graph_gpus(s.cluster.fabric.graph) or s.gpus
        return s.gpus

    def run(self) -> Scenario:
        s = self.s
        p = s.parallel
        if s.jobs:
            self.check_no_top_workload(s)
        self.check_one_workload("", s.workload.trace)
        p = self.derive_virtual_stages(p)
        if (p.schedule in V_SHAPED and not p.pipeline_model_parallel_layout
                and not self.given("parallel.virtual_stages")):
            p = dataclasses.replace(p, virtual_stages=2)  # a V: two chunks per rank (scenario/stages.py)
        for v in _schedule_violations(p):
            if v.key in ("parallel.virtual_stages", "parallel.schedule", LAYOUT_KEY) and (p.virtual_stages > 1
                                                                               or p.schedule in V_SHAPED):
                raise self.fail(v.key, v.message)
        p = self.derive_dp(p)
        s = dataclasses.replace(s, parallel=p)
        node = s.cluster.node
        if s.collectives.algorithm == "nvls" and (node is None or not node.nvls_busbw
                                                  or s.cluster.fabric.kind == "custom"):
            raise self.fail("collectives.algorithm", "nvls needs a catalog or inline node with NVLink SHARP "
                                                     "(nvls_busbw, e.g. dgx-h100, dgx-h200)")
        self.check_domain(s)
        self.check_fabric(s)
        self.check_sharp(s)
        self.check_targets(s)
        if s.workload.comm_groups is not None and s.workload.format != "chakra":
            raise self.fail("workload.comm_groups", f"a communicator-group file applies to chakra traces only "
                                                    f'(workload.format is "{s.workload.format}")')
        self.check_timing(s)
        s = self.check_profile(s)
        self.check_mirror(s)
        self.check_live(s)
        if s.model is not None:
            self.check_layout(s.model, s.training, p)
            precision = s.training.precision
            if node is not None and precision in PRECISION_PEAK and node.gpu.peak_at(precision) <= 0:
                raise self.fail("training.precision", precision_refusal(node.gpu, precision))
            if s.training.fp4_param and precision != "nvfp4":  # Megatron-Core transformer_config.py line 1578
                raise self.fail("training.fp4_param", f"NVFP4 weights need training.precision: nvfp4 (it is "
                                                      f"{precision}; Megatron: \"fp4_param must be used together "
                                                      "with fp4 mode\"); remove fp4_param or set the precision")
            if s.training.fp8_params and precision not in ("fp8", "mxfp8"):
                raise self.fail("training.fp8_params", f"fp8 weights need training.precision: fp8 (it is "
                                                       f"{precision}); remove fp8_params or set the precision")
            if s.training.fp8_recipe and precision != "fp8":
                raise self.fail("training.fp8_recipe", f"an fp8 scaling recipe needs training.precision: fp8 (it "
                                                       f"is {precision}); remove fp8_recipe or set the precision")
            if s.training.first_last_layers_bf16 and precision not in QUANTISED:
                raise self.fail("training.first_last_layers_bf16",
                                f"BF16 first and last layers need a quantised training.precision (fp8, mxfp8 or "
                                f"nvfp4; it is {precision}); remove first_last_layers_bf16 or set the precision")
            self.check_hybridep(s, p)
        if s.jobs:
            s = dataclasses.replace(s, jobs=self.check_jobs(s))
        return s

    def check_hybridep(self, s: Scenario, p: ParallelSpec) -> None:
        """HybridEP splits the EP group into NVLink domains of equal rank counts (DeepEP hybrid-ep
        deep_ep/hybrid_ep_buffer.py ``HybridEPBuffer.__init__``: "The number of ranks ... should be divisible
        by the number of ranks per node", its NVLink domain's; one ``num_of_ranks_per_node`` for all). With
        flex dispatch (expert tensor parallelism 1) and Megatron's rank order (TP fastest) an EP group is ep
        consecutive ranks from a multiple of ep, rank r in NVLink domain r // domain (network/domain.py).
        Another ``parallel.order`` is not checked: the plan relays within whatever domains its group has."""
        node = s.cluster.node
        if (p.moe_token_dispatcher_type != "flex" or p.moe_flex_dispatcher_backend != "hybridep" or node is None
                or p.ep <= 1 or p.order not in ((), ("pp", "dp", "cp", "tp"))):
            return
        d, world = node.domain, p.tp * p.pp * p.dp * p.cp
        for first in range(0, world, p.ep):
            counts = {r // d: 0 for r in range(first, first + p.ep)}
            for r in range(first, first + p.ep):
                counts[r // d] += 1
            if len(set(counts.values())) > 1:
                split = " + ".join(str(c) for c in counts.values())
                raise self.fail("parallel.moe_flex_dispatcher_backend",
                                f"hybridep needs each EP group to hold the same number of ranks in each NVLink "
                                f"domain it spans; ranks {first}-{first + p.ep - 1} (ep {p.ep}) split {split} over "
                                f"domains of {d} GPUs (DeepEP hybrid-ep HybridEPBuffer); choose ep dividing the "
                                "domain or a multiple of it, or use deepep")

    def check_domain(self, s: Scenario) -> None:
        """``cluster.node.nvlink_domain``: whole nodes of NVLink-switched GPUs (network/domain.py)."""
        node = s.cluster.node
        if node is None or not node.nvlink_domain or node.nvlink_domain == node.gpus_per_node:
            return
        g, d = node.gpus_per_node, node.nvlink_domain
        if d < g or d % g:
            raise self.fail("cluster.node.nvlink_domain", f"expected a multiple of gpus_per_node ({g}): an NVLink "
                                                          f"domain is made of whole nodes, got {d}")
        if node.intra != "nvswitch":
            raise self.fail("cluster.node.nvlink_domain", f"an NVLink domain of {d} GPUs needs intra: nvswitch "
                                                          f'(intra is "{node.intra}")')

    def check_no_top_workload(self, s: Scenario) -> None:
        """With jobs, the workload keys belong to each job: none at the top level."""
        if s.model is not None or s.workload.trace is not None:
            which = "model" if s.model is not None else "workload.trace"
            raise self.fail(which, "a scenario with jobs gives each job its own model (or workload.trace); "
                                   f"move the top-level {which} into a job")
        for section in ("training", "parallel", "workload"):
            if self.given(section):
                raise self.fail(section, f"a scenario with jobs reads {section} inside each job "
                                         f"(jobs[i].{section}); move the top-level {section} into the jobs")

    def check_one_workload(self, kp: str, trace: str | None) -> None:
        """A model or a workload.trace, not both: the trace would run and the model be dropped. (Given
        by the user: a profiled workload's model comes from its profile, and check_profile speaks.)"""
        if self.given(f"{kp}model") and trace is not None:
            raise self.fail(f"{kp}workload.trace", f"give one or the other: a {kp}model or a {kp}workload.trace "
                                                   "(the trace would run and the model be ignored)")

    def check_jobs(self, s: Scenario) -> tuple[JobSpec, ...]:
        """Each job's workload and layout against its own nodes, then their placement on the cluster."""
        node = s.cluster.node
        if node is None or s.cluster.fabric.kind == "custom":
            raise self.fail("jobs", "jobs need a cluster of nodes (cluster.nodes and cluster.node), "
                                    "not a custom graph")
        names: dict[str, int] = {}
        jobs = []
        for i, job in enumerate(s.jobs):
            kp = f"jobs[{i}]"
            if job.name in names:
                raise self.fail(f"{kp}.name", f"job name {show(job.name)} is also the name of jobs[{names[job.name]}]; "
                                              "names must be unique")
            names[job.name] = i
            jobs.append(self.check_job(kp, job, node.gpus_per_node))
        leaf = s.cluster.fabric.leaf_size if s.cluster.fabric.kind in LEAF_FABRICS else s.cluster.nodes
        requests = [Request(j.name, j.nodes, j.placement, j.node_list, j.seed) for j in jobs]
        try:
            placed = allocate(requests, s.cluster.nodes, leaf)
        except AllocationError as err:
            raise self.fail(f"jobs[{err.index}].{err.key}", err.message) from None
        return tuple(dataclasses.replace(j, nodes_assigned=p) for j, p in zip(jobs, placed))

    def check_job(self, kp: str, job: JobSpec, gpus_per_node: int) -> JobSpec:
        """One job: its node count, a workload, and its layout on nodes x gpus_per_node GPUs."""
        if job.placement == "list":
            if self.given(f"{kp}.nodes") and job.nodes != len(job.node_list):
                raise self.fail(f"{kp}.nodes", f"nodes is {job.nodes} but the placement lists {len(job.node_list)} "
                                               "nodes; give one or the other")
            job = dataclasses.replace(job, nodes=len(job.node_list))
        elif not self.given(f"{kp}.nodes"):
            raise self.fail(f"{kp}.nodes", "this key is required with placement "
                                           f"{job.placement} (how many nodes the job runs on)")
        if self.given(f"{kp}.seed") and job.placement != "random":
            raise self.fail(f"{kp}.seed", f'seed is only read with placement: random (placement is "{job.placement}")')
        self.check_one_workload(f"{kp}.", job.workload.trace)
        if job.workload.profile is not None or job.workload.profiled is not None:
            key = f"{kp}.workload.{'profile' if job.workload.profile is not None else 'profiled'}"
            raise self.fail(key, "a profiled workload runs as a scenario's one workload, not as a job: move "
                                 "workload.profile and workload.profiled to the top level and leave jobs out "
                                 "(a job takes a model or a workload.trace)")
        if job.model is None and job.workload.trace is None:
            raise self.fail(f"{kp}.model", "a job needs a workload: give a model (model.preset, or layers, hidden, "
                                           "heads, seq_len, vocab) or a workload.trace")
        gpus = job.nodes * gpus_per_node
        p = job.parallel
        if not self.given(f"{kp}.parallel.dp"):
            rest = p.tp * p.pp * p.cp
            if gpus % rest and job.model is not None:
                raise self.fail(f"{kp}.parallel", f"tp*pp*cp = {p.tp}*{p.pp}*{p.cp} = {rest} does not divide the "
                                                  f"job's {gpus} GPUs, so dp cannot be derived; change them")
            p = dataclasses.replace(p, dp=max(1, gpus // rest))
        job = dataclasses.replace(job, parallel=p)
        if job.model is None:
            return job
        shape = model_violations(job.model)
        if shape:
            raise self.fail(f"{kp}.{shape[0].key}", shape[0].message)
        world = p.tp * p.pp * p.dp * p.cp
        if world != gpus:
            raise self.fail(f"{kp}.parallel", f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {world}, but the job "
                                              f"has {gpus} GPUs ({job.nodes} nodes x {gpus_per_node}); they must "
                                              "be equal (leave dp out to derive it)")
        t = job.training
        if not self.given(f"{kp}.training.global_batch") and t.micro_batch * p.dp > 1:
            raise self.fail(f"{kp}.training.global_batch", "this key is required with a model (sequences per "
                                                           f"iteration, a multiple of micro_batch*dp = "
                                                           f"{t.micro_batch * p.dp})")
        broken = layout_violations(job.model, t, p)
        if broken:
            raise self.fail(f"{kp}.{broken[0].key}", broken[0].message)
        return job

    def check_sharp(self, s: Scenario) -> None:
        """In-network reduction needs switches; collnet needs in-network reduction."""
        fabric = s.cluster.fabric
        if fabric.sharp and fabric.kind in ("ring", "torus"):
            raise self.fail("cluster.fabric.sharp", f"in-network reduction needs switches, and a {fabric.kind} "
                                                    "fabric has none: use single_switch, fat_tree, rail or custom")
        if s.collectives.algorithm == "collnet" and not fabric.sharp:
            raise self.fail("collectives.algorithm", "collnet reduces in the switches: set cluster.fabric.sharp: "
                                                     "true (InfiniBand SHARP) or choose another algorithm")

    def derive_virtual_stages(self, p: ParallelSpec) -> ParallelSpec:
        """With a pipeline layout, the virtual stages are its stages over pp (Megatron-LM arguments.py:
        ``virtual_pipeline_model_parallel_size = num_stages // pipeline_model_parallel_size``), so
        ``virtual_stages`` may not be given beside it."""
        text = p.pipeline_model_parallel_layout
        if not text:
            return p
        if self.given("parallel.virtual_stages"):
            raise self.fail("parallel.virtual_stages", "pipeline_model_parallel_layout sets the virtual stages "
                                                       "(its stages / pp, as Megatron derives them): remove "
                                                       "virtual_stages")
        for key in ("first_chunk_layers", "last_chunk_layers"):
            if self.given(f"parallel.{key}"):
                raise self.fail(f"parallel.{key}", f"pipeline_model_parallel_layout places every layer itself: "
                                                   f"remove {key} (Megatron takes the layout or the first/last "
                                                   "split, not both)")
        try:
            stages = len(parse_layout(text))
        except ScenarioError as err:
            raise self.fail(LAYOUT_KEY, err.message) from None
        if p.pp < 1 or stages % p.pp:
            raise self.fail(LAYOUT_KEY, f"pipeline_model_parallel_layout has {stages} stages, which must be pp "
                                        f"({p.pp}) x virtual stages: {stages} is not a multiple of {p.pp}")
        return dataclasses.replace(p, virtual_stages=stages // p.pp)

    def derive_dp(self, p: ParallelSpec) -> ParallelSpec:
        gpus = self.gpus()
        if self.given("parallel.dp") or not gpus:
            return p
        rest = p.tp * p.pp * p.cp
        if gpus % rest == 0:
            return dataclasses.replace(p, dp=gpus // rest)
        if self.s.model is not None:
            raise self.fail("parallel", f"tp*pp*cp = {p.tp}*{p.pp}*{p.cp} = {rest} does not divide "
                                        f"the {gpus} GPUs, so dp cannot be derived; change them")
        return p

    def check_fabric(self, s: Scenario) -> None:
        """Keys of one fabric kind given with another, and the dragonfly's global links."""
        f, kp = s.cluster.fabric, "cluster.fabric"
        for key, kinds in FABRIC_ONLY.items():
            if self.given(f"{kp}.{key}") and f.kind not in kinds:
                raise self.fail(f"{kp}.{key}", f"{key} is only read with kind: {' | '.join(kinds)} "
                                               f'(kind is "{f.kind}")')
        if self.given(f"{kp}.seed") and f.routing != "ecmp_hash":
            raise self.fail(f"{kp}.seed", f'seed is only read with routing: ecmp_hash (routing is "{f.routing}")')
        if f.kind == "dragonfly" and f.global_links > f.group_size:
            raise self.fail(f"{kp}.global_links", f"global_links ({f.global_links}) must be at most group_size "
                                                  f"({f.group_size}): each router holds one link to a group")

    def check_timing(self, s: Scenario) -> None:
        """``at``/``until`` only on link faults, until after at, no timed extra latency."""
        for i, o in enumerate(s.cluster.overrides):
            kp = f"cluster.overrides[{i}]"
            timed = o.at is not None or o.until is not None
            if timed and o.kind not in ("link_degrade", "link_fail"):
                key = "at" if o.at is not None else "until"
                raise self.fail(f"{kp}.{key}", f"{key} is only read with kind: link_degrade | link_fail (a link "
                                               f'that fails or degrades in the middle of a run; kind is "{o.kind}")')
            if o.until is not None and o.until <= (o.at or 0.0):
                raise self.fail(f"{kp}.until", f"until ({o.until:g} s) must be after at ({o.at or 0.0:g} s)")
            if timed and o.extra_latency:
                raise self.fail(f"{kp}.extra_latency", "extra_latency cannot be timed (a flow's latency is paid "
                                                       "when it starts); give it without at/until, or use factor")

    def check_targets(self, s: Scenario) -> None:
        gpus, nodes = s.gpus, (s.cluster.nodes if s.cluster.node is not None else 0)
        for i, o in enumerate(s.cluster.overrides):
            kp = f"cluster.overrides[{i}].target"
            m = TARGET.match(o.target)
            link = "->" in o.target or not m
            allowed = {"gpu_slowdown": ("gpu", "node"), "node_fail": ("node",)}.get(o.kind)
            kind = "link" if link else (m.group(1) if m else None)
            if allowed is not None and kind not in allowed:  # links are checked on the topology
                forms = {"gpu": '"gpu:N"', "node": '"node:N"', "link": '"src->dst"'}
                raise self.fail(kp, f"expected {' or '.join(forms[a] for a in allowed)} for {o.kind}, "
                                    f"got {show(o.target)}")
            if m and kind == "gpu" and gpus and int(m.group(2)) >= gpus:
                raise self.fail(kp, f"there is no gpu {m.group(2)}: the cluster has GPUs 0 to {gpus - 1}")
            if m and kind == "node" and nodes and int(m.group(2)) >= nodes:
                raise self.fail(kp, f"there is no node {m.group(2)}: the cluster has nodes 0 to {nodes - 1}")
            if o.kind == "node_fail":  # faults.py refuses it too; here it is named with its file and line
                raise self.fail(f"cluster.overrides[{i}]", f"{o.target} has failed and a job cannot run on a failed "
                                                           "node; reduce cluster.nodes (and the parallel layout) "
                                                           "to leave it out")

    def check_live(self, s: Scenario) -> None:
        """The skew model's parameters are read only with ``live.skew: model``."""
        if s.live.skew == "model":
            return
        for key in ("skew_base", "skew_slope"):
            if self.given(f"live.{key}"):
                raise self.fail(f"live.{key}", f"{key} is only read with live.skew: model (live.skew is "
                                               f'"{s.live.skew}"); set live.skew: model, or leave {key} out')

    def check_profile(self, s: Scenario) -> Scenario:
        """A profiled workload (``workload.profile``): what a one-GPU profile can be predicted at, and
        by default the batch it ran (the profiled micro-batch, one per data-parallel rank and step)."""
        w = s.workload
        if w.profile is None:
            if w.profiled is not None:
                raise self.fail("workload.profiled", "profiled describes a workload.profile; give the profile, "
                                                     "or leave profiled out")
            return s
        if w.trace is not None:
            raise self.fail("workload.profile", "give workload.profile (predict your script from its profile) or "
                                                "workload.trace (replay a trace as it ran), not both")
        if w.profiled is None:
            raise self.fail("workload.profile", "a profile needs workload.profiled: {micro_batch, seq_len, layers, "
                                                "hidden, heads, vocab}, what the profiled step ran")
        if w.mirror:
            raise self.fail("workload.mirror", "mirror replays a trace; a profile runs data-parallel by parallel.dp")
        for key in ("format", "comm_groups"):
            if self.given(f"workload.{key}"):
                raise self.fail(f"workload.{key}", f"workload.{key} is {getattr(w, key)!r}: it reads a "
                                                   "workload.trace; a workload.profile is always a PyTorch profiler "
                                                   f"(Kineto) trace: leave workload.{key} out")
        for key in PROFILE_FIXES:
            if self.given(f"model.{key}"):
                value = getattr(s.model, key, None) if s.model is not None else None
                raise self.fail(f"model.{key}", f"model.{key} is {shown(value)}, but the profiled script fixes "
                                                f"its {PROFILE_FIXES[key]}: its own kernels, in the trace, are "
                                                f"what runs; leave model.{key} out (or profile a script with it)")
        if self.given("training.fp8_params"):
            fp8 = shown(s.training.fp8_params)
            raise self.fail("training.fp8_params", f"training.fp8_params is {fp8}, but the profiled "
                                                   "script fixes its weights' type (the trace's parameters); "
                                                   "leave training.fp8_params out")
        p, t = s.parallel, s.training
        for key, value in (("cp", p.cp), ("ep", p.ep)):
            if value > 1:
                raise self.fail(f"parallel.{key}", f"{key} = {value}: a one-GPU profile does not say how the "
                                                   "script's attention or experts would split over GPUs; "
                                                   "profiled workloads run dp, zero (1-3, FSDP), pp and tp")
        if p.sequence_parallel:
            raise self.fail("parallel.sequence_parallel", "sequence parallelism is not derived from a profile: "
                                                          "which of the script's element-wise kernels run on "
                                                          "sequence shards is not in it (tp alone is)")
        if t.recompute != "none":
            raise self.fail("training.recompute", "the profile already holds whatever the script recomputes; "
                                                  "training.recompute applies to generated workloads")
        mb = t.micro_batch if self.given("training.micro_batch") else w.profiled.micro_batch
        gb = t.global_batch if self.given("training.global_batch") else mb * p.dp
        # absent, the optimizer is the profiled script's own (memory.profiled_state_bytes)
        opt = t.optimizer if self.given("training.optimizer") else SCRIPT_OPTIMIZER
        # the keys the profile itself records, checked against it when it is read (workload/profiled.py
        # ``check_keys``), and workload.profile itself (``check_gpu``): where the file gave each, for the message
        given = tuple((kp, self.where(kp)) for kp in PROFILE_RECORDS + ("workload.profile",) if self.given(kp))
        return dataclasses.replace(s, training=dataclasses.replace(t, micro_batch=mb, global_batch=gb, optimizer=opt),
                                   given=given)

    def check_mirror(self, s: Scenario) -> None:
        """A mirrored trace replays one rank as ``mirror`` ranks: at most one per GPU (checked here,
        before the importer builds them all)."""
        gpus = self.gpus()
        if s.workload.mirror and gpus and s.workload.mirror > gpus:
            raise self.fail("workload.mirror", f"mirror {s.workload.mirror} replays the trace as "
                                               f"{s.workload.mirror} ranks, but the cluster has {gpus} GPUs; "
                                               f"expected at most {gpus}")

    def check_layout(self, m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> None:
        """The model's shape, the world size against the cluster, the batch being given, then the rule book."""
        shape = model_violations(m)
        if shape:
            raise self.fail(shape[0].key, shape[0].message)
        gpus = self.gpus()
        world = p.tp * p.pp * p.dp * p.cp
        if gpus and world != gpus:
            c = self.s.cluster
            nodes = f" ({c.nodes} nodes x {c.node.gpus_per_node})" if c.node else ""
            raise self.fail("parallel.dp" if self.given("parallel.dp") else "parallel",
                            f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {world}, but the cluster has "
                            f"{gpus} GPUs{nodes}; they must be equal (leave dp out to derive it)")
        per_step = t.micro_batch * p.dp
        if not self.given("training.global_batch") and per_step > 1 and self.s.workload.profile is None:
            raise self.fail("training.global_batch", f"this key is required with a model (sequences per "
                                                     f"iteration, a multiple of micro_batch*dp = {per_step})")
        broken = layout_violations(m, t, p)
        if broken:
            raise self.fail(broken[0].key, broken[0].message)

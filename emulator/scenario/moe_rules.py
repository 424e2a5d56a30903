"""The rules of Megatron-Core's mixture of experts: the router and its scores, the token dispatchers (alltoall, flex
with DeepEP or HybridEP), the measured or drawn expert loads, MoE parallel folding's expert grid, the quantised
GEMMs' router padding, HybridEP's per-rank budget and the all-to-all overlap (Megatron-Core transformer_config.py and
moe/ @ d98e8a64dd). Pure functions of the specs, as rules.py's, which calls them in its order.
"""
from __future__ import annotations

from emulator.scenario import deepep_buffers as DEEPEP
from emulator.scenario.spec import ModelSpec, ParallelSpec, TrainingSpec
from emulator.scenario.stages import V_SHAPED
from emulator.scenario.violation import Violation


def moe_model_violations(m: ModelSpec) -> list[Violation]:
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
                     "moe_router_fusion", "moe_latent_size"):
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


def dispatch_violations(m: ModelSpec, p: ParallelSpec) -> list[Violation]:
    """The dispatcher keys: flex with DeepEP refuses padding to capacity (Megatron-Core transformer_config.py;
    HybridEP takes it); DeepEP's EP sizes and even SM count (scenario/deepep_buffers.py);
    the emulator's flex dispatch runs the experts without tensor parallelism (etp 1, or tp 1); shared expert
    overlap needs shared experts and the alltoall or flex dispatcher (transformer_config.py)."""
    out: list[Violation] = []
    etp = p.etp or p.tp
    if p.moe_token_dispatcher_type == "flex":
        if m.moe_pad_expert_input_to_capacity and p.moe_flex_dispatcher_backend == "deepep":
            out.append(Violation("parallel.moe_token_dispatcher_type", "the flex dispatcher with deepep does not "
                                                                       "support model.moe_pad_expert_input_to_"
                                                                       "capacity (Megatron-Core refuses it)"))
        if p.moe_flex_dispatcher_backend == "deepep" and etp == 1 and p.ep not in DEEPEP.CONFIGS:
            sizes = ", ".join(str(n) for n in DEEPEP.CONFIGS)
            out.append(Violation("parallel.ep", f"DeepEP has no configuration for {p.ep} EP ranks (deep_ep Buffer."
                                                f"get_dispatch_config: {sizes})"))
        if p.moe_flex_dispatcher_backend == "deepep" and p.moe_flex_dispatcher_num_sms % 2:
            out.append(Violation("parallel.moe_flex_dispatcher_num_sms", f"DeepEP needs an even SM count, got "
                                                                          f"{p.moe_flex_dispatcher_num_sms} (deep_ep "
                                                                          "Buffer.set_num_sms asserts it)"))
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
        if m.moe_latent_size:
            out.append(Violation("parallel.moe_shared_expert_overlap", "moe_shared_expert_overlap is not supported "
                                                                       "with model.moe_latent_size in training "
                                                                       "(Megatron-Core's MoELayer.preprocess "
                                                                       "asserts it)"))
    return out


def _expert_load_violations(m: ModelSpec) -> list[Violation]:
    """A measured distribution: one row for every MoE layer or one per MoE layer, each one number per expert,
    not all zero, no expert above every token; not together with moe_imbalance (it says the same thing,
    measured). A drawn load (moe_load_seed) excludes both; its concentration needs the seed."""
    out = _seed_violations(m)
    rows = m.moe_expert_load
    if not rows:
        return out
    main = m.hybrid_layer_pattern.split("/")[0]  # a hybrid model's decoder (hybrid_rules.split_pattern)
    moe_layers = main.count("E") if m.hybrid_layer_pattern else m.layers - m.first_dense_layers
    where = ("the E layers of hybrid_layer_pattern" if m.hybrid_layer_pattern else
             f"layers {m.layers} − first_dense_layers {m.first_dense_layers}")
    if len(rows) not in (1, moe_layers):
        return out + [Violation("model.moe_expert_load", f"moe_expert_load has {len(rows)} rows; expected one (every "
                                                         f"MoE layer) or one per MoE layer ({moe_layers}: {where})")]
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


def a2a_overlap_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
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


def router_padding_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """moe_router_padding_for_quantization as Megatron-Core's TransformerConfig checks it (transformer_config.py
    @ d98e8a64dd): fp8 or fp4 training, and not the allgather dispatcher; and an MoE model."""
    key = "model.moe_router_padding_for_quantization"
    if not m.moe_router_padding_for_quantization:
        return []
    out: list[Violation] = []
    if not m.experts:
        out.append(Violation(key, "moe_router_padding_for_quantization needs an MoE model (model.experts > 0)"))
    if t.precision not in ("fp8", "mxfp8", "nvfp4"):
        out.append(Violation(key, f"moe_router_padding_for_quantization needs fp8, mxfp8 or nvfp4 training "
                                  f"(training.precision is {t.precision}; Megatron-Core refuses it)"))
    if p.moe_token_dispatcher_type == "allgather":
        out.append(Violation(key, "the allgather dispatcher does not support moe_router_padding_for_quantization "
                                  "(Megatron-Core refuses it)"))
    return out


def static_hybridep(m: ModelSpec, p: ParallelSpec) -> bool:
    """HybridEP with a static receive budget: no host sync in the MoE layer."""
    return (m.moe_expert_rank_capacity_factor is not None and p.moe_token_dispatcher_type == "flex"
            and p.moe_flex_dispatcher_backend == "hybridep")


def rank_budget_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """moe_expert_rank_capacity_factor and moe_paged_stash as Megatron-Core's TransformerConfig checks them
    (transformer_config.py @ d98e8a64dd, ``__post_init__``): the budget needs the flex dispatcher's hybridep (or
    ncclep, which the emulator does not model) backend; the stash needs the budget, and the routed experts'
    modules must not be offloaded as well."""
    out: list[Violation] = []
    key = "model.moe_expert_rank_capacity_factor"
    if m.moe_expert_rank_capacity_factor is not None:
        if not m.experts:
            out.append(Violation(key, "moe_expert_rank_capacity_factor needs an MoE model (model.experts > 0)"))
        elif not static_hybridep(m, p):
            out.append(Violation(key, "moe_expert_rank_capacity_factor requires the flex dispatcher's hybridep backend "
                                      "(parallel.moe_token_dispatcher_type flex, moe_flex_dispatcher_backend hybridep; "
                                      "Megatron-Core also takes ncclep, which the emulator does not model)"))
    if not m.moe_paged_stash:
        return out
    stash = "model.moe_paged_stash"
    if m.moe_expert_rank_capacity_factor is None:
        out.append(Violation(stash, "moe_paged_stash requires model.moe_expert_rank_capacity_factor to be set; there "
                                    "is no need to use paged stashing without it (Megatron-Core)"))
    offloaded = (t.offload_modules or ()) if t.fine_grained_activation_offloading else ()
    both = [x for x in ("expert_fc1", "moe_act") if x in offloaded]
    if both:
        out.append(Violation("training.offload_modules", f"with model.moe_paged_stash, offload_modules must not "
                                                         f"include {', '.join(both)}: the paged stash covers those "
                                                         f"activations (Megatron-Core)"))
    return out


def expert_grid_violations(m: ModelSpec, p: ParallelSpec) -> list[Violation]:
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

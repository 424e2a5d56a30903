"""The rule book: Megatron's layout rules, written once, as pure functions of the specs.

:func:`layout_violations` is the one place that says whether a model, its training
batch and a parallel layout go together (heads, FFN and KV heads over tp, layers over
the pipeline chunks, batches over micro-batches and data-parallel replicas, experts
over ep, sequence over cp·tp, the interleaved schedule's micro-batch rule), and
:func:`model_violations` whether the model's own shape holds. Each broken rule is a
:class:`Violation`: the key path to change and what is wrong, in the loader's words.
The loader (checks.py), the workload plan and the layout search all call it, so a
layout the search keeps is a layout the loader accepts.

The rules of single features live beside it, one module each, and are called from here in order: the mixture of
experts' (moe_rules.py), the hybrid stacks', DeepSeek's sparse and compressed attention's, the op fuser's,
the optimizer's.

Nothing here reads a file or knows where a key was written: the loader's checks
(checks.py) name the file and line of the key a violation gives.
"""
from __future__ import annotations

import difflib

from emulator.errors import ScenarioError
from emulator.scenario.compressed_attention_rules import (
    dsv4_layout_violations,
    dsv4_model_violations,
    mhc_violations,
)
from emulator.scenario.fsdp_rules import hsdp_violations
from emulator.scenario.hybrid_rules import hybrid_layout_violations, hybrid_model_violations
from emulator.scenario.moe_rules import (
    a2a_overlap_violations,
    dispatch_violations,
    expert_grid_violations,
    moe_model_violations,
    rank_budget_violations,
    router_padding_violations,
    static_hybridep,
)
from emulator.scenario.op_fuser_rules import op_fuser_violations
from emulator.scenario.optimizer_rules import optimizer_violations
from emulator.scenario.sparse_attention_rules import dsa_layout_violations, dsa_model_violations
from emulator.scenario.spec import QUANTISED, SCHEDULES, ModelSpec, ParallelSpec, TrainingSpec
from emulator.scenario.stages import LAYOUT_KEY, V_SHAPED, model_chunks
from emulator.scenario.violation import Violation

__all__ = ["Violation", "layout_violations", "model_violations", "schedule_violations"]


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
    return out + moe_model_violations(m) + _mla_violations(m) + hybrid_model_violations(m) + dsa_model_violations(m) \
        + dsv4_model_violations(m)


def _mla_violations(m: ModelSpec) -> list[Violation]:
    """Multi-latent attention: its dims need kv_lora_rank, and it is multi-head (no separate KV heads)."""
    out: list[Violation] = []
    if not m.kv_lora_rank:
        # dsv4_hybrid takes the query's rank and the rope dims (compressed_attention_rules.py)
        own = ("q_lora_rank", "qk_rope_head_dim") if m.experimental_attention_variant == "dsv4_hybrid" else ()
        for name in sorted({"q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"} - set(own)):
            if getattr(m, name):
                out.append(Violation(f"model.{name}", f"{name} ({getattr(m, name)}) needs kv_lora_rank > 0 "
                                                      "(multi-latent attention)"))
        return out
    if m.kv_heads and m.kv_heads != m.heads:
        out.append(Violation("model.kv_heads", f"multi-latent attention has one key/value head per query head: "
                                               f"kv_heads ({m.kv_heads}) must be 0 or heads ({m.heads})"))
    if m.attention_output_gate:
        out.append(Violation("model.attention_output_gate", "attention_output_gate with multi-latent attention is "
                                                            "not modelled (Megatron-Core gates the QKV projection)"))
    return out


def layout_violations(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> list[Violation]:
    """Every rule that ``parallel`` breaks for ``model`` and ``training``, in the order the loader
    reports them; the model's own shape first (a broken shape stops there)."""
    out = model_violations(model) + _size_violations(training, parallel)
    if out:
        return out
    m, t, p = model.resolved(), training, parallel
    out += schedule_violations(p)
    out += optimizer_violations(m, t, p) + _fp8_attention_violations(t)
    out += _output_proj_violations(t)
    out += expert_grid_violations(m, p) + dispatch_violations(m, p) + hsdp_violations(m, p)
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
    out += _recompute_violations(m, t) + _offload_violations(m, t, p) + router_padding_violations(m, t, p)
    out += rank_budget_violations(m, t, p) + _cpu_offload_violations(m, t, p)
    out += _cuda_graph_violations(m, t, p)
    out += _tensor_violations(m, p) + hybrid_layout_violations(m, t, p) + dsa_layout_violations(m, t, p)
    out += dsv4_layout_violations(m, t, p) + mhc_violations(m, t) + op_fuser_violations(m, t, p)
    out += a2a_overlap_violations(m, t, p)
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
    "selective"), and mla_up_proj needs multi-latent attention (transformer_config.py raises); recompute_method and
    recompute_num_layers shape a full recompute only (Megatron-Core takes recompute_num_layers under full alone)."""
    if t.recompute != "full" and (t.recompute_method != "uniform" or t.recompute_num_layers != 1):
        key = "training.recompute_method" if t.recompute_method != "uniform" else "training.recompute_num_layers"
        return [Violation(key, f"recompute_method and recompute_num_layers shape a full recompute (Megatron's "
                               f"--recompute-granularity full); recompute is {t.recompute}")]
    mods = t.recompute_modules
    if mods is None:
        return []
    if t.recompute != "selective":
        return [Violation("training.recompute_modules", f"recompute_modules are recomputed under recompute: "
                                                        f"selective (Megatron's --recompute-granularity selective); "
                                                        f"recompute is {t.recompute}")]
    if "mla_up_proj" in mods and not m.kv_lora_rank and m.experimental_attention_variant != "dsv4_hybrid":
        return [Violation("training.recompute_modules", "mla_up_proj needs multi-latent attention "
                                                        "(model.kv_lora_rank > 0) or dsv4_hybrid's q_b")]
    return []


def _fp8_attention_violations(t: TrainingSpec) -> list[Violation]:
    """FP8 attention as Transformer Engine runs it: inside a quantised autocast, in its FusedAttention (cuDNN)
    backend only (recipe/__init__.py: "FP8 DPA currently is only supported in the FusedAttention backend")."""
    if not t.fp8_dot_product_attention:
        return []
    key = "training.fp8_dot_product_attention"
    if t.precision not in QUANTISED:
        return [Violation(key, f"FP8 attention runs inside Transformer Engine's quantised autocast: set training."
                               f"precision fp8, mxfp8 or nvfp4 (it is {t.precision})")]
    if t.attention != "flash":
        return [Violation(key, f"FP8 attention runs only in Transformer Engine's FusedAttention (cuDNN) backend: set "
                               f"training.attention flash (it is {t.attention})")]
    return []


def _output_proj_violations(t: TrainingSpec) -> list[Violation]:
    """Megatron-Core's MXFP8 LM head: fp8 mode with the mxfp8 recipe only (transformer_config.py @ d98e8a64dd,
    __post_init__: "fp8_output_proj requires fp8_recipe='mxfp8'")."""
    if not t.fp8_output_proj or t.precision == "mxfp8":
        return []
    return [Violation("training.fp8_output_proj", f"the MXFP8 output layer needs training.precision mxfp8 (Megatron-"
                                                  f"Core requires fp8_recipe mxfp8 for it; it is {t.precision})")]


def _cpu_offload_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """Layer-wise CPU offloading as Megatron-Core's TransformerConfig checks it (transformer_config.py @ d98e8a64dd,
    ``__post_init__``): fewer offloaded layers than layers, no pipeline parallelism, no recomputation, no
    fine-grained offloading or paged stash beside it, CUDA graphs only of the whole iteration; plus the all-to-all
    overlap, whose combined steps the emulator does not offload."""
    key = "training.cpu_offloading"
    if not t.cpu_offloading:
        return [Violation("training.cpu_offloading_num_layers", "cpu_offloading_num_layers is read with training."
                                                                "cpu_offloading: true")] \
            if t.cpu_offloading_num_layers else []
    checks = [
        (t.cpu_offloading_num_layers >= m.layers, "training.cpu_offloading_num_layers",
         f"CPU offloading can be done only for layers less than {m.layers} (Megatron-Core); got "
         f"{t.cpu_offloading_num_layers}"),
        (p.pp > 1, key, "there is no support for pipeline parallelism with CPU offloading (Megatron-Core)"),
        (t.recompute != "none", key, "CPU offloading does not work when activation recomputation is enabled "
                                     "(Megatron-Core): set training.recompute none"),
        (t.cuda_graph_impl not in ("none", "full_iteration"), key,
         "CUDA graphs are not supported with CPU offloading but of the whole iteration (Megatron-Core)"),
        (t.fine_grained_activation_offloading, key,
         "fine_grained_activation_offloading cannot be enabled with cpu_offloading (Megatron-Core)"),
        (m.moe_paged_stash, key, "moe_paged_stash cannot be enabled with cpu_offloading (Megatron-Core)"),
        (p.overlap_moe_expert_parallel_comm, key,
         "CPU offloading is not modelled with overlap_moe_expert_parallel_comm's combined steps"),
    ]
    return [Violation(k, why) for bad, k, why in checks if bad]


def _offload_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """Fine-grained activation offloading as Megatron-Core's TransformerConfig checks it (transformer_config.py @
    d98e8a64dd, ``__post_init__``: offload_modules not empty, attn_proj only with core_attn, no expert module
    offloaded while the whole MoE layer is recomputed), plus what the emulator cannot honour: modules without the
    switch, expert modules without experts, full recompute (a layer then keeps only its input), and DualPipe's
    schedules (two model copies a rank), whose copies are not modelled."""
    key, mods = "training.offload_modules", t.offload_modules or ()
    if not t.fine_grained_activation_offloading:
        if t.activation_offload_fraction < 1:
            return [Violation("training.activation_offload_fraction", "activation_offload_fraction shares out the "
                                                                     "groups of fine_grained_activation_offloading: "
                                                                     "set it true")]
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
    if p.schedule in ("dualpipe", "dualpipev"):
        out.append(Violation("training.fine_grained_activation_offloading",
                             f"offloading is not modelled with schedule {p.schedule} (DualPipe's two model copies)"))
    return out


def _cuda_graph_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """CUDA graphs as Megatron-Core's TransformerConfig checks them (transformer_config.py @ d98e8a64dd,
    ``__post_init__``), plus one the capture itself enforces: a graph cannot hold a host sync, so a dropless MoE
    layer (its dispatcher reads the token counts on the host) is not captured whole (``moe``, an empty module list,
    or full_iteration)."""
    impl, mods, key = t.cuda_graph_impl, t.cuda_graph_modules, "training.cuda_graph_modules"
    if impl == "none":
        return [Violation(key, "cuda_graph_modules are captured with training.cuda_graph_impl local or "
                               "transformer_engine")] if mods else []
    out: list[Violation] = []
    if impl == "full_iteration" and mods:
        out.append(Violation(key, 'cuda_graph_modules must be empty when cuda_graph_impl is full_iteration '
                                  '(Megatron-Core asserts it)'))
    if "moe" in mods and "moe_router" in mods:
        out.append(Violation(key, "cuda_graph_modules must not contain both moe and moe_router (Megatron-Core)"))
    if impl == "transformer_engine" and "moe_preprocess" in mods and "moe_router" not in mods:
        out.append(Violation(key, "moe_preprocess is captured only with moe_router (Megatron-Core)"))
    moe_mods = [x for x in ("moe", "moe_router", "moe_preprocess") if x in mods]
    if moe_mods and not m.experts:
        out.append(Violation(key, f"{', '.join(moe_mods)} needs an MoE model (model.experts > 0)"))
    if "mlp" in mods and m.experts and not m.first_dense_layers and "-" not in m.hybrid_layer_pattern:
        out.append(Violation(key, "mlp captures a dense layer's MLP, and every layer of this model is MoE "
                                  "(Megatron-Core refuses it)"))
    drop_pad = m.moe_expert_capacity_factor is not None and m.moe_pad_expert_input_to_capacity
    static = static_hybridep(m, p)
    whole = impl == "full_iteration" or not mods or "moe" in mods
    if m.experts and whole and not (drop_pad or static):
        out.append(Violation(key if impl != "full_iteration" else "training.cuda_graph_impl",
                             "a dropless MoE layer cannot be captured whole: its dispatcher syncs with the host for "
                             "the token counts (Megatron-Core: moe is captured only with drop-and-pad, "
                             "model.moe_expert_capacity_factor and moe_pad_expert_input_to_capacity, or HybridEP's "
                             "static budget, model.moe_expert_rank_capacity_factor); capture "
                             + ("[attn, moe_router, moe_preprocess] instead" if impl != "full_iteration" else
                                "per layer instead: cuda_graph_impl transformer_engine, cuda_graph_modules [attn, "
                                "moe_router, moe_preprocess]")))
    if "moe_preprocess" in mods and p.moe_token_dispatcher_type == "alltoall" and not drop_pad and (
            m.moe_expert_capacity_factor is not None or m.moe_router_padding_for_quantization):
        out.append(Violation(key, "moe_preprocess cannot be captured: with token dropping or router padding the "
                                  "alltoall dispatcher's preprocess copies and syncs with the host (Megatron-Core)"))
    if t.recompute == "full" and impl != "full_iteration":
        out.append(Violation("training.recompute", "full recompute is supported only with cuda_graph_impl "
                                                   "full_iteration (Megatron-Core)"))
    if p.overlap_moe_expert_parallel_comm and impl != "full_iteration" and (not mods or "moe" in mods):
        out.append(Violation(key, "overlap_moe_expert_parallel_comm needs the MoE MLP outside the graphs (Megatron-"
                                  "Core: EP overlap must be disabled when a CUDA graph captures the whole MoE)"))
    return out


def _size_violations(t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """Sizes of at least 1 (the key table enforces them in files; specs made in code may break them)."""
    sizes = [(f"parallel.{n}", getattr(p, n)) for n in ("tp", "pp", "dp", "cp", "ep", "virtual_stages")]
    sizes += [("parallel.etp", p.etp)] if p.etp is not None else []  # None: as tp
    sizes += [("training.micro_batch", t.micro_batch), ("training.global_batch", t.global_batch)]
    return [Violation(key, f"expected at least 1, got {x}") for key, x in sizes if x < 1]


def schedule_violations(p: ParallelSpec) -> list[Violation]:
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

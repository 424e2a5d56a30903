"""The rule book's rules for hybrid models (``model.hybrid_layer_pattern``: Nemotron-H, workload/hybrid.py).

Megatron-Core's own checks (megatron/core/models/hybrid/hybrid_layer_allocation.py and
megatron/core/ssm/mamba_mixer.py @ d98e8a64dd): the pattern's symbols, one per layer, and its MTP
depths after "/", identical and as many as mtp_num_layers; the Mamba-2 mixer's heads and groups split
over tensor parallelism, its heads over its groups. And what the emulator does not model for them,
refused by name: the pattern's other symbols, multi-latent attention, sliding windows, and the features
whose per-layer models take a transformer layer
(activation offloading, the all-to-all overlap, the paged stash).
"""
from __future__ import annotations

from emulator.scenario.spec import ModelSpec, ParallelSpec, TrainingSpec
from emulator.scenario.violation import Violation

_KEY = "model.hybrid_layer_pattern"
SYMBOLS = "MG*-E"  # workload/hybrid.py: Mamba, gated delta net, attention, MLP, MoE
REFUSED = {"D": "DeepSeek sparse attention", "+": "multi-latent attention",
           "|": "a pipeline-stage boundary (set parallel.pipeline_model_parallel_layout or pp instead)"}


MTP_SEPARATOR = "/"


def split_pattern(pattern: str) -> tuple[str, list[str]]:
    """(the decoder's pattern, one pattern per MTP depth): Megatron-Core's ``parse_hybrid_pattern``, which takes
    "<main>/<mtp>/<mtp>..." (hybrid_layer_allocation.py @ d98e8a64dd)."""
    main, *mtp = pattern.split(MTP_SEPARATOR)
    return main, [p for p in mtp if p] if any(mtp) else []


EXPAND = 2  # MambaMixer(expand=2) @ d98e8a64dd: d_inner = 2·hidden where mamba_num_heads is not given


def mixer_heads(m: ModelSpec) -> int:
    """The Mamba-2 mixer's heads: mamba_num_heads, else EXPAND·hidden / mamba_head_dim."""
    return m.mamba_num_heads or EXPAND * m.hidden // m.mamba_head_dim


def hybrid_model_violations(m: ModelSpec) -> list[Violation]:
    """The pattern's symbols and length, its MoE layers against the experts, and the model keys a hybrid model
    does not take."""
    pattern = m.hybrid_layer_pattern
    if not pattern:
        return [Violation("model.mamba_num_heads", "mamba_num_heads needs a hybrid model "
                                                   "(model.hybrid_layer_pattern with M layers)")] \
            if m.mamba_num_heads else []
    main, mtp = split_pattern(pattern)
    for sym in pattern.replace(MTP_SEPARATOR, ""):
        if sym not in SYMBOLS:
            what = REFUSED.get(sym)
            return [Violation(_KEY, f"symbol {sym!r} ({what}) is not modelled; a pattern takes M (Mamba-2), G "
                                    f"(gated delta net), * (attention), - (MLP) and E (MoE)" if what else
                                    f"unknown symbol {sym!r}; a pattern takes M (Mamba-2), G (gated delta net), * "
                                    f"(attention), - (MLP) and E (MoE), one per layer")]
    out: list[Violation] = []
    if len(main) != m.layers:
        out.append(Violation(_KEY, f"hybrid_layer_pattern has {len(main)} symbols, but layers is {m.layers}: one "
                                   f"symbol per layer (Megatron-Core asserts it)"))
    if len(set(mtp)) > 1:
        out.append(Violation(_KEY, f"all MTP patterns must be identical, got {', '.join(mtp)} (Megatron-Core's "
                                   f"parse_hybrid_pattern)"))
    if len(mtp) != m.mtp_num_layers:
        out.append(Violation("model.mtp_num_layers", f"mtp_num_layers ({m.mtp_num_layers}) must be the MTP depths of "
                                                     f"hybrid_layer_pattern ({len(mtp)}: one pattern after each /)"))
    if "E" in pattern and not m.experts:
        out.append(Violation(_KEY, "the pattern's E layers need experts (model.experts > 0)"))
    if m.experts and "E" not in pattern:
        out.append(Violation("model.experts", "a hybrid model's experts live in its E layers; the pattern has none"))
    for name, what in (("first_dense_layers", "the pattern places the dense MLPs (-)"),
                       ("kv_lora_rank", "the pattern's attention (*) is standard attention"),
                       ("sliding_window", "sliding windows are not modelled in a hybrid model")):
        if getattr(m, name):
            out.append(Violation(f"model.{name}", f"{name} is not taken by a hybrid model: {what}"))
    heads = mixer_heads(m)
    if "M" in pattern and (heads < 1 or heads % m.mamba_num_groups):
        out.append(Violation("model.mamba_num_groups", f"the Mamba heads ({heads}) must be a multiple of "
                                                       f"mamba_num_groups ({m.mamba_num_groups}) (MambaMixer asserts "
                                                       f"nheads % ngroups == 0)"))
    if "G" in pattern and m.linear_num_value_heads % m.linear_num_key_heads:
        out.append(Violation("model.linear_num_value_heads",
                             f"the gated delta net's value heads ({m.linear_num_value_heads}) must be a multiple of "
                             f"its key heads ({m.linear_num_key_heads}): each key head serves V/K value heads"))
    return out


def _mamba_cp_violations(heads: int, groups: int, cp: int) -> list[Violation]:
    """Megatron-Core's MambaContextParallel: cp divides a TP rank's heads, and its groups (or they divide cp, each
    group's state then repeated)."""
    if cp <= 1 or not heads or not groups:
        return []
    if heads % cp:
        return [Violation("parallel.cp", f"cp ({cp}) must divide the Mamba heads of a TP rank ({heads}) "
                                         f"(MambaContextParallel asserts it)")]
    if (cp % groups) if groups < cp else (groups % cp):
        return [Violation("parallel.cp", f"cp ({cp}) and the Mamba groups of a TP rank ({groups}) must divide one "
                                         f"another (MambaContextParallel asserts it)")]
    return []


def _delta_violations(m: ModelSpec, p: ParallelSpec) -> list[Violation]:
    """The gated delta net's heads split over tensor parallelism (GatedDeltaNet divides them by the TP size); its
    context parallelism (all-to-alls of heads, as Mamba's) is not modelled."""
    out = [Violation("parallel.tp", f"tp ({p.tp}) must divide the gated delta net's {name} ({n})")
           for name, n in (("linear_num_key_heads", m.linear_num_key_heads),
                           ("linear_num_value_heads", m.linear_num_value_heads)) if n % p.tp]
    if p.cp > 1:
        out.append(Violation("parallel.cp", "context parallelism over gated delta net layers is not modelled"))
    return out


def hybrid_layout_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """Tensor parallelism over the mixer's heads and groups, and the features not modelled for hybrid models."""
    pattern = m.hybrid_layer_pattern
    if not pattern:
        return [Violation("training.cuda_graph_modules", "mamba captures a hybrid model's Mamba layers; this "
                                                         "model has none")] if "mamba" in t.cuda_graph_modules else []
    out: list[Violation] = []
    if "M" in pattern:
        heads = mixer_heads(m)
        for name, n in (("mamba_num_heads", heads), ("mamba_num_groups", m.mamba_num_groups)):
            if n % p.tp:
                out.append(Violation("parallel.tp", f"tp ({p.tp}) must divide the Mamba mixer's {name} ({n}) "
                                                    f"(MambaMixer asserts it)"))
        out += _mamba_cp_violations(heads // p.tp, m.mamba_num_groups // p.tp, p.cp)
    elif "mamba" in t.cuda_graph_modules:
        out.append(Violation("training.cuda_graph_modules", "mamba captures Mamba layers; the pattern has no M"))
    if "G" in pattern:
        out += _delta_violations(m, p)
    if "mlp" in t.cuda_graph_modules and "-" not in pattern:
        out.append(Violation("training.cuda_graph_modules", "mlp captures the dense MLP layers (-); the pattern has "
                                                            "none"))
    if p.overlap_moe_expert_parallel_comm:
        out.append(Violation("parallel.overlap_moe_expert_parallel_comm",
                             "overlap_moe_expert_parallel_comm runs on Megatron-Core's GPTModel only (its combined "
                             "steps: gpt_model.py build_schedule_plan); a hybrid model has none"))
    for key, on in (("training.fine_grained_activation_offloading", t.fine_grained_activation_offloading),
                    ("training.cpu_offloading", t.cpu_offloading),
                    ("model.moe_paged_stash", m.moe_paged_stash)):
        if on:
            out.append(Violation(key, f"{key.split('.')[-1]} is not modelled for a hybrid model"))
    return out

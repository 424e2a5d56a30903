"""The rules of DeepSeek-V4's hybrid attention (``experimental_attention_variant: dsv4_hybrid``) and of mHC.

DeepSeek-V4: Megatron-Bridge 067f987df (models/deepseek/deepseek_v4_bridge.py, training/utils/flop_utils.py, which
supports the ratios 0, 4 and 128 only and needs the indexer's three sizes where a layer has ratio 4); what the
emulator does not model is refused by name (context parallelism, which the bridge's recipes run at 1 and whose
contiguous partition Megatron-Core's dev branch needs; dense leading layers). mHC: Megatron-Core
transformer_config.py @ d98e8a64dd, ``__post_init__`` (the "mhc" recompute module, full recompute, MTP) and
transformer_layer.py (only a HyperConnectionTransformerLayer takes the streams: no hybrid model). Pure functions of
the specs, as rules.py's.
"""
from __future__ import annotations

from emulator.scenario.sparse_attention_rules import INDEXER_KEYS, head_padding_violations
from emulator.scenario.spec import ModelSpec, ParallelSpec, TrainingSpec
from emulator.scenario.violation import Violation

RATIOS = (0, 4, 128)
DSV4_KEYS = ("csa_compress_ratios", "o_groups", "o_lora_rank")
KEY = "model.experimental_attention_variant"


def dsv4_model_violations(m: ModelSpec) -> list[Violation]:
    """dsv4_hybrid needs its ratios (one a layer, or one more a MTP module), its projections' sizes and, with a
    ratio-4 layer, the indexer's; its keys need the variant."""
    if m.experimental_attention_variant != "dsv4_hybrid":
        return [Violation(f"model.{name}", f"{name} needs experimental_attention_variant: dsv4_hybrid")
                for name in DSV4_KEYS if getattr(m, name)]
    out = _ratio_violations(m)
    for name, what in (("q_lora_rank", "the query's latent (q_a → q_b)"), ("head_dim", "the shared key/value head"),
                       ("qk_rope_head_dim", "the rope part of each head"), ("o_groups", "the output's head groups"),
                       ("o_lora_rank", "the output groups' width")):
        if getattr(m, name) < 1:
            out.append(Violation(f"model.{name}", f"dsv4_hybrid needs {name} of at least 1: {what}"))
    if m.head_dim and m.qk_rope_head_dim >= m.head_dim:
        out.append(Violation("model.qk_rope_head_dim", f"the rope dims ({m.qk_rope_head_dim}) must be fewer than "
                                                       f"head_dim ({m.head_dim})"))
    if m.o_groups and m.heads % m.o_groups:
        out.append(Violation("model.o_groups", f"o_groups ({m.o_groups}) must divide heads ({m.heads})"))
    if 4 in m.csa_compress_ratios:
        out += [Violation(f"model.{n}", f"a ratio-4 layer's indexer needs {n} of at least 1")
                for n in INDEXER_KEYS if getattr(m, n) < 1]
    for name, why in (("kv_lora_rank", "its one key/value head is head_dim wide, not multi-latent attention's"),
                      ("sliding_window", "its window is csa_window_size"),
                      ("hybrid_layer_pattern", "a hybrid model's attention is not modelled with it"),
                      ("first_dense_layers", "DeepSeek-V4's layers are all MoE; dense leading ones are not "
                                             "modelled with it")):
        if getattr(m, name):
            out.append(Violation(f"model.{name}", f"{name} with dsv4_hybrid: {why}"))
    if not m.causal:
        out.append(Violation("model.causal", "dsv4_hybrid attends causally"))
    return out


def _ratio_violations(m: ModelSpec) -> list[Violation]:
    key, ratios = "model.csa_compress_ratios", m.csa_compress_ratios
    if len(ratios) not in (m.layers, m.layers + m.mtp_num_layers):
        return [Violation(key, f"dsv4_hybrid needs one ratio a layer ({m.layers}), or one more a MTP module "
                               f"({m.layers + m.mtp_num_layers}); got {len(ratios)}")]
    bad = sorted({r for r in ratios if r not in RATIOS})
    if bad:
        return [Violation(key, f"ratios must be 0, 4 or 128 (Megatron-Bridge's flop_utils.py supports those); got "
                               f"{', '.join(map(str, bad))}")]
    return []


def dsv4_layout_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """The layout and training keys the emulator's DeepSeek-V4 attention needs."""
    if m.experimental_attention_variant != "dsv4_hybrid":
        return []
    out: list[Violation] = []
    if p.cp > 1:
        out.append(Violation("parallel.cp", "dsv4_hybrid under context parallelism is not modelled (Megatron-"
                                            "Bridge's recipes run cp 1; its CSA needs cp_partition_mode contiguous)"))
    if m.o_groups and p.tp > 1 and m.o_groups % p.tp:
        out.append(Violation("parallel.tp", f"tp ({p.tp}) must divide o_groups ({m.o_groups}): each rank's heads "
                                            "hold whole output groups"))
    if t.attention == "unfused":
        out.append(Violation("training.attention", "dsv4_hybrid is modelled as its sparse kernels, which an unfused "
                                                   "attention backend turns off: set attention: flash"))
    if t.fp8_dot_product_attention:
        out.append(Violation("training.fp8_dot_product_attention", "dsv4_hybrid's core attention is not Transformer "
                                                                   "Engine's: no FP8 attention"))
    return out + head_padding_violations(m, p)


def mhc_violations(m: ModelSpec, t: TrainingSpec) -> list[Violation]:
    """mHC's rules as Megatron-Core states them (module docstring)."""
    mods = t.recompute_modules or ()
    out: list[Violation] = []
    if not m.enable_mhc_connections:
        if "mhc" in mods:
            out.append(Violation("training.recompute_modules", "'mhc' in recompute_modules requires "
                                                               "enable_mhc_connections=True (Megatron-Core)"))
        if m.use_fused_mhc:
            out.append(Violation("model.use_fused_mhc", "use_fused_mhc needs enable_mhc_connections: true"))
        return out
    if "mhc" in mods and "mlp" in mods:
        out.append(Violation("training.recompute_modules", "'mhc' and 'mlp' in recompute_modules cannot be used "
                                                           "together (Megatron-Core)"))
    if "mhc" in mods and t.fine_grained_activation_offloading:
        out.append(Violation("training.recompute_modules", "'mhc' in recompute_modules with fine-grained activation "
                                                           "offloading is not yet supported (Megatron-Core)"))
    if t.recompute == "full":
        out.append(Violation("training.recompute", "enable_mhc_connections is not yet compatible with full "
                                                   "activation recompute (Megatron-Core): use selective with 'mhc'"))
    if m.mtp_num_layers and m.experimental_attention_variant != "dsv4_hybrid":
        out.append(Violation("model.mtp_num_layers", "enable_mhc_connections is not compatible with Multi-Token "
                                                     "Prediction (Megatron-Core; DeepSeek-V4's dev-branch model "
                                                     "has its own MTP streams)"))
    if m.hybrid_layer_pattern:
        out.append(Violation("model.enable_mhc_connections", "mHC takes a HyperConnectionTransformerLayer: not a "
                                                             "hybrid model's Mamba or delta-net layers"))
    return out

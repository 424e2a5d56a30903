"""The rules of DeepSeek Sparse Attention (``model.experimental_attention_variant: dsa``), as Megatron-Core states them.

Megatron-Core @ d98e8a64dd: get_dsa_module_spec_for_backend (megatron/core/models/gpt/
experimental_attention_variant_module_specs.py) asserts multi-latent attention; DSAttention (megatron/core/
transformer/experimental_attention_variant/dsa.py) asserts cp_comm_type allgather under context parallelism;
AbsorbedMLASelfAttention (absorbed_mla.py) refuses recomputing its up projections under FP8 or FP4; the fused
kernels the emulator models (dsa_cudnn_kernels.py) run only with a fused attention backend and a local head count
FlashMLA takes (_flash_mla_head_padding). Pure functions of the specs, as rules.py's.
"""
from __future__ import annotations

from emulator.errors import ScenarioError
from emulator.scenario.spec import QUANTISED, ModelSpec, ParallelSpec, TrainingSpec
from emulator.scenario.stages import model_chunks
from emulator.scenario.violation import Violation

INDEXER_KEYS = ("dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk")
FLASH_MLA_HEADS = 64  # FlashMLA's sparse kernel runs a multiple of 64 heads; fewer local heads must divide 64


def skips_topk(number: int, offset: int, freq: int) -> bool:
    """Whether the 1-based DSA layer ``number`` reuses an earlier layer's top-k (dsa.py is_dsa_skip_topk_layer: the
    offset counts as at least 1)."""
    return freq > 1 and max(number - max(offset, 1), 0) % freq != 0


def dsa_model_violations(m: ModelSpec) -> list[Violation]:
    """DSA needs multi-latent attention, a causal mask, its three indexer sizes and the indexer's rope to fit its
    head; its keys need the variant; not on a hybrid model."""
    if m.experimental_attention_variant == "dsv4_hybrid":  # its indexer (compressed_attention_rules.py)
        return []
    if m.experimental_attention_variant != "dsa":
        return [Violation(f"model.{name}", f"{name} ({getattr(m, name)}) needs experimental_attention_variant: dsa "
                                           f"or dsv4_hybrid")
                for name in (*INDEXER_KEYS, "dsa_indexer_loss_coeff") if getattr(m, name)]
    out: list[Violation] = []
    if not m.kv_lora_rank:
        out.append(Violation("model.experimental_attention_variant",
                             "dsa needs multi-latent attention (kv_lora_rank > 0): Megatron-Core asserts "
                             "\"Currently only MLA supports sparse attention\""))
    for name in INDEXER_KEYS:
        if getattr(m, name) < 1:
            out.append(Violation(f"model.{name}", f"dsa needs {name} of at least 1"))
    if m.dsa_indexer_head_dim and m.dsa_indexer_head_dim < m.qk_rope_head_dim:
        out.append(Violation("model.dsa_indexer_head_dim",
                             f"the indexer's head ({m.dsa_indexer_head_dim}) must hold the rope dims "
                             f"qk_rope_head_dim ({m.qk_rope_head_dim}) (DSAIndexer splits it)"))
    if not m.causal:
        out.append(Violation("model.causal", "dsa attends causally (AbsorbedMLASelfAttention's causal mask)"))
    if m.hybrid_layer_pattern:
        out.append(Violation("model.experimental_attention_variant", "dsa in a hybrid model is not modelled"))
    return out


def dsa_layout_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """The layout and training keys DSA's fused training path needs (module docstring)."""
    if m.experimental_attention_variant != "dsa":
        return []
    out: list[Violation] = []
    if p.cp > 1 and p.cp_comm_type != "all_gather":
        out.append(Violation("parallel.cp_comm_type", f"dsa under cp > 1 needs cp_comm_type all_gather, got "
                                                      f"{p.cp_comm_type} (DSAttention asserts: \"DSAttention "
                                                      f"context parallelism currently supports "
                                                      f"cp_comm_type=allgather only\")"))
    if t.attention == "unfused":
        out.append(Violation("training.attention", "dsa is modelled as its fused kernels (Megatron-Core's cuDNN "
                                                   "backend: cudnn-frontend's indexer, FlashMLA's sparse "
                                                   "attention), which an unfused attention backend turns off: set "
                                                   "attention: flash"))
    if t.fp8_dot_product_attention:
        out.append(Violation("training.fp8_dot_product_attention", "dsa's core attention is Megatron-Core's own, "
                                                                   "not Transformer Engine's: no FP8 attention"))
    if "mla_up_proj" in (t.recompute_modules or ()) and t.recompute == "selective" and t.precision in QUANTISED:
        out.append(Violation("training.recompute_modules", "mla_up_proj under a quantised precision: "
                                                           "AbsorbedMLASelfAttention asserts \"FP8/FP4 is not "
                                                           "supported for AbsorbedMLA\""))
    return out + _share_violations(m, p) + head_padding_violations(m, p)


def head_padding_violations(m: ModelSpec, p: ParallelSpec) -> list[Violation]:
    """A local head count FlashMLA's sparse kernel takes: a multiple of FLASH_MLA_HEADS, or a divisor it pads (DSA's
    and DeepSeek-V4's cores)."""
    local = m.heads // p.tp if m.heads % p.tp == 0 else 0
    if local and local % FLASH_MLA_HEADS and FLASH_MLA_HEADS % local:
        return [Violation("parallel.tp", f"{local} attention heads a GPU (heads {m.heads} / tp {p.tp}): FlashMLA's "
                                         f"sparse kernel takes a multiple of {FLASH_MLA_HEADS}, or a divisor of it "
                                         f"that it pads")]
    return []


def _share_violations(m: ModelSpec, p: ParallelSpec) -> list[Violation]:
    """Cross-layer top-k sharing stays within a pipeline stage: each model chunk starts on a layer that computes its
    top-k (experimental_attention_variant_module_specs.py, _validate_dsa_index_share_pipeline_split)."""
    f, offset = m.dsa_indexer_topk_freq, m.dsa_indexer_skip_topk_offset
    if f <= 1:
        return []
    try:
        plan = model_chunks(m.layers, p.pp, p.virtual_stages, p.first_chunk_layers, p.last_chunk_layers,
                            p.pipeline_model_parallel_layout, m.mtp_num_layers)
    except ScenarioError:  # the rule book's layout rules report it
        return []
    start = 0
    for n in plan.layers:
        if n and skips_topk(start + 1, offset, f):
            source = start + 1 - (start + 1 - max(offset, 1)) % f
            return [Violation("model.dsa_indexer_topk_freq",
                              f"the pipeline chunk that starts at layer {start + 1} reuses the top-k of layer "
                              f"{source}, on an earlier stage: Megatron-Core's top-k sharing does not cross PP "
                              f"boundaries (give each stage a first layer that computes, or dsa_indexer_topk_freq 1)")]
        start += n
    return []

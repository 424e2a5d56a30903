"""Model sizes: the derived parameter counts every cost needs, from a ModelSpec.

The presets (named shapes and their sources) live in the model catalog,
emulator/scenario/catalog.py. :func:`resolve` fills the implied defaults
(``ffn_hidden`` 0 means 4·hidden, ``kv_heads`` 0 means ``heads``). Parameter counts
are exact counts of the weights the layer ops use (biases and layernorm gains
included for GPT/BERT, none for Llama, as the models do).
"""
from __future__ import annotations

from emulator.scenario.spec import ModelSpec


def resolve(spec: ModelSpec) -> ModelSpec:
    """Fill implied defaults: ffn_hidden 0 → 4·hidden, kv_heads 0 → heads, top_k 0 → 1 for MoE."""
    return spec.resolved()


def has_biases(spec: ModelSpec) -> bool:
    """Linear biases and layernorm shifts: GPT/BERT yes, Llama (SwiGLU) and Nemotron no; ``model.biases``."""
    return bool(resolve(spec).biases)


def has_dropout(spec: ModelSpec) -> bool:
    """Hidden and attention dropout (and their masks): as the biases unless ``model.dropout`` says."""
    return bool(resolve(spec).dropout)


def attention_params(spec: ModelSpec) -> int:
    """QKV (h·(h + 2·kv·d)) and output projection (h²) weights, plus biases."""
    s = resolve(spec)
    d = s.hidden // s.heads
    qkv_out = s.hidden + 2 * s.kv_heads * d
    n = s.hidden * qkv_out + s.hidden * s.hidden
    if has_biases(s):
        n += qkv_out + s.hidden
    return n


def mlp_params(spec: ModelSpec) -> int:
    """One dense MLP: 2·h·f (GeLU, squared ReLU) or 3·h·f (SwiGLU, gated), plus biases f + h if any."""
    s = resolve(spec)
    n = (3 if s.swiglu else 2) * s.hidden * s.ffn_hidden
    return n + (s.ffn_hidden + s.hidden if has_biases(s) else 0)


def norm_params(spec: ModelSpec) -> int:
    """Two norms per layer: layernorm (gain + shift, 2h each) or RMSNorm (gain, h each)."""
    s = resolve(spec)
    return 2 * (2 * s.hidden if has_biases(s) else s.hidden)


def layer_params(spec: ModelSpec) -> int:
    """All weights of one transformer layer (every expert counted, plus the router)."""
    s = resolve(spec)
    experts = max(s.experts, 1)
    router = s.hidden * s.experts if s.experts else 0
    return attention_params(s) + experts * mlp_params(s) + router + norm_params(s)


def embedding_params(spec: ModelSpec) -> int:
    """Word embeddings V·h (+ learned positions s·h for GPT/BERT, none for RoPE models)."""
    s = resolve(spec)
    return s.vocab * s.hidden + (s.seq_len * s.hidden if has_biases(s) else 0)


def head_params(spec: ModelSpec) -> int:
    """The LM head V·h (0 if tied to the embedding) plus the final norm."""
    s = resolve(spec)
    final_norm = 2 * s.hidden if has_biases(s) else s.hidden
    return (0 if s.tied_embeddings else s.vocab * s.hidden) + final_norm


def total_params(spec: ModelSpec) -> int:
    """Parameters of the whole model."""
    s = resolve(spec)
    return s.layers * layer_params(s) + embedding_params(s) + head_params(s)


VOCAB_MULTIPLE = 128  # Megatron-LM --make-vocab-size-divisible-by (default 128), times tp


def padded_vocab(vocab: int, tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of 128·tp so each TP rank gets equal rows."""
    q = VOCAB_MULTIPLE * tp
    return -(-vocab // q) * q

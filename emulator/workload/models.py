"""Model presets: transformer shapes by name, and the derived sizes every cost needs.

A preset is a :class:`~emulator.scenario.ModelSpec` with ``preset`` set to its name.
Any field can be overridden afterwards (``dataclasses.replace``); :func:`resolve`
fills the implied defaults (``ffn_hidden`` 0 means 4·hidden, ``kv_heads`` 0 means
``heads``). Parameter counts are exact counts of the weights the layer ops use
(biases and layernorm gains included for GPT/BERT, none for Llama, as the models do).

Sources:
- GPT-3 family: Brown et al. 2020, Table 2.1 (n_layers, d_model, n_heads), seq 2048,
  vocabulary 50257 (GPT-2 BPE). The 1.3B row lists 24 heads of d_head 128, which does
  not multiply out to d_model 2048; we keep d_head 128 (16 heads). The 13B row lists
  d_model 5140, which is not a multiple of 40 heads; we use 5120 (d_head 128) as
  Megatron does.
- Megatron ladder: Narayanan et al. SC21, Table 1 (heads, hidden, layers); seq 2048,
  vocabulary 51200 (the padded GPT-2 vocabulary used there).
- Llama 2: Touvron et al. 2023 and the released configs (ffn 11008/13824/28672,
  vocabulary 32000, seq 4096; 70B uses GQA with 8 KV heads).
- Llama 3 / 3.1: Dubey et al. 2024, Table 3 (layers, hidden, ffn, heads, 8 KV heads,
  vocabulary 128256, seq 8192).
- Mixtral 8x7B: Jiang et al. 2024 and the released config (32 layers, hidden 4096,
  ffn 14336, 32 heads, 8 KV heads, 8 experts, top-2, vocabulary 32000); trained here at
  seq 4096.
- BERT-large: Devlin et al. 2019 (24 layers, hidden 1024, 16 heads, vocabulary 30522,
  seq 512).
"""
from __future__ import annotations

import difflib
from dataclasses import replace

from ..errors import CatalogError
from ..scenario import ModelSpec


def _gpt3(layers: int, hidden: int, heads: int) -> dict:
    return dict(layers=layers, hidden=hidden, heads=heads, seq_len=2048, vocab=50257, tied_embeddings=True)


def _megatron(heads: int, hidden: int, layers: int) -> dict:
    return dict(layers=layers, hidden=hidden, heads=heads, seq_len=2048, vocab=51200, tied_embeddings=True)


def _llama(layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> dict:
    return dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn,
                vocab=vocab, seq_len=seq, swiglu=True, tied_embeddings=False)


_PRESETS: dict[str, dict] = {
    "gpt3-125m": _gpt3(12, 768, 12),
    "gpt3-350m": _gpt3(24, 1024, 16),
    "gpt3-760m": _gpt3(24, 1536, 16),
    "gpt3-1.3b": _gpt3(24, 2048, 16),
    "gpt3-2.7b": _gpt3(32, 2560, 32),
    "gpt3-6.7b": _gpt3(32, 4096, 32),
    "gpt3-13b": _gpt3(40, 5120, 40),
    "gpt3-175b": _gpt3(96, 12288, 96),
    "megatron-1.7b": _megatron(24, 2304, 24),
    "megatron-3.6b": _megatron(32, 3072, 30),
    "megatron-7.5b": _megatron(32, 4096, 36),
    "megatron-18b": _megatron(48, 6144, 40),
    "megatron-39b": _megatron(64, 8192, 48),
    "megatron-76b": _megatron(80, 10240, 60),
    "megatron-145b": _megatron(96, 12288, 80),
    "megatron-310b": _megatron(128, 16384, 96),
    "megatron-530b": _megatron(128, 20480, 105),
    "megatron-1t": _megatron(160, 25600, 128),
    "llama2-7b": _llama(32, 4096, 32, 32, 11008, 32000, 4096),
    "llama2-13b": _llama(40, 5120, 40, 40, 13824, 32000, 4096),
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 32000, 4096),
    "llama3-8b": _llama(32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": _llama(80, 8192, 64, 8, 28672, 128256, 8192),
    "llama3-405b": _llama(126, 16384, 128, 8, 53248, 128256, 8192),
    "mixtral-8x7b": dict(_llama(32, 4096, 32, 8, 14336, 32000, 4096), experts=8, top_k=2),
    "bert-large": dict(layers=24, hidden=1024, heads=16, seq_len=512, vocab=30522, tied_embeddings=True),
}

# Models that have biases and learned layernorm bias (GPT-2/3, Megatron GPT, BERT): the
# Llama family (RMSNorm, no biases) is marked by swiglu=True.


def model_names() -> list[str]:
    """Every preset name, in catalogue order."""
    return list(_PRESETS)


def model_preset(name: str) -> ModelSpec:
    """The preset called ``name`` (case-insensitive), resolved; CatalogError if unknown."""
    key = name.strip().lower()
    if key not in _PRESETS:
        close = difflib.get_close_matches(key, list(_PRESETS), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise CatalogError(f"unknown model preset {name!r}{hint} (known: {', '.join(_PRESETS)})")
    return resolve(ModelSpec(preset=key, **_PRESETS[key]))


def resolve(spec: ModelSpec) -> ModelSpec:
    """Fill implied defaults: ffn_hidden 0 → 4·hidden, kv_heads 0 → heads, top_k 0 → 1 for MoE."""
    ffn = spec.ffn_hidden or 4 * spec.hidden
    kv = spec.kv_heads or spec.heads
    top_k = spec.top_k or (1 if spec.experts else 0)
    return replace(spec, ffn_hidden=ffn, kv_heads=kv, top_k=top_k)


def check_model(spec: ModelSpec) -> None:
    """Raise CatalogError if the shape is impossible (a clear message, no traceback)."""
    s = resolve(spec)
    for field in ("layers", "hidden", "heads", "seq_len", "vocab"):
        if getattr(s, field) <= 0:
            raise CatalogError(f"model.{field} must be a positive integer, got {getattr(s, field)}")
    if s.hidden % s.heads:
        raise CatalogError(f"model.hidden {s.hidden} is not a multiple of model.heads {s.heads}")
    if s.heads % s.kv_heads:
        raise CatalogError(f"model.heads {s.heads} is not a multiple of model.kv_heads {s.kv_heads}")
    if s.experts and not 1 <= s.top_k <= s.experts:
        raise CatalogError(f"model.top_k {s.top_k} must be between 1 and model.experts {s.experts}")


def has_biases(spec: ModelSpec) -> bool:
    """GPT/BERT-style layers carry biases and layernorm shifts; Llama-style (SwiGLU) do not."""
    return not spec.swiglu


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
    """One dense MLP: 2·h·f (GeLU, plus biases f + h) or 3·h·f (SwiGLU, no biases)."""
    s = resolve(spec)
    if s.swiglu:
        return 3 * s.hidden * s.ffn_hidden
    return 2 * s.hidden * s.ffn_hidden + s.ffn_hidden + s.hidden


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

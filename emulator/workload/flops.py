"""FLOPs of one training iteration: model FLOPs (for MFU) and hardware FLOPs (for HFU).

Counted from the real matrix multiplications of a layer, per sequence of s tokens
(h hidden, a·d = h, kv·d for the K/V heads, f the MLP width, V the vocabulary):

    QKV 2·s·h·(h + 2·kv·d),  QKᵀ and P·V 2·s²·h each,  projection 2·s·h²,
    MLP 2·s·h·f·(2, or 3 with SwiGLU), times top_k for MoE, plus the router 2·s·h·E,
    LM head 2·s·h·V.

Backward costs twice the forward, so model FLOPs = 3·B·(l·layer + head). Hardware
FLOPs add what recomputation reruns: the layer forward (full) or the attention core
QKᵀ, P·V (selective). Elementwise work is not counted (the usual MFU convention), and
attention counts the full s² square (as Megatron-LM's formula does) whatever the mask.

For a plain GPT (f = 4h, kv = a, no MoE) these equal the closed forms of
Narayanan et al. SC21, eq. (3) and its recompute variant:

    72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))   and   96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).
"""
from __future__ import annotations

from emulator.scenario.spec import ModelSpec
from emulator.workload.models import resolve


def attention_core_flops(m: ModelSpec) -> float:
    """QKᵀ and P·V of one layer, one sequence: 4·s²·h."""
    s = resolve(m)
    return 4.0 * s.seq_len * s.seq_len * s.hidden


def layer_forward_flops(m: ModelSpec) -> float:
    """Matmul FLOPs of one layer's forward for one sequence."""
    s = resolve(m)
    sl, h = s.seq_len, s.hidden
    d = h // s.heads
    qkv = 2.0 * sl * h * (h + 2 * s.kv_heads * d)
    proj = 2.0 * sl * h * h
    mlp = 2.0 * sl * h * s.ffn_hidden * (3 if s.swiglu else 2)
    if s.experts:
        mlp = mlp * s.top_k + 2.0 * sl * h * s.experts
    return qkv + attention_core_flops(s) + proj + mlp


def head_forward_flops(m: ModelSpec) -> float:
    """The LM head (logits) for one sequence: 2·s·h·V."""
    s = resolve(m)
    return 2.0 * s.seq_len * s.hidden * s.vocab


def model_flops(m: ModelSpec, global_batch: int) -> float:
    """3·B·(l·layer_forward + head_forward): forward plus a backward of twice its cost."""
    s = resolve(m)
    return 3.0 * global_batch * (s.layers * layer_forward_flops(s) + head_forward_flops(s))


def recompute_flops(m: ModelSpec, global_batch: int, recompute: str, fused_attention: bool = False) -> float:
    """Extra FLOPs recomputation runs: B·l·layer_forward (full), B·l·4s²h (selective, unfused)."""
    s = resolve(m)
    if recompute == "full":
        return global_batch * s.layers * layer_forward_flops(s)
    if recompute == "selective" and not fused_attention:
        return global_batch * s.layers * attention_core_flops(s)
    return 0.0


def hardware_flops(m: ModelSpec, global_batch: int, recompute: str, fused_attention: bool = False) -> float:
    """Model FLOPs plus recomputation (what HFU counts)."""
    return model_flops(m, global_batch) + recompute_flops(m, global_batch, recompute, fused_attention)


def gpt_model_flops_closed_form(B: int, s: int, l: int, h: int, V: int) -> float:
    """72·B·s·l·h²·(1 + s/(6h) + V/(12lh))."""
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def gpt_full_recompute_flops_closed_form(B: int, s: int, l: int, h: int, V: int) -> float:
    """96·B·s·l·h²·(1 + s/(6h) + V/(16lh))."""
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))

"""FLOPs of one training iteration: model FLOPs (for MFU) and hardware FLOPs (for HFU).

Counted from the real matrix multiplications of a layer, per sequence of s tokens
(h hidden, a heads of d = head_dim dims, a·d = h unless ``head_dim`` says otherwise, kv·d for the
K/V heads, f the MLP width, V the vocabulary):

    QKV 2·s·h·(a·d + 2·kv·d),  QKᵀ and P·V 2·s²·a·d each,  projection 2·s·a·d·h,
    MLP 2·s·h·f·(2, or 3 with SwiGLU), times top_k for MoE, plus the router 2·s·h·E,
    LM head 2·s·h·V.

MoE layers count the experts a token is routed to (top_k of width f_e), the shared experts
(one MLP of their summed width) and the router; the ``first_dense_layers`` count their dense
MLP: MFU counts the activated parameters. Token imbalance (``moe_imbalance``) makes the busiest
rank slower, not the model bigger: it adds no model FLOPs. Multi-latent attention counts its
projections (models.py) and a core of 2·s²·a·(d_qk + d_v) (d_qk = d_v = h/a: the 4·s²·h above). DeepSeek Sparse
Attention counts the absorbed einsums in place of kv_up (T·a·d_n·r and T·a·r·d_v: the same FLOPs), the indexer's
three linears and its scores, and a core over each query's top-k keys (:func:`_dsa_core_flops`).

Backward costs twice the forward, so model FLOPs = 3·B·(l·layer + head). Hardware
FLOPs add what recomputation reruns: the layer forward (full) or the attention core
QKᵀ, P·V (selective). Elementwise work is not counted (the usual MFU convention), and
attention counts the full s² square (as Megatron-LM's formula does) whatever the mask.

A hybrid model (workload/hybrid.py) counts each layer's parts: the attention's projections and core, an
MLP's or MoE MLP's terms above, and a Mamba-2 mixer's in_proj, scan and out_proj as Megatron-LM's
``mamba_layer_flops`` (hybrid.mixer_forward_flops).

For a plain GPT (f = 4h, kv = a, no MoE) these equal the closed forms of
Narayanan et al. SC21, eq. (3) and its recompute variant:

    72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))   and   96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).
"""
from __future__ import annotations

from dataclasses import replace

from emulator.scenario.spec import ModelSpec
from emulator.workload import hybrid
from emulator.workload import models as M
from emulator.workload.models import resolve


def attention_core_flops(m: ModelSpec, layer: int | None = None) -> float:
    """QKᵀ and P·V of one layer, one sequence: 4·s²·a·d (4·s²·h when d = h/a; MLA: 2·s²·a·(d_qk + d_v)); a
    dsv4_hybrid layer's at its ratio (``layer`` None: models.attention_ratio's), :func:`_dsv4_core_flops`."""
    s = resolve(m)
    if M.is_dsv4(s):
        return _dsv4_core_flops(s, M.attention_ratio(s) if layer is None else M.compress_ratio(s, layer))
    if M.is_dsa(s):
        return _dsa_core_flops(s, layer is not None and M.dsa_skips(s, layer))
    if M.is_mla(s):
        d_qk, d_v = M.head_dims(s)
        return 2.0 * s.seq_len * s.seq_len * s.heads * (d_qk + d_v)
    return 4.0 * s.seq_len * s.seq_len * (s.heads * M.head_dim(s))


def _dsa_core_flops(s: ModelSpec, skips: bool = False) -> float:
    """DeepSeek Sparse Attention's core for one sequence (workload/sparse_attention.py): the indexer's scores
    2·s²·H·D (the full square, as above; none where the layer reuses an earlier one's top-k, ``skips``) and the
    absorbed core over each query's top-k keys, 2·s·min(k, s)·a·(2·r + d_r)."""
    sl, r = s.seq_len, s.kv_lora_rank
    scores = 0.0 if skips else 2.0 * sl * sl * s.dsa_indexer_n_heads * s.dsa_indexer_head_dim
    return scores + 2.0 * sl * min(s.dsa_indexer_topk, sl) * s.heads * (2 * r + s.qk_rope_head_dim)


def _dsv4_core_flops(s: ModelSpec, ratio: int) -> float:
    """A dsv4_hybrid layer's attention but its linear layers, for one sequence, as Megatron-Bridge counts it
    (067f987df training/utils/flop_utils.py, experimental_attention_variant "dsv4_hybrid"; a heads of D dims, w the
    window): the window 2·s·a·w·D·2 at every ratio; at 128 the compressor 2·s·h·D·2 and the compressed keys
    2·s²·a·D/128; at 4 the compressor 2·s·h·2D·2, the indexer's linears 2·s·(h·2D_I·2 + r_q·H·D_I + h·H), its
    scores 2·s²·H·D_I/4 and a core over k̄ = k·(1 − 4k/(2s)) more keys (k = min(dsa_indexer_topk, s/4))."""
    sl, h, a, D = s.seq_len, s.hidden, s.heads, M.head_dim(s)
    per_token = a * s.csa_window_size * D * 2.0
    square = 0.0
    if ratio == 128:
        per_token += h * D * 2
        square = a * D / 128
    elif ratio == 4:
        H, DI = s.dsa_indexer_n_heads, s.dsa_indexer_head_dim
        k = min(s.dsa_indexer_topk, sl // 4)
        per_token += a * k * (1 - k * 4 / (2 * sl)) * D * 2 + h * 2 * D * 2
        per_token += h * 2 * DI * 2 + s.q_lora_rank * H * DI + h * H
        square = H * DI / 4
    return 2.0 * sl * per_token + 2.0 * sl * sl * square


def _mlp_flops(s: ModelSpec, width: int) -> float:
    return 2.0 * s.seq_len * s.hidden * width * (3 if s.swiglu else 2)


def _routed_flops(s: ModelSpec) -> float:
    """The top_k routed experts of one sequence: in the latent width with ``moe_latent_size``, plus its two
    projections 2·s·h·latent each (Megatron-LM's moe_layer_flops)."""
    n = s.moe_latent_size
    if not n:
        return _mlp_flops(s, M.expert_ffn(s)) * s.top_k
    return _mlp_flops(replace(s, hidden=n), M.expert_ffn(s)) * s.top_k + 2 * 2.0 * s.seq_len * s.hidden * n


def _projection_flops(s: ModelSpec, layer: int | None = None) -> float:
    """The attention's linear layers for one sequence: QKV and output, or MLA's five (with DSA's indexer but where
    layer ``layer`` reuses an earlier one's top-k)."""
    sl, h = s.seq_len, s.hidden
    if M.is_dsv4(s):  # q_a and q_b with the q norm's r_q, kv_proj with its norm's D, o_a and o_b (flop_utils.py)
        a, D, rq, r_o = s.heads, M.head_dim(s), s.q_lora_rank, s.o_lora_rank
        return 2.0 * sl * (rq * (h + a * D + 1) + h * D + D + a * D * r_o + s.o_groups * r_o * h)
    if M.is_mla(s):
        d_qk, d_v = M.head_dims(s)
        a, rq, rkv, dr = s.heads, s.q_lora_rank, s.kv_lora_rank, s.qk_rope_head_dim
        q = h * rq + rq * a * d_qk if rq else h * a * d_qk
        kv = h * (rkv + dr) + rkv * a * (d_qk - dr + d_v)  # with DSA the absorbed einsums' (the same terms)
        indexer = 0 if layer is not None and M.dsa_skips(s, layer) else M.indexer_linear(s)
        return 2.0 * sl * (q + kv + a * d_v * h + indexer)
    d = M.head_dim(s)
    gate = s.heads * d if s.attention_output_gate else 0  # attention_output_gate: the QKV GEMM's gate columns
    return 2.0 * sl * h * (s.heads * d + 2 * s.kv_heads * d + gate) + 2.0 * sl * h * (s.heads * d)


def layer_forward_flops(m: ModelSpec, layer: int | None = None) -> float:
    """Matmul FLOPs of one layer's forward for one sequence (``layer``: a dense leading layer of an MoE
    model when it is one of its ``first_dense_layers``; None: an MoE layer if the model has experts)."""
    s = resolve(m)
    if hybrid.is_hybrid(s) and layer is not None:
        return sum(part_forward_flops(s, part) for part in M.layer_parts(s, layer))
    moe = bool(s.experts) if layer is None else M.is_moe_layer(s, layer)
    attn = _projection_flops(s, layer) + attention_core_flops(s, layer)
    return attn + (_moe_mlp_flops(s) if moe else _mlp_flops(s, s.ffn_hidden))


def _moe_mlp_flops(s: ModelSpec) -> float:
    """An MoE MLP of one sequence: the routed experts, the router 2·s·h·E and the shared experts."""
    mlp = _routed_flops(s) + 2.0 * s.seq_len * s.hidden * s.experts
    if s.shared_experts:
        mlp += _mlp_flops(s, M.shared_ffn(s))
    return mlp


def part_forward_flops(m: ModelSpec, part: str) -> float:
    """Matmul FLOPs of one part of a hybrid layer (workload/hybrid.py) for one sequence: the attention, a dense
    MLP, an MoE MLP (routed, shared, router) or a Mamba-2 mixer (hybrid.mixer_forward_flops)."""
    s = resolve(m)
    if part == hybrid.MAMBA:
        return hybrid.mixer_forward_flops(s)
    if part == hybrid.GDN:
        return hybrid.delta_forward_flops(s)
    if part == hybrid.ATTENTION:
        return _projection_flops(s) + attention_core_flops(s)
    return _moe_mlp_flops(s) if part == hybrid.MOE else _mlp_flops(s, s.ffn_hidden)


def layers_forward_flops(m: ModelSpec) -> float:
    """All layers' forward for one sequence: l·layer_forward, the dense leading layers counted as such (a hybrid
    model: each layer's parts)."""
    s = resolve(m)
    if hybrid.is_hybrid(s) or M.layers_differ(s):
        return sum(layer_forward_flops(s, i) for i in range(s.layers))
    dense = min(s.first_dense_layers, s.layers) if s.experts else 0
    if not dense:
        return s.layers * layer_forward_flops(s)
    return dense * layer_forward_flops(s, 0) + (s.layers - dense) * layer_forward_flops(s)


def head_forward_flops(m: ModelSpec) -> float:
    """The LM head (logits) for one sequence: 2·s·h·V."""
    s = resolve(m)
    return 2.0 * s.seq_len * s.hidden * s.vocab


def mtp_forward_flops(m: ModelSpec) -> float:
    """The multi-token prediction modules' forward for one sequence, as Megatron-LM counts them
    (training.py ``num_floating_point_operations``): per module one layer of the last decoder layer's
    kind, its norms and eh_proj 2·s·(3h + 2h²), and one more logits pass 2·s·h·V."""
    s = resolve(m)
    if not s.mtp_num_layers:
        return 0.0
    one = layer_forward_flops(s, _mtp_index(s)) + 2.0 * s.seq_len * (3 * s.hidden + 2 * s.hidden * s.hidden)
    return s.mtp_num_layers * (one + head_forward_flops(s))


def _mtp_index(s: ModelSpec) -> int:
    """The layer index whose kind an MTP module's layer is: the decoder's last, or a hybrid model's MTP depth's."""
    return s.layers + 1 if hybrid.is_hybrid(s) or M.layers_differ(s) else s.layers - 1


def model_flops(m: ModelSpec, global_batch: int) -> float:
    """3·B·(layers_forward + head_forward + mtp_forward): forward plus a backward of twice its cost."""
    s = resolve(m)
    return 3.0 * global_batch * (layers_forward_flops(s) + head_forward_flops(s) + mtp_forward_flops(s))


def module_recompute_flops(m: ModelSpec, modules: tuple[str, ...], fused_attention: bool = False) -> float:
    """Forward FLOPs one sequence reruns under ``recompute_modules`` (workload/recompute.py), over the
    layers and the MTP layers: core_attn the attention core (fused too: Megatron reruns the kernel),
    mla_up_proj the query and key/value up projections, mlp a dense layer's MLP, moe an MoE layer's
    experts, shared experts and router (and a latent MoE's projections), shared_experts the shared experts;
    layernorm and moe_act are element-wise (not counted). A hybrid model's layers take what their parts have."""
    s = resolve(m)
    layers = list(range(s.layers)) + [_mtp_index(s)] * s.mtp_num_layers
    total = 0.0
    for i in layers:
        moe = M.is_moe_layer(s, i) if s.experts else False
        if "core_attn" in modules and hybrid.ATTENTION in M.layer_parts(s, i):
            total += attention_core_flops(s, i)
        if "mla_up_proj" in modules and M.is_dsv4(s):  # q_b (layer.py's DeepSeek-V4 attention)
            total += 2.0 * s.seq_len * s.q_lora_rank * s.heads * M.head_dim(s)
        if "mla_up_proj" in modules and M.is_mla(s):
            d_qk, d_v = M.head_dims(s)
            q = s.q_lora_rank * s.heads * d_qk if s.q_lora_rank else s.hidden * s.heads * d_qk
            total += 2.0 * s.seq_len * (q + s.kv_lora_rank * s.heads * (d_qk - s.qk_rope_head_dim + d_v))
        if "mlp" in modules and hybrid.MLP in M.layer_parts(s, i):
            total += _mlp_flops(s, s.ffn_hidden)
        if moe and "moe" in modules:
            total += part_forward_flops(s, hybrid.MOE)
        elif moe and "shared_experts" in modules and s.shared_experts:
            total += _mlp_flops(s, M.shared_ffn(s))
    return total


def recompute_flops(m: ModelSpec, global_batch: int, recompute: str, fused_attention: bool = False,
                    modules: tuple[str, ...] | None = None) -> float:
    """Extra FLOPs recomputation runs: B·l·layer_forward (full, the MTP layers' too), B·l·4s²h (selective,
    unfused), or B·module_recompute_flops (selective with ``recompute_modules``)."""
    s = resolve(m)
    if recompute == "full":
        return global_batch * (layers_forward_flops(s) + s.mtp_num_layers * layer_forward_flops(s, _mtp_index(s)))
    if recompute == "selective" and modules is not None:
        return global_batch * module_recompute_flops(s, modules, fused_attention)
    if recompute == "selective" and not fused_attention:
        return global_batch * sum(attention_core_flops(s, i) for i in range(s.layers)
                                  if hybrid.ATTENTION in M.layer_parts(s, i))
    return 0.0


def hardware_flops(m: ModelSpec, global_batch: int, recompute: str, fused_attention: bool = False,
                   modules: tuple[str, ...] | None = None) -> float:
    """Model FLOPs plus recomputation (what HFU counts)."""
    return model_flops(m, global_batch) + recompute_flops(m, global_batch, recompute, fused_attention, modules)


def gpt_model_flops_closed_form(B: int, s: int, l: int, h: int, V: int) -> float:
    """72·B·s·l·h²·(1 + s/(6h) + V/(12lh))."""
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def gpt_full_recompute_flops_closed_form(B: int, s: int, l: int, h: int, V: int) -> float:
    """96·B·s·l·h²·(1 + s/(6h) + V/(16lh))."""
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))

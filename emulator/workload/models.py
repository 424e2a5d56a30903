"""Model sizes: the derived parameter counts every cost needs, from a ModelSpec.

The presets (named shapes and their sources) live in the model catalog,
emulator/scenario/catalog.py. :func:`resolve` fills the implied defaults
(``ffn_hidden`` 0 means 4·hidden, ``kv_heads`` 0 means ``heads``). Parameter counts
are exact counts of the weights the layer ops use (biases and layernorm gains
included for GPT/BERT, none for Llama, as the models do).

Mixture-of-Experts (DeepSeek-MoE, arXiv 2401.06066; Megatron-Core's MoE layer): a layer
has ``experts`` routed experts of width f_e (``expert_ffn_hidden``, else ``ffn_hidden``),
a router h·E, and ``shared_experts`` always-on experts of width f_s each, which run as one
MLP of width n_s·f_s (as DeepSeek's reference code builds them:
``MLP(dim, n_shared_experts * moe_inter_dim)``, and as Megatron-Core's
``moe_shared_expert_intermediate_size``, "shared expert total ffn hidden size", whose
``moe_ffn_hidden_size`` also defaults to ``ffn_hidden_size``: transformer_config.py @
d98e8a64dd). The first ``first_dense_layers`` layers keep a dense MLP of ``ffn_hidden``.
A token activates the attention, top_k routed experts, the shared ones and the router:
:func:`activated_params`.

Attention heads have d = ``head_dim`` dims each (Megatron-Core's ``kv_channels``, default h/a:
transformer_config.py @ d98e8a64dd); Qwen3 decouples them (hidden 4096, 64 heads of 128), so the
QKV projection is h → (a + 2·kv)·d and the output projection a·d → h.

Multi-latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1; the reference code
in deepseek-ai/DeepSeek-V3 @ 9b4e978, inference/model.py, class MLA), with r_q, r_kv the
query and key/value ranks, d_n, d_r, d_v the per-head no-rope, rope and value dims:

    q:   h·r_q + r_q (norm) + r_q·a·(d_n + d_r)     (r_q = 0: h·a·(d_n + d_r))
    kv:  h·(r_kv + d_r) + r_kv (norm) + r_kv·a·(d_n + d_v)
    out: a·d_v·h
"""
from __future__ import annotations

from dataclasses import replace

from emulator.scenario.sparse_attention_rules import skips_topk
from emulator.scenario.spec import ModelSpec
from emulator.workload import hybrid, routing


def resolve(spec: ModelSpec) -> ModelSpec:
    """Fill implied defaults: ffn_hidden 0 → 4·hidden, kv_heads 0 → heads, top_k 0 → 1 for MoE."""
    return spec.resolved()


def has_biases(spec: ModelSpec) -> bool:
    """Linear biases and layernorm shifts: GPT/BERT yes, Llama (SwiGLU) and Nemotron no; ``model.biases``."""
    return bool(resolve(spec).biases)


def position_embedding(spec: ModelSpec) -> str:
    """learned_absolute | rope | none: ``model.position_embedding_type``, else learned with biases (GPT, BERT) and
    rotary without (Llama)."""
    return spec.position_embedding_type or ("learned_absolute" if has_biases(spec) else "rope")


def learned_positions(spec: ModelSpec) -> bool:
    """A learned position embedding of s·h (GPT, BERT)."""
    return position_embedding(spec) == "learned_absolute"


def has_norm_shift(spec: ModelSpec) -> bool:
    """LayerNorm (gain and shift) rather than RMSNorm (gain): ``model.norm``, else as the biases."""
    return resolve(spec).norm == "layernorm"


def has_dropout(spec: ModelSpec) -> bool:
    """Hidden and attention dropout (and their masks): as the biases unless ``model.dropout`` says."""
    return bool(resolve(spec).dropout)


def is_mla(spec: ModelSpec) -> bool:
    """Multi-latent attention: a compressed key/value rank is given."""
    return spec.kv_lora_rank > 0


def is_dsa(spec: ModelSpec) -> bool:
    """DeepSeek Sparse Attention (``experimental_attention_variant: dsa``; workload/sparse_attention.py)."""
    return spec.experimental_attention_variant == "dsa"


def is_dsv4(spec: ModelSpec) -> bool:
    """DeepSeek-V4's hybrid attention (``experimental_attention_variant: dsv4_hybrid``; workload/
    compressed_attention.py)."""
    return spec.experimental_attention_variant == "dsv4_hybrid"


def compress_ratio(spec: ModelSpec, layer: int) -> int:
    """The compression ratio of layer ``layer`` (0, 4 or 128; the global index: an MTP module's is layers + 1 + d,
    whose ratio is csa_compress_ratios[layers + d]); 0 without dsv4_hybrid. A list shorter than the layers repeats
    its last entry."""
    ratios = spec.csa_compress_ratios
    if not is_dsv4(spec) or not ratios:
        return 0
    i = layer if layer < spec.layers else layer - 1
    return ratios[min(i, len(ratios) - 1)]


def dsa_skips(spec: ModelSpec, layer: int) -> bool:
    """Whether DSA layer ``layer`` (the global index; an MTP module's is layers + 1 + d) reuses an earlier layer's
    top-k and has no indexer (Megatron-Core dsa.py @ d98e8a64dd, is_dsa_skip_topk_layer, with 1-based layer numbers
    and the offset at least 1; an MTP module's layers are numbered from 1 anew); False without top-k sharing."""
    if not is_dsa(spec):
        return False
    number = layer + 1 if layer < spec.layers else layer - spec.layers  # MTP module d: its layer number d + 1
    return skips_topk(number, spec.dsa_indexer_skip_topk_offset, spec.dsa_indexer_topk_freq)


def layers_differ(spec: ModelSpec) -> bool:
    """Whether a model's layers differ in their attention (dsv4_hybrid's ratios, DSA's top-k sharing): the plan, the
    parameters and the FLOPs then go layer by layer."""
    return is_dsv4(spec) or (is_dsa(spec) and spec.dsa_indexer_topk_freq > 1)


def attention_ratio(spec: ModelSpec) -> int:
    """The ratio whose layer has the most attention weights, the one a per-layer size stands for where the layer is
    not named: 4 (the compressor and the indexer) if any layer has it, else the largest."""
    ratios = set(spec.csa_compress_ratios[:spec.layers])
    return 4 if 4 in ratios else max(ratios, default=0)


def dsv4_attention_params(spec: ModelSpec, ratio: int) -> int:
    """A dsv4_hybrid layer's attention weights at compression ratio ``ratio`` (HF transformers 5.25
    modeling_deepseek_v4.py, DeepseekV4Attention and its compressors; a heads of D = head_dim dims, g = o_groups):
    q_a h·r_q with its norm r_q, q_b r_q·a·D (its norm has no weight), kv_proj h·D with its norm D, the grouped
    o_a a·D·o_lora_rank and o_b g·o_lora_rank·h, the sinks a; a compressor at ratio m of width w (2D at 4: its
    windows overlap, D at 128): kv_proj and gate_proj h·w each, a position bias m·w and a norm D; at ratio 4 the
    indexer: its own compressor (w = 2·D_I, norm D_I), q_b r_q·H·D_I and weights_proj h·H."""
    s = resolve(spec)
    h, a, D, rq = s.hidden, s.heads, head_dim(s), s.q_lora_rank
    n = h * rq + rq + rq * a * D + h * D + D + a * D * s.o_lora_rank + s.o_groups * s.o_lora_rank * h + a
    if ratio:
        w = 2 * D if ratio == 4 else D
        n += 2 * h * w + ratio * w + D
    if ratio == 4:
        H, DI = s.dsa_indexer_n_heads, s.dsa_indexer_head_dim
        n += 2 * h * 2 * DI + 4 * 2 * DI + DI + rq * H * DI + h * H
    return n


def mhc_params(spec: ModelSpec) -> int:
    """One layer's two hyper-connection modules (Megatron-Core hyper_connection.py @ d98e8a64dd,
    HyperConnectionModule: mapping_proj n·h → n² + 2n without a bias, its bias n² + 2n and three alphas); 0 without
    enable_mhc_connections."""
    if not spec.enable_mhc_connections:
        return 0
    n = spec.mhc_num_residual_streams
    return 2 * ((n * spec.hidden + 1) * (n * n + 2 * n) + 3)


def indexer_params(spec: ModelSpec) -> int:
    """A DSA layer's lightning indexer (Megatron-Core dsa.py @ d98e8a64dd, DSAIndexer): linear_wq_b r_q → H·D,
    linear_wk h → D, the LayerNorm k_norm (weight and bias, 2·D) and linear_weights_proj h → H; replicated over
    TP ("duplicated"); 0 without DSA. Without a query rank linear_wq_b takes h."""
    return indexer_linear(spec) + (2 * spec.dsa_indexer_head_dim if is_dsa(spec) else 0)


def indexer_linear(spec: ModelSpec) -> int:
    """The indexer's GEMM weights (:func:`indexer_params` less k_norm): (r_q or h)·H·D + h·D + h·H; 0 without DSA."""
    if not is_dsa(spec):
        return 0
    H, D, h = spec.dsa_indexer_n_heads, spec.dsa_indexer_head_dim, spec.hidden
    return (spec.q_lora_rank or h) * H * D + h * D + h * H


def replicated_attention_params(spec: ModelSpec) -> int:
    """The attention weights every TP rank holds whole: multi-latent attention's down projections and latent norms
    (Megatron-Core multi_latent_attention.py @ d98e8a64dd: linear_q_down_proj and linear_kv_down_proj are
    "duplicated", their q_layernorm and kv_layernorm over the whole latent) and DSA's indexer; dsv4_hybrid's all but
    q_b, the grouped output projection and the sinks (split by heads), as MLA's; 0 otherwise."""
    s = resolve(spec)
    if is_dsv4(s):  # q_a with its norm, kv_proj with its norm, the compressor and the indexer (an ASSUMPTION)
        D = head_dim(s)
        sharded = s.q_lora_rank * s.heads * D + s.heads * D * s.o_lora_rank + s.o_groups * s.o_lora_rank * s.hidden
        return attention_params(s) - sharded - s.heads
    if not is_mla(s):
        return 0
    q = s.hidden * s.q_lora_rank + s.q_lora_rank if s.q_lora_rank else 0
    return q + s.hidden * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank + indexer_params(s)


def head_dim(spec: ModelSpec) -> int:
    """Dims per attention head: ``head_dim`` (Megatron's kv_channels), else h/a."""
    return spec.head_dim or spec.hidden // spec.heads


def head_dims(spec: ModelSpec) -> tuple[int, int]:
    """(query/key, value) dims per head: d = head_dim each, or MLA's (d_n + d_r, d_v) (d_n, d_v default d)."""
    s = resolve(spec)
    d = head_dim(s)
    if not is_mla(s):
        return d, d
    return (s.qk_nope_head_dim or d) + s.qk_rope_head_dim, s.v_head_dim or d


def attention_params(spec: ModelSpec) -> int:
    """QKV (h·(a·d + 2·kv·d)) and output projection (a·d·h) weights, plus biases; d = head_dim (h/a by
    default, so h·(h + 2·kv·d) and h²); MLA: the module docstring."""
    s = resolve(spec)
    if is_mla(s):
        return _mla_params(s)
    if is_dsv4(s):
        return dsv4_attention_params(s, attention_ratio(s))
    d = head_dim(s)
    qkv_out = s.heads * d + 2 * s.kv_heads * d + (s.heads * d if s.attention_output_gate else 0)
    n = s.hidden * qkv_out + s.heads * d * s.hidden
    if has_biases(s):
        n += qkv_out + s.hidden
    if s.softmax_type == "learnable":  # attention sinks: one learned logit per query head
        n += s.heads
    return n


def window_share(spec: ModelSpec) -> float:
    """The fraction of layers that attend through ``sliding_window``: all of them, or, with
    ``window_attn_skip_freq`` N, those but every N-th (layers N, 2N, ... attend fully; GPT-OSS: half)."""
    s = resolve(spec)
    if not s.sliding_window or not s.layers:
        return 0.0
    n = s.window_attn_skip_freq
    return 1.0 if n <= 0 else (s.layers - s.layers // n) / s.layers


def _mla_params(s: ModelSpec) -> int:
    """Multi-latent attention weights (no biases, as DeepSeek's): projections and the two latent norms."""
    h, a = s.hidden, s.heads
    d_qk, d_v = head_dims(s)
    d_n = d_qk - s.qk_rope_head_dim
    q = h * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * a * d_qk if s.q_lora_rank else h * a * d_qk
    kv = h * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank + s.kv_lora_rank * a * (d_n + d_v)
    return q + kv + a * d_v * h + indexer_params(s)


def mlp_of_width(s: ModelSpec, width: int) -> int:
    """An MLP of width ``width``: 2·h·width (3·h·width gated), plus biases width + h if any."""
    n = (3 if s.swiglu else 2) * s.hidden * width
    return n + (width + s.hidden if has_biases(s) else 0)


def mlp_params(spec: ModelSpec) -> int:
    """One dense MLP: 2·h·f (GeLU, squared ReLU) or 3·h·f (SwiGLU, gated), plus biases f + h if any."""
    s = resolve(spec)
    return mlp_of_width(s, s.ffn_hidden)


def expert_ffn(spec: ModelSpec) -> int:
    """Width of one routed expert: ``expert_ffn_hidden``, else ``ffn_hidden``."""
    return spec.expert_ffn_hidden or resolve(spec).ffn_hidden


def shared_ffn(spec: ModelSpec) -> int:
    """Summed width of the shared experts (they run as one MLP): n_s · (shared width or expert width)."""
    return spec.shared_experts * (spec.shared_expert_ffn_hidden or expert_ffn(spec))


def expert_params(spec: ModelSpec) -> int:
    """One routed expert's MLP; with a latent size (``moe_latent_size``) its input and output are that wide."""
    s = resolve(spec)
    if s.moe_latent_size:
        return mlp_of_width(replace(s, hidden=s.moe_latent_size), expert_ffn(s))
    return mlp_of_width(s, expert_ffn(s))


def expert_linear(spec: ModelSpec) -> int:
    """One routed expert's GEMM weights: (2, or 3 gated)·width·f_e, width the latent size or h."""
    s = resolve(spec)
    return (3 if s.swiglu else 2) * (s.moe_latent_size or s.hidden) * expert_ffn(s)


def latent_params(spec: ModelSpec) -> int:
    """A latent MoE layer's two projections, h → latent and back (fc1_latent_proj, fc2_latent_proj), with their
    biases if any; 0 without ``moe_latent_size``."""
    s = resolve(spec)
    n = s.moe_latent_size
    return 2 * s.hidden * n + ((n + s.hidden) if has_biases(s) else 0) if n else 0


def moe_rank_load(spec: ModelSpec, ep: int, tokens: int = 0, layer: int | None = None, step: int = 0) -> float:
    """Routed tokens of the busiest expert-parallel rank over the mean rank's, in MoE layer ``layer`` (the
    global index; MTP module d: layers + 1 + d) at step ``step``; ``layer`` None: the busiest MoE layer's
    (memory's peak).

    From ``moe_expert_load`` (measured tokens per expert; one row for every layer or one per MoE layer,
    an MTP module taking the last): EP rank r holds experts r·E/ep … (r+1)·E/ep − 1
    (Megatron-Core moe_layer.py @ d98e8a64dd, lines 188-194: ``local_expert_indices_offset = ep_rank *
    num_local_experts``), so its load is their sum, and the busiest is max over r of that sum over
    total/ep. From ``moe_load_seed``: the same, of the layer's drawn copies (routing.drawn_load) of
    ``tokens`` tokens per EP rank. Under ``moe_router_force_load_balancing``, the expected maximum of
    binomial loads over ``tokens`` tokens per EP rank (workload/routing.py). Else from ``moe_imbalance`` f:
    the busiest expert and local − 1 experts of mean load, (f + local − 1)/local. 1 without EP (every rank
    holds every expert: the total is the mean). A capacity factor then caps it, or sets it with padding
    (routing.capped_load)."""
    if layer is None and loads_vary(spec):
        return max(moe_rank_load(spec, ep, tokens, i, step) for i in moe_layer_indices(spec))
    return routing.capped_load(_routed_load(spec, ep, tokens, layer, step), spec)


def loads_vary(spec: ModelSpec) -> bool:
    """Whether the MoE layers have loads of their own: drawn (moe_load_seed) or one row each."""
    return spec.moe_load_seed is not None or len(spec.moe_expert_load) > 1


def moe_layer_indices(spec: ModelSpec) -> list[int]:
    """The global indices of the MoE layers: the decoder's past first_dense_layers, then the MTP modules'
    (layers + 1 + d, after the head's index layers: workload/plan.py's units)."""
    if hybrid.is_hybrid(spec):
        mtp = [spec.layers + 1 + d for d in range(spec.mtp_num_layers)] if hybrid.MOE in hybrid.mtp_pattern(spec) \
            else []
        return [i for i in range(spec.layers) if is_moe_layer(spec, i)] + mtp
    return [*range(spec.first_dense_layers, spec.layers), *(spec.layers + 1 + d for d in range(spec.mtp_num_layers))]


def expert_loads(spec: ModelSpec, ep: int, tokens: int, layer: int | None, step: int) -> tuple[float, ...]:
    """Layer ``layer``'s copies (or shares) per expert where a row or a draw gives them; () otherwise."""
    if spec.moe_load_seed is not None:
        at = spec.layers - 1 if layer is None else layer
        copies = tokens * ep * (spec.top_k or 1)
        return routing.drawn_load(spec.moe_load_seed, step, at, spec.experts, copies, spec.moe_load_concentration)
    rows = spec.moe_expert_load
    if not rows:
        return ()
    if len(rows) == 1:
        return rows[0]
    at = spec.layers - 1 if layer is None else layer
    # the MoE layers before it: a hybrid model's E layers, else the layers past first_dense_layers
    j = hybrid.main_pattern(spec)[:at].count(hybrid.MOE) if hybrid.is_hybrid(spec) else at - spec.first_dense_layers
    return rows[min(max(j, 0), len(rows) - 1)]


def _routed_load(spec: ModelSpec, ep: int, tokens: int, layer: int | None, step: int) -> float:
    if ep <= 1:
        return 1.0
    local = max(1, spec.experts // ep)
    load = expert_loads(spec, ep, tokens, layer, step)
    if load:
        per_rank = [sum(load[r * local:(r + 1) * local]) for r in range(ep)]
        return max(per_rank) / (sum(load) / ep)
    if spec.moe_router_force_load_balancing:
        return routing.force_balance_load(tokens * ep, spec.top_k or 1, spec.experts, ep)
    if spec.moe_imbalance == 1.0:
        return 1.0
    return (spec.moe_imbalance + local - 1) / local


def dsv4_linear(spec: ModelSpec, ratio: int) -> int:
    """A dsv4_hybrid layer's GEMM weights at compression ratio ``ratio`` that fp8 stores and gathers (the 2-D terms
    of :func:`dsv4_attention_params` but the grouped o_a, a BF16 batched matmul: steps.py ``BF16_GEMMS``, and the
    compressors' position biases, which are added, not multiplied): q_a h·r_q, q_b r_q·a·D, kv_proj h·D, o_b
    g·o_lora_rank·h; a compressor's kv_proj and gate_proj 2·h·w; at ratio 4 the indexer's compressor 2·h·2·D_I, q_b
    r_q·H·D_I and weights_proj h·H."""
    s = resolve(spec)
    h, a, D, rq = s.hidden, s.heads, head_dim(s), s.q_lora_rank
    n = h * rq + rq * a * D + h * D + s.o_groups * s.o_lora_rank * h
    if ratio:
        n += 2 * h * (2 * D if ratio == 4 else D)
    if ratio == 4:
        H, DI = s.dsa_indexer_n_heads, s.dsa_indexer_head_dim
        n += 2 * h * 2 * DI + rq * H * DI + h * H
    return n


def linear_weights(r: ModelSpec, layer: int | None = None) -> tuple[int, int]:
    """(attention, one MLP of ``ffn_hidden``'s shape per unit width) GEMM weights of one layer of resolved
    ``r``, without biases or norms: the weights Transformer Engine's Linear modules hold, which fp8 stores
    or copies. dsv4_hybrid: layer ``layer``'s (its compression ratio), or, not named, the ratio with the most
    (:func:`attention_ratio`); DSA: without the indexer where layer ``layer`` reuses an earlier top-k."""
    h = r.hidden
    if is_dsv4(r):
        attn = dsv4_linear(r, attention_ratio(r) if layer is None else compress_ratio(r, layer))
    elif is_mla(r):
        # less the two latent norms and the indexer's k_norm; a named DSA layer that reuses the top-k has no indexer
        attn = attention_params(r) - r.q_lora_rank - r.kv_lora_rank - (indexer_params(r) - indexer_linear(r))
        if layer is not None and dsa_skips(r, layer):
            attn -= indexer_linear(r)
    else:
        d = head_dim(r)
        attn = h * (r.heads * d + 2 * r.kv_heads * d + (r.heads * d if r.attention_output_gate else 0)) \
            + r.heads * d * h
    return attn, (3 if r.swiglu else 2) * h


def is_moe_layer(spec: ModelSpec, layer: int) -> bool:
    """Layer ``layer`` (0-based) has experts: an MoE model past its ``first_dense_layers``, or a hybrid model's
    E layer."""
    if hybrid.is_hybrid(spec):
        return hybrid.MOE in layer_parts(spec, layer)
    return bool(spec.experts) and layer >= spec.first_dense_layers


def layer_kind(spec: ModelSpec, layer: int) -> tuple[int, bool, bool]:
    """Layer ``layer``'s kind, alike wherever layers of one kind are: its attention (its compression ratio, whether
    it reuses a DSA top-k) and whether it is a dense leading layer of an MoE model."""
    return compress_ratio(spec, layer), dsa_skips(spec, layer), bool(spec.experts) and not is_moe_layer(spec, layer)


def layer_parts(spec: ModelSpec, layer: int) -> str:
    """What layer ``layer`` runs (hybrid.py's symbols): a hybrid model's pattern symbol, else a transformer
    layer's attention and its MLP, "*E" where it has experts and "*-" where not. An index past the decoder
    (an MTP module's) takes the last layer's."""
    if hybrid.is_hybrid(spec):  # past the decoder: an MTP module's (index layers + 1 + d), or the last layer's
        main = hybrid.main_pattern(spec)
        return main[layer] if layer < len(main) else hybrid.mtp_pattern(spec) or main[-1]
    return hybrid.MOE_LAYER if is_moe_layer(spec, layer) else hybrid.DENSE_LAYER


def part_params(spec: ModelSpec, part: str) -> int:
    """The weights every rank of an expert-parallel group holds of one layer's part (hybrid.py's symbols) with
    its pre-norm: the attention, a dense MLP, the router and shared experts of an MoE MLP, a Mamba-2 mixer or a gated
    delta net."""
    s = resolve(spec)
    norm = norm_params(s) // 2
    if part == hybrid.ATTENTION:
        return attention_params(s) + norm
    if part == hybrid.MLP:
        return mlp_params(s) + norm
    if part == hybrid.MOE:
        return s.hidden * s.experts + (mlp_of_width(s, shared_ffn(s)) if s.shared_experts else 0) + norm \
            + latent_params(s)
    return (hybrid.delta_params(s) if part == hybrid.GDN else hybrid.mixer_params(s)) + norm


def shared_layer_params(spec: ModelSpec, layer: int) -> int:
    """:func:`dense_layer_params` of layer ``layer``: its parts' (:func:`part_params`) in a hybrid model."""
    if hybrid.is_hybrid(spec):
        return sum(part_params(spec, p) for p in layer_parts(spec, layer))
    return dense_layer_params(spec, is_moe_layer(spec, layer)) + attention_delta(spec, layer)


def part_linear(spec: ModelSpec, part: str, layer: int | None = None) -> int:
    """GEMM weights of one layer's part that every expert-parallel rank holds (linear_weights' split by part;
    ``layer`` names the layer where the layers' attention differs)."""
    r = resolve(spec)
    attn, per_width = linear_weights(r, layer)
    if part == hybrid.ATTENTION:
        return attn
    if part == hybrid.MLP:
        return per_width * r.ffn_hidden
    if part == hybrid.MOE:
        return (per_width * shared_ffn(r) if r.shared_experts else 0) + 2 * r.hidden * r.moe_latent_size
    return hybrid.delta_linear(r) if part == hybrid.GDN else hybrid.mixer_linear(r)


def dense_layer_params(spec: ModelSpec, moe: bool) -> int:
    """The weights of a layer that every rank of an expert-parallel group holds: attention, norms and the
    dense MLP (``moe`` False), or the router and the shared experts (``moe`` True)."""
    s = resolve(spec)
    if not moe:
        return attention_params(s) + mlp_params(s) + norm_params(s)
    shared = mlp_of_width(s, shared_ffn(s)) if s.shared_experts else 0
    return attention_params(s) + s.hidden * s.experts + shared + norm_params(s) + latent_params(s)


def routed_params(spec: ModelSpec) -> int:
    """The routed experts of one MoE layer: E · one expert."""
    return spec.experts * expert_params(spec)


def norm_params(spec: ModelSpec) -> int:
    """Two norms per layer: layernorm (gain + shift, 2h each) or RMSNorm (gain, h each); with mHC its two
    hyper-connection modules too (:func:`mhc_params`), one a block, which every TP rank holds whole as the norms."""
    s = resolve(spec)
    return 2 * (2 * s.hidden if has_norm_shift(s) else s.hidden) + mhc_params(s)


def attention_delta(spec: ModelSpec, layer: int) -> int:
    """Layer ``layer``'s attention weights less :func:`attention_params` (which stands for every layer): a
    dsv4_hybrid layer's own ratio's, a DSA layer that reuses the top-k without its indexer; 0 otherwise."""
    if dsa_skips(spec, layer):
        return -indexer_params(spec)
    if not is_dsv4(spec):
        return 0
    return dsv4_attention_params(spec, compress_ratio(spec, layer)) - attention_params(spec)


def layer_params(spec: ModelSpec, layer: int | None = None) -> int:
    """All weights of one transformer layer (every expert counted, plus the router); ``layer`` picks a
    dense leading layer of a model with ``first_dense_layers`` (None: an MoE layer when there are experts)."""
    s = resolve(spec)
    moe = bool(s.experts) if layer is None else is_moe_layer(s, layer)
    if (hybrid.is_hybrid(s) or layers_differ(s)) and layer is not None:
        return shared_layer_params(s, layer) + (routed_params(s) if moe else 0)
    return dense_layer_params(s, moe) + (routed_params(s) if moe else 0)


def activated_layer_params(spec: ModelSpec, layer: int) -> int:
    """The weights one token uses in layer ``layer``: all but the routed experts it is not sent to."""
    s = resolve(spec)
    moe = is_moe_layer(s, layer)
    return shared_layer_params(s, layer) + (s.top_k * expert_params(s) if moe else 0)


def embedding_params(spec: ModelSpec) -> int:
    """Word embeddings V·h (+ learned positions s·h for GPT/BERT, none for RoPE models)."""
    s = resolve(spec)
    return s.vocab * s.hidden + (s.seq_len * s.hidden if learned_positions(s) else 0)


def head_params(spec: ModelSpec) -> int:
    """The LM head V·h (0 if tied to the embedding) plus the final norm."""
    s = resolve(spec)
    final_norm = 2 * s.hidden if has_norm_shift(s) else s.hidden
    return (0 if s.tied_embeddings else s.vocab * s.hidden) + final_norm


def total_params(spec: ModelSpec) -> int:
    """Parameters of the whole model."""
    s = resolve(spec)
    if hybrid.is_hybrid(s) or layers_differ(s):
        return sum(layer_params(s, i) for i in range(s.layers)) + embedding_params(s) + head_params(s)
    dense = min(s.first_dense_layers, s.layers) if s.experts else 0
    return (dense * layer_params(s, 0) + (s.layers - dense) * layer_params(s) + embedding_params(s)
            + head_params(s))


def activated_params(spec: ModelSpec) -> int:
    """Parameters one token uses (MoE: top_k routed experts of each MoE layer); the dense total otherwise."""
    s = resolve(spec)
    layers = sum(activated_layer_params(s, i) for i in range(s.layers))
    return layers + embedding_params(s) + head_params(s)


VOCAB_MULTIPLE = 128  # Megatron-LM --make-vocab-size-divisible-by (default 128), times tp


def padded_vocab(vocab: int, tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of 128·tp so each TP rank gets equal rows."""
    q = VOCAB_MULTIPLE * tp
    return -(-vocab // q) * q

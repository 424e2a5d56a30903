"""The activations one layer stores for its backward, per micro-batch and GPU, term by term.

Activations of one layer and one micro-batch (Korthikanti et al. 2022, bytes; s is the
sequence share of a CP rank, a the heads, t the TP size):
    TP alone            s·b·h·(10 + 24/t + 5·a·s/(h·t))
    TP + SP             s·b·h·(34 + 5·a·s/h)/t
    selective recompute s·b·h·(10 + 24/t), or 34·s·b·h/t with SP
    full recompute      2·s·b·h (2·s·b·h/t with SP: only the layer input is kept)
computed term by term so that GQA (K, V of kv heads), ``head_dim`` (Q, K, V and the projection
input of a·d and kv·d elements, not h), SwiGLU (two up outputs), MoE
(top_k routed copies of the expert width and of the experts' fc1 input, times the busiest rank's load
under routing imbalance, plus the shared experts' MLP) and models without dropout are counted; for a GPT
these terms are exactly the formulas above. Multi-latent attention keeps Q and K of a·d_qk,
V and the projection input of a·d_v, and the latents (r_q twice, r_kv + d_r and r_kv, as
the replicated part). Fused (flash) attention keeps no s² terms.

What Megatron-Core and Transformer Engine save, read in the versions NeMo pinned when it ran
Nemotron-4 340B on 128 H100 (NeMo 64e6c666 requirements/manifest.json: TransformerEngine 3b2a7b00,
v1.14; Megatron-LM 791b70e0, Core 0.11). bf16: LayerNormLinear saves the norm input, mu, rsigma and
the *local* (sequence-sharded) ln_out and all-gathers it again in backward (TE
transformer_engine/pytorch/module/layernorm_linear.py lines 327-337 and 464), so the QKV and MLP inputs
count h/t each; squared ReLU (torch.pow(relu(x), 2), NeMo nemo/collections/llm/fn/activation.py
line 37) keeps the ReLU output for pow's backward and fc2 keeps the square; the row-parallel
projection saves the attention output, the tensor the fused attention keeps (TE attention.py lines
6806-6807: q, k, v, out), counted once. fp8 (``training.precision: fp8``): ln_out is written in fp8
(layernorm_linear.py line 130) and the row-parallel Linear saves its fp8 input (linear.py lines
120 and 299), so the QKV, MLP, projection and fc2 inputs cost one byte; Q, K, V and the up
outputs stay bf16; without recompute the fused attention still keeps its bf16 output beside the
projection's fp8 copy.

workload/memory.py counts the layers each stage holds in flight; workload/offload.py what offloading sends.
"""
from __future__ import annotations

from emulator.scenario.spec import QUANTISED, ModelSpec, Scenario
from emulator.workload import hybrid, routing
from emulator.workload import models as M
from emulator.workload.layer import BLOCK_COPY, MXFP8_COPY, NVFP4_COPY, recipe_of

# Bytes per element of a GEMM input saved for the backward pass, by quantised recipe: per-tensor FP8 1
# (the default); MXFP8 and NVFP4 the column-wise copy the weight gradient reads, with its block scales
# (layer.py's MXFP8_COPY, NVFP4_COPY).
SAVED_INPUT_BYTES = {"mxfp8": MXFP8_COPY, "nvfp4": NVFP4_COPY, "blockwise": BLOCK_COPY}


def rank_load(r: ModelSpec, ep: int, tokens: int = 0) -> float:
    """The busiest EP rank's routed rows over the mean that a layer keeps for its backward (``tokens`` routed
    per rank and step: force balance's binomial maximum depends on them): its load (layer.py's
    LayerShape.rank_load), or under HybridEP's budget the static buffer's rows, or the paged stash's share
    (routing.stashed_load)."""
    return routing.stashed_load(r, M.moe_rank_load(r, ep, tokens))


def attention_parts(r: ModelSpec, g: float, keeps_out: bool, dpa: bool = False,
                    layer: int | None = None) -> tuple[float, float, float]:
    """(replicated, Q K V, projection) stored bytes per token of the attention block; ``g`` bytes per element of a
    saved GEMM input (2, or 1 in fp8); ``keeps_out``: the attention also keeps its output, which in fp8 is not the
    tensor the projection saves. ``dpa`` (training.fp8_dot_product_attention): Transformer Engine's FP8 attention
    saves Q, K, V and its output in FP8, one byte an element (its fused attention's save_for_backward of the FP8
    tensors), not two. ``layer``: the global index of the layer where the layers' attention differs
    (models.layers_differ; None: the largest kind's)."""
    h, a = r.hidden, r.heads
    e = 1 if dpa else 2
    d_v = M.head_dims(r)[1] if M.is_mla(r) else M.head_dim(r)
    out = a * d_v  # the projection's input width
    proj = 2 * out if g == 2 else g * out + (e * out if keeps_out else 0)
    if M.is_dsa(r):
        return _dsa_parts(r, g, layer is not None and M.dsa_skips(r, layer)) + (proj,)
    if M.is_dsv4(r):
        ratio = M.attention_ratio(r) if layer is None else M.compress_ratio(r, layer)
        return _dsv4_parts(r, g, keeps_out, ratio) + (g * r.o_groups * r.o_lora_rank,)
    if M.is_mla(r):
        d_qk = M.head_dims(r)[0]
        q, kv = r.q_lora_rank, r.kv_lora_rank
        latents = 2 * (q + kv + r.qk_rope_head_dim) + g * (q + kv)  # norm inputs; up-projection inputs
        return g * h + latents, e * (2 * a * d_qk + a * d_v), proj  # QKV input; Q, K, V; projection
    kvd = r.kv_heads * M.head_dim(r)
    gate = 2 * 2 * out if r.attention_output_gate else 0  # the gate and the output it multiplies, for its backward
    return g * h, e * (out + 2 * kvd) + gate, proj  # QKV input; Q, K, V; projection input


def _dsa_parts(r: ModelSpec, g: float, skip: bool = False) -> tuple[float, float]:
    """(replicated, sharded) stored bytes per token of DeepSeek Sparse Attention's absorbed MLA (workload/
    sparse_attention.py) but the projection's input. Replicated: the layer input, the latent norms' inputs and
    q_up's, the shared key r + d_r the core keeps, the top-k indices (int32, every TP rank's all), and with the loss
    the indexer's q, weights and k. Sharded: the query's non-rope part (the absorb einsum's input), the absorbed
    query (the core's), the latent output (the value einsum's input) and the core's fp32 log-sum-exp. The key
    the core keeps is this rank's share (the CP-gathered copy is transient), an approximation. A layer that
    reuses an earlier layer's top-k (``skip``, models.dsa_skips) has no indexer and keeps no indices of its own."""
    a, d_r, q, kv = r.heads, r.qk_rope_head_dim, r.q_lora_rank, r.kv_lora_rank
    d_n = M.head_dims(r)[0] - d_r
    H, D = r.dsa_indexer_n_heads, r.dsa_indexer_head_dim
    indexer = 0 if skip else 4 * r.dsa_indexer_topk + (2 * (H * D + H + D) if r.dsa_indexer_loss_coeff > 0 else 0)
    rep = g * r.hidden + 2 * (q + kv + d_r) + g * q + 2 * (kv + d_r) + indexer
    return rep, 2 * a * d_n + 2 * a * (kv + d_r) + 2 * a * kv + 4 * a


def _dsv4_parts(r: ModelSpec, g: float, keeps_out: bool, ratio: int) -> tuple[float, float]:
    """(replicated, sharded) stored bytes per token of DeepSeek-V4's attention (workload/compressed_attention.py) but
    o_b's input, of a layer at compression ratio ``ratio``. Replicated: q_a's input, q_a_norm's and q_b's
    (r_q each), kv_norm's input and the shared key the core keeps (D each), the compressor's kv and gate (2·w each,
    for the pooling's backward), the top-k indices (int32) and with the loss the indexer's q, weights and its
    compressor's kv and gate. Sharded: q_b's output (its norm's input) and the query the core keeps (a·D each), the
    core's output (o_a's input, a BF16 bmm) and log-sum-exp, and with ``keeps_out`` the core's own output beside it.
    An ASSUMPTION of what Megatron-Core's dev branch saves, read from HF's modules."""
    a, D, q = r.heads, M.head_dim(r), r.q_lora_rank
    comp = 2 * 2 * (2 * D if ratio == 4 else D) if ratio else 0
    indexer = 0
    if ratio == 4:
        H, DI = r.dsa_indexer_n_heads, r.dsa_indexer_head_dim
        indexer = 4 * r.dsa_indexer_topk + (2 * (H * DI + H) + 2 * 2 * 4 * DI if r.dsa_indexer_loss_coeff > 0 else 0)
    rep = g * r.hidden + 2 * q + g * q + 2 * D + 2 * D + comp + indexer
    return rep, 2 * a * D * (2 + 1 + (1 if keeps_out else 0)) + 4 * a


def mhc_terms(r: ModelSpec) -> float:
    """Stored bytes per token of one layer's mHC (workload/hyper_connection.py), beside the norms' inputs the layer
    counts: each block's n·h streams (its projection's and aggregate's input) and its output (h, H_post's input);
    0 without enable_mhc_connections."""
    if not r.enable_mhc_connections:
        return 0.0
    return 2 * (2 * r.mhc_num_residual_streams * r.hidden + 2 * r.hidden)


def attention_terms(r: ModelSpec, g: float, keeps_out: bool, dpa: bool = False,
                    layer: int | None = None) -> tuple[float, float]:
    """(replicated, sharded) stored bytes per token of the attention block (:func:`attention_parts`)."""
    rep, qkv, proj = attention_parts(r, g, keeps_out, dpa, layer)
    return rep, qkv + proj


def _mlp_terms(r: ModelSpec, moe: bool, ep: int, g: float, tokens: int = 0, width: int = 0, etp: int = 1) -> float:
    """Stored bytes per token of the MLP (or the experts): up output(s) in bf16, kept by the activation
    function, and the activation's output, the down GEMM's input (``g`` bytes); ``width``: a dense MLP
    of that width (0: ffn_hidden); ``tokens``: routed per rank and step (:func:`rank_load`). A routed copy
    also keeps its own input to the experts' fc1 (:func:`expert_input_terms`): a dense MLP's fc1 input is
    the layer's normed input, counted with the replicated terms."""
    def mlp(width: int) -> float:
        return 2 * width * (2 if r.swiglu else 1) + g * width
    if not moe:
        return mlp(width or r.ffn_hidden)
    routed = r.top_k * rank_load(r, ep, tokens)
    return routed * mlp(M.expert_ffn(r)) + expert_input_terms(r, ep, g, tokens, etp) \
        + (mlp(M.shared_ffn(r)) if r.shared_experts else 0) + latent_terms(r, g)


def expert_input_terms(r: ModelSpec, ep: int, g: float, tokens: int = 0, etp: int = 1) -> float:
    """Stored bytes per token of the routed experts' fc1 input: the permuted copies of the tokens, top_k·load
    rows of h, which Transformer Engine's GroupedLinear saves for its weight gradient (module/grouped_linear.py
    @ d0067d0da: ``inputmats`` in ``prepare_for_saving``, line 931), quantised (``g`` bytes) under FP8. With
    the experts' tensor parallelism (``etp`` ranks) each of them holds the tokens of all: the dispatcher gathers
    them over the expert-TP group (token_dispatcher.py @ d98e8a64dd, MoEAlltoAllTokenDispatcher.token_dispatch,
    lines 741-746), while their up outputs are split over it; so etp times the share of one."""
    return r.top_k * rank_load(r, ep, tokens) * g * (r.moe_latent_size or r.hidden) * etp


def latent_terms(r: ModelSpec, g: float) -> float:
    """Stored bytes per token of a latent MoE layer's projections (model.moe_latent_size): fc2_latent_proj's input,
    ``g``·latent, and under a quantised recipe fc1_latent_proj's own quantised copy of its input, ``g``·h (in BF16
    it saves the tensor the router saves); 0 without a latent size."""
    n = r.moe_latent_size
    return g * n + (g * r.hidden if g != 2 else 0.0) if n else 0.0


def freed_terms(r: ModelSpec, modules: tuple[str, ...], moe: bool, ep: int, g: float,
                tokens: int = 0, etp: int = 1, dpa: bool = False) -> tuple[float, float]:
    """(replicated, sharded) bytes per token that ``recompute_modules`` do not keep (workload/recompute.py):
    mla_up_proj the query, key and value of the up projections (2·a·d_qk twice and 2·a·d_v; DeepSeek-V4's q_b
    output and query, 2·a·D each); mhc the MLP block's n·h streams and the two aggregates (2h each); layernorm
    the two norm outputs, the attention's and the MLP's input (g·h each); moe_act the routed experts'
    activation output (g·f_e per routed copy); mlp a dense MLP's stored tensors; moe the MoE layer's
    (routed and shared experts); shared_experts the shared experts'. core_attn frees the s² scores
    (unfused attention; the caller drops them)."""
    rep = shard = 0.0
    if "layernorm" in modules:
        rep += 2 * g * r.hidden
    if "mhc" in modules and r.enable_mhc_connections:  # the MLP block's streams (rerun from the layer's), aggregates
        rep += 2 * r.mhc_num_residual_streams * r.hidden + 2 * 2 * r.hidden
    if "mla_up_proj" in modules and M.is_dsv4(r):  # q_b's output and the normed, rotated query (_dsv4_parts)
        shard += 2 * 2 * r.heads * M.head_dim(r)
    if "mla_up_proj" in modules and M.is_dsa(r):  # the query's non-rope part and the absorbed query (_dsa_parts)
        shard += 2 * r.heads * (M.head_dims(r)[0] + r.kv_lora_rank)  # d_n, and r + d_r
    elif "mla_up_proj" in modules and M.is_mla(r):
        d_qk, d_v = M.head_dims(r)
        shard += (1 if dpa else 2) * (2 * r.heads * d_qk + r.heads * d_v)  # in FP8 with dpa (attention_parts)
    if moe:
        if "moe" in modules:
            shard += _mlp_terms(r, True, ep, g, tokens, etp=etp)
        else:
            if "moe_act" in modules:
                shard += r.top_k * rank_load(r, ep, tokens) * g * M.expert_ffn(r)
            if "shared_experts" in modules and r.shared_experts:
                shard += _mlp_terms(r, False, ep, g, width=M.shared_ffn(r))
    elif "mlp" in modules:
        shard += _mlp_terms(r, False, ep, g)
    return rep, shard


def mixer_terms(r: ModelSpec, g: float) -> float:
    """Stored bytes per token of a Mamba-2 mixer, its TP-sharded tensors (before the split): what Megatron-Core's
    memory-efficient path keeps (megatron/core/ssm/mamba_mixer.py @ d98e8a64dd, ``_ssm_training``: mamba_ssm's
    ``mamba_split_conv1d_scan_combined``, ssd_combined.py @ e9594ce, which saves its input zxBCdt, 2·(2·d_in + 2·G·N
    + H), and the scan's ungated output, 2·d_in, and recomputes the convolution in its backward), the grouped norm's
    input, 2·d_in, and out_proj's input, ``g``·d_in."""
    md = hybrid.mamba_dims(r)
    return 2 * md.in_proj + 2 * md.d_inner + 2 * md.d_inner + g * md.d_inner


def delta_terms(r: ModelSpec, g: float) -> float:
    """Stored bytes per token of a gated delta net, its TP-sharded tensors (before the split): the convolution's input
    and output (2·(2·K·d_k + V·d_v) each), q and k as the rule reads them (normalised, repeated to the V heads:
    2·2·V·d_k), the gates in fp32 (8·V), the rule's output and z for the gated norm (2·V·d_v each) and out_proj's
    input (``g``·V·d_v): what the autograd of Megatron-Core's GatedDeltaNet keeps (workload/delta_net.py), an
    ASSUMPTION of FLA's own saved tensors (q, k, v, g, beta: those above)."""
    dd = hybrid.delta_dims(r)
    return 4 * dd.conv_dim + 4 * dd.value_heads * dd.key_dim + 8 * dd.value_heads + 4 * dd.v + g * dd.v


def part_terms(r: ModelSpec, part: str, g: float, attn_rep: float, attn_sharded: float, ep: int, tokens: int,
               etp: int) -> tuple[float, float]:
    """(replicated, sharded) stored bytes per token of one part of a hybrid layer, its norm input and mask apart:
    the attention's (:func:`attention_terms`), an MLP's or the experts' input (``g``·h) and tensors, or the mixer's
    in_proj input (``g``·h) and :func:`mixer_terms`."""
    if part == hybrid.ATTENTION:
        return attn_rep, attn_sharded
    if part == hybrid.MAMBA:
        return g * r.hidden, mixer_terms(r, g)
    if part == hybrid.GDN:
        return g * r.hidden, delta_terms(r, g)
    return g * r.hidden, _mlp_terms(r, part == hybrid.MOE, ep, g, tokens, etp=etp)


def part_freed_terms(r: ModelSpec, part: str, modules: tuple[str, ...], ep: int, g: float, tokens: int,
                     etp: int) -> tuple[float, float]:
    """:func:`freed_terms` of one part of a hybrid layer: layernorm frees its one norm's output (``g``·h; a Mamba
    layer's norm is not a module Megatron-Core recomputes), mlp a dense MLP part's tensors, moe, moe_act and
    shared_experts an MoE part's."""
    if part in (hybrid.MAMBA, hybrid.GDN):
        return 0.0, 0.0
    mlp_modules = ("mlp", "moe", "moe_act", "shared_experts")
    mine = tuple(x for x in modules if x != "layernorm" and (part != hybrid.ATTENTION or x not in mlp_modules))
    rep, shard = freed_terms(r, mine, part == hybrid.MOE, ep, g, tokens, etp)
    return rep + (g * r.hidden if "layernorm" in modules else 0.0), shard


def layer_activation_bytes(m: ModelSpec, b: int, s: int, t: int = 1, sp: bool = False,
                           recompute: str = "none", flash: bool = False, dtype: int = 2,
                           ep: int = 1, moe: bool | None = None, fp8: bool = False,
                           modules: tuple[str, ...] | None = None, saved: float = 1.0, etp: int = 1,
                           dpa: bool = False, part: str = "", layer: int | None = None) -> float:
    """Stored activations of one layer, one micro-batch, on one GPU (see module docstring); ``etp``: the experts'
    tensor-parallel size (:func:`expert_input_terms`); ``moe``
    False: a dense leading layer of an MoE model (None: an MoE layer if the model has experts);
    ``fp8``: Transformer Engine saves the GEMM inputs quantised, ``saved`` bytes an element (1 in FP8;
    SAVED_INPUT_BYTES); ``modules``: selective recompute of those modules (:func:`freed_terms`); ``dpa``: FP8
    attention (:func:`attention_parts`); ``part``: one part of a hybrid model's layer (workload/hybrid.py's
    symbols, :func:`part_terms`), "" a whole transformer layer; ``layer``: the global index of the layer whose
    attention it is where the layers' attention differs (models.layers_differ; None: the largest kind's)."""
    r = M.resolve(m)
    h, a = r.hidden, r.heads
    dropout = M.has_dropout(r)
    unit = s * b * dtype / 2  # the formulas count 2-byte elements
    if recompute == "full":
        return 2 * s * b * h * dtype / 2 / (t if sp else 1)
    mask = 1.0 if dropout else 0.0  # 1-byte dropout mask per element of h
    g = saved if fp8 else 2
    attn_rep, attn_sharded = attention_terms(r, g, keeps_out=flash and recompute == "none", dpa=dpa and fp8,
                                             layer=layer)
    # 2 norm inputs, 2 masks, QKV and MLP inputs, mHC's streams
    replicated = 2 * 2 * h + 2 * mask * h + attn_rep + g * h + mhc_terms(r)
    is_moe = bool(r.experts) if moe is None else moe
    sharded = attn_sharded + _mlp_terms(r, is_moe, ep, g, b * s, etp=etp)
    drop_scores = recompute == "selective" and (modules is None or "core_attn" in modules)
    scores = 0.0 if flash or drop_scores else a * s * (2 + mask + 2 * mask)  # softmax, mask, dropout
    if part:  # one part of a hybrid model's layer: its norm input and mask, and the part's own tensors
        replicated, sharded = part_terms(r, part, g, attn_rep, attn_sharded, ep, b * s, etp)
        replicated += 2 * h + mask * h
        scores = scores if part == hybrid.ATTENTION else 0.0
        if recompute == "selective" and modules is not None:
            free_rep, free_shard = part_freed_terms(r, part, modules, ep, g, b * s, etp)
            replicated -= free_rep
            sharded -= free_shard
    elif recompute == "selective" and modules is not None:
        free_rep, free_shard = freed_terms(r, modules, is_moe, ep, g, b * s, etp, dpa and fp8)
        replicated -= free_rep
        sharded -= free_shard
    if sp:
        return unit * (replicated + sharded + scores) / t
    return unit * (replicated + (sharded + scores) / t)


def scenario_layer_bytes(sc: Scenario, m: ModelSpec, moe: bool | None = None, part: str = "",
                         layer: int | None = None) -> float:
    """:func:`layer_activation_bytes` of model ``m`` at scenario ``sc``'s shape, parallelism, precision, recompute and
    attention (``moe``, ``part`` and ``layer`` as there): what workload/memory.py keeps per layer in flight and
    workload/cpu_offload.py sends."""
    par, tr = sc.parallel, sc.training
    return layer_activation_bytes(
        m, tr.micro_batch, m.seq_len // par.cp, par.tp, par.sequence_parallel and par.tp > 1, tr.recompute,
        tr.attention in ("flash", "fa2") or par.cp > 1, 4 if tr.precision in ("fp32", "tf32") else 2, par.ep, moe,
        tr.precision in QUANTISED, tr.recompute_modules, SAVED_INPUT_BYTES.get(recipe_of(tr.precision, tr.fp8_recipe),
                                                                               1.0),
        par.etp or par.tp, tr.fp8_dot_product_attention, part, layer)


def hybrid_layer_bytes(sc: Scenario, m: ModelSpec, layers: list[int]) -> float:
    """The mean of :func:`scenario_layer_bytes` over a hybrid model's ``layers`` (each its parts': an MTP module's
    layer has its depth's, models.layer_parts): what one of them keeps in flight, on average, where a stage holds
    them; 0 for none."""
    if not layers:
        return 0.0
    symbols = set(m.hybrid_layer_pattern) - {"/"}
    by_part = {p: scenario_layer_bytes(sc, m, p == hybrid.MOE, p) for p in symbols}
    return sum(sum(by_part[p] for p in M.layer_parts(m, i)) for i in layers) / len(layers)


def differing_layer_bytes(sc: Scenario, m: ModelSpec, layers: list[int], offloaded: tuple[float, float]) -> float:
    """The mean of :func:`scenario_layer_bytes` over ``layers`` of a model whose layers' attention differs
    (models.layers_differ: DeepSeek-V4's compression ratios, DSA's top-k sharing), each at its own attention and
    kind (an MoE model's leading dense layers dense; an MTP module's index layers + 1 + d), less what fine-grained
    offloading sends away from it (``offloaded``: an MoE layer's, a dense one's): what one of them keeps in flight,
    on average, where a stage holds them; 0 for none."""
    if not layers:
        return 0.0
    total = 0.0
    for i in layers:
        moe = M.is_moe_layer(m, i) or not m.experts
        total += scenario_layer_bytes(sc, m, moe, layer=i) - offloaded[0 if moe else 1]
    return total / len(layers)

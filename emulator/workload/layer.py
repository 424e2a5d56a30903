"""One transformer layer as the kernels and communications one GPU runs, in order.

A pass (forward, backward, a recompute) is a list of steps: :class:`Kernel` (compute,
with FLOPs, bytes and shape) and :class:`Comm` (a tensor/context/expert-parallel
communication). The builder turns the steps into Program ops; :mod:`.kernel_cost` costs
a kernel (the measured kernel database first, else :mod:`emulator.devices.compute`'s roofline).

The kernels are those of Megatron-LM's GPT layer (Korthikanti et al. 2022 is the
version calibrated against), per GPU and per micro-batch, with T = b·s tokens
(s = the sequence share of this CP rank) and Te = T/t tokens for the elementwise work
that sequence parallelism shards:

forward: ln1 · [SP all-gather] · QKV GEMM · (RoPE) · attention core · context copy ·
proj GEMM · [TP all-reduce | SP reduce-scatter] · bias-dropout-add · ln2 · [SP AG] ·
MLP up GEMM · GeLU | SwiGLU | squared ReLU · MLP down GEMM · [TP AR | SP RS] · bias-dropout-add.
Unfused attention core (the calibrated one): QKᵀ batched GEMM, fused scale-mask-
softmax, dropout, P·V batched GEMM. Flash attention (and always with CP > 1) is one
fused kernel per K/V block.

Elementwise kernels are memory-bound; their bytes count the real passes over the
tensor ("passes" of elements of ``dtype`` bytes; a 1-byte dropout mask is half a pass):
layernorm forward 2 (read x, write y) and backward 3 (read dy and x, write dx);
bias-dropout-add forward 3.5 (read x and residual, write y and the mask), backward
2.5 (read dy and mask, write dx) plus 1 for the bias gradient; residual-gradient
accumulation 3 (read two, write one); GeLU 2 forward, 3 backward (+1 bias gradient);
SwiGLU 3 forward, 5 backward; squared ReLU (Nemotron) as GeLU in bytes, 2 FLOPs per element
forward (max, square) and 3 backward; softmax 2 forward, 3 backward; attention dropout 2.5 each
way; contiguous copies 2.

Heads have d = ``head_dim`` dims (h/a by default): QKV is T×h → T×(a_l + 2·kv_l)·d, the core
works on d, and the projection is T×a_l·d → T×h.

Mixture-of-Experts (a layer with ``experts``): router GEMM · routing and aux-loss kernels · the
dispatcher's counts and the permutation's row-id map · permute · [EP all-to-all dispatch] · [chunk sort]
· the local experts' up GEMM, activation and down GEMM as one grouped GEMM each (Megatron-Core's
--moe-grouped-gemm) · [chunk unsort] · [EP all-to-all combine] · unpermute (the dispatch's steps and
its small kernels are token_dispatch.py's); shared experts (one MLP of their summed width, TP-sharded)
run on every token before the routed ones.
With routing imbalance f (busiest expert / mean) the busiest EP rank holds that expert and
local − 1 experts of mean load, so it computes (f + local − 1)/local times the mean tokens
(1 without EP: all experts on each rank, the total is the mean); every rank is costed as
that one, because the all-to-alls wait for it, and the all-to-all buffers grow by the same
factor (an upper bound of the traffic: only the busiest rank receives that much).

Latent MoE (``model.moe_latent_size``, Megatron-Core's fc1_latent_proj and fc2_latent_proj): after the routing a
GEMM takes the tokens from h to the latent width, the permutation, the dispatch, the experts and the combine move
and take latent-wide rows (LayerShape.hx), and a GEMM takes them back after the unpermutation
(token_dispatch.py).

A hybrid model's layer (workload/hybrid.py, LayerShape.parts) runs its parts in order, each with its own norm and
residual add: the attention block, the MLP block (dense or MoE), a Mamba-2 mixer's (mixer.py, in an attention
block's frame) or a gated delta net's (delta_net.py, in the same frame); its backward the parts in reverse.

DeepSeek Sparse Attention (``model.experimental_attention_variant: dsa``; sparse_attention.py) runs MLA absorbed: no
kv_up GEMM but the query's and the output's per-head einsums (q_absorb, v_up) around the indexer, its top-k and the
sparse core. Megatron-Core's ``attention_output_gate`` widens the QKV GEMM by a gate of a_l·d whose sigmoid
multiplies the attention's output before the projection.

MoE parallel folding (``parallel.etp`` other than tp; Megatron-Core's alltoall dispatcher): the
router and permutation run on this rank's Te sequence-parallel tokens, the all-to-all goes over the
folded EP group, an all-gather and a reduce-scatter over the ETP group wrap the local experts'
grouped GEMMs of width f_e/etp, and no TP collective wraps the routed experts (the shared ones keep
their SP all-gather and reduce-scatter over TP). See the comment above :func:`_folded_moe_forward`.

Multi-latent attention (DeepSeek-V2/V3), as Megatron-Core builds it
(megatron/core/transformer/multi_latent_attention.py @ d98e8a64dd, MLASelfAttention): the
down projections q_down (h → r_q) and kv_down (h → r_kv + d_r) are replicated over TP
("duplicated") and run on the layer input as it is, Te tokens (T/t with SP); q_norm and
kv_norm follow; the up projections q_up (r_q → a_l·d_qk) and kv_up (r_kv → a_l·(d_n + d_v))
are column-parallel, so with SP they all-gather the compressed T·r_q and T·(r_kv + d_r)
(the rope key with it) instead of the hidden states; without q_rank a column-parallel q
(h → a_l·d_qk) gathers T·h as a QKV GEMM would. Then the rotary embedding on the a_l query
heads and the one shared rope key, and a core of head dims d_qk (scores) and d_v (values).
Backward mirrors it: the up projections' input gradients are all-reduced (SP:
reduce-scattered) as T·r under their wgrad. Left out: the TP all-reduce of the replicated
weights' gradients (finalize_model_grads; a few MB per layer).

FP8 (``training.precision: fp8``, ``LayerShape.fp8``) is Transformer Engine's delayed-scaling recipe
(NVIDIA/TransformerEngine @ d0067d0): only the GEMMs of its linear layers run in FP8 (1-byte
operands: QKV, projection, MLP and expert GEMMs); the core attention, the MoE router and the
output layer (Megatron's ColumnParallelLinear, not a TE module) stay in BF16, and so do the
element-wise kernels and the activations they move. Around each FP8 GEMM TE quantizes its
operands (transformer_engine/pytorch/module/linear.py): forward, the input is cast to FP8 in both
layouts ("rowwise" and "columnwise": a cast-transpose, lines 384-398, because Hopper's FP8 GEMMs
take only the TN layout and wgrad needs Xᵀ) and so is the weight, once per step
(``update_ws = is_first_microbatch``, line 479); backward, the output gradient is cast-transposed
(lines 903-905); wgrad reuses the saved transposes. Each cast computes its tensor's amax in the
same kernel; TE then reduces the amaxes and updates the scaling factors of the amax history
(1024 fp32 entries per tensor: quantization.py lines 143 and 656-700, one fused kernel over a
global buffer per pass). The casts are memory-bound kernels costed by their bytes: 4 per element
cast-transposed (read 2, write 1 + 1), the weight's spread over the step's micro-batches (2 with
``fp8_params``: the weight is already FP8, only its transpose is written); the amax-history update
adds 2·4·1024 bytes per quantized tensor to the cast before its GEMM. A cast moves its bytes at
the bandwidth a cast reached on the H200 (compute.CAST_MEM_EFFICIENCY, from
../shared/calibration/h200/elementwise.csv). The all-reduce (MAX) of the
amaxes over the data-parallel group, a few kB once per pass, is left out. The other recipes (current scaling,
blockwise, MXFP8, NVFP4) differ in these casts only (:func:`_quant_kernels`); with ``training.fp8_output_proj`` the
output layer runs in MXFP8 too (:func:`head_casts`).

Backward of a linear layer is two GEMMs, dgrad then wgrad. As in Megatron
(LinearWithGradAccumulationAndAsyncCommunication), the TP all-reduce (SP: reduce-scatter)
of a column-parallel layer's input gradient runs asynchronously under its wgrad GEMM,
and with SP the all-gather of the saved (sharded) input runs under the dgrad GEMM; the
row-parallel layers need no TP comm backward without SP and an all-gather of the output
gradient (on the critical path) with SP. With ``parallel.tp_comm_overlap`` the attention's and the dense
MLP's SP collectives run as Transformer Engine's Userbuffers run them, under chunks of their GEMMs
(:func:`userbuffers`); under a quantised recipe the SP all-gathers into TE's linear layers carry the
quantised tensor (:func:`quantised_gathers`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from emulator.scenario.spec import ModelSpec, ParallelSpec
from emulator.workload import compressed_attention, delta_net, hybrid, mixer, routing, sparse_attention
from emulator.workload import hyper_connection as HC
from emulator.workload.models import (
    attention_ratio,
    compress_ratio,
    dsa_skips,
    expert_ffn,
    has_biases,
    has_dropout,
    head_dims,
    is_dsa,
    is_dsv4,
    is_mla,
    loads_vary,
    moe_rank_load,
    position_embedding,
    resolve,
    shared_ffn,
    window_share,
)

# the steps and their constructors (steps.py): the passes' callers name them as layer's too
from emulator.workload.steps import (
    BLOCK_COPY,
    BLOCK_WEIGHT_COPY,
    BWD,
    FWD,
    MXFP8_COPY,
    NVFP4_COPY,
    NVFP4_WEIGHT_COPY,
    RECOMPUTE,
    Comm,
    Kernel,
    LayerShape,
    Step,
    elementwise,
    flash,
    gemm,
    grouped_gemm,
    linear_backward,
)
from emulator.workload.steps import comms as comms  # re-exported: the passes' callers count them with it
from emulator.workload.steps import kernels as kernels  # re-exported: and pick their kernels with it
from emulator.workload.token_dispatch import (
    chunk_sort,
    combine_backward,
    combine_steps,
    dispatch_backward,
    dispatch_steps,
    expert_padding,
    latent_up,
    latent_up_backward,
    permute_and_router_backward,
    route_and_permute,
    shared_split,
    unpermute,
    unpermute_backward,
)
from emulator.workload.userbuffers import UB_COMM_SMS, userbuffers


def layer_shape(model: ModelSpec, micro_batch: int, t: int = 1, sp: bool = False, cp: int = 1,
                ep: int = 1, dtype: int = 2, flash: bool = False, micro_batches: int = 1,
                fp8_params: bool = False, fa2: bool = False, etp: int | None = None, recipe: str = "",
                non_tn: bool = False, parallel: ParallelSpec | None = None, sm_count: int = 0,
                fp8_dpa: bool = False, fp8_head: bool = False) -> LayerShape:
    """The per-GPU layer shape of ``model`` under the given parallelism. ``dtype`` 1 is quantised training
    (Transformer Engine: quantised GEMMs, BF16 activations) by ``recipe`` (delayed | tensorwise | blockwise |
    mxfp8 | nvfp4; "": delayed); its weights are quantised once per step of ``micro_batches``
    (:func:`weight_quant_bytes`). ``non_tn``: the GPU runs FP8 GEMMs of every layout (Blackwell).
    ``etp``: the experts' own tensor parallelism (None or t: as the attention's). ``parallel``: its MoE
    dispatch keys; ``sm_count``: the GPU's SMs (the flex dispatcher's kernels take moe_flex_dispatcher_num_sms
    of them). ``fp8_dpa``: Transformer Engine's FP8 attention (quantised training only); ``fp8_head``: the LM head
    in MXFP8 (training.fp8_output_proj; the mxfp8 recipe only)."""
    fp8 = dtype == 1
    if fp8:
        dtype = 2
        recipe = recipe or "delayed"
    else:
        recipe = ""
    m = resolve(model)
    causal = m.causal
    d_qk, d_v = head_dims(m)
    mla: dict[str, Any] = dict(q_rank=m.q_lora_rank, kv_rank=m.kv_lora_rank, rope_dim=m.qk_rope_head_dim, qk_head=d_qk,
               v_head=d_v, kv_heads=m.heads, **_dsa_fields(m)) if is_mla(m) else dict(kv_heads=m.kv_heads,
                                                                                      **_dsv4_fields(m))
    wbytes = weight_quant_bytes(recipe, non_tn, fp8_params) / max(1, micro_batches) if fp8 else 0.0
    ub = _ub_slow(parallel, t, sp, is_mla(m), sm_count)
    return LayerShape(b=micro_batch, s=m.seq_len // cp, s_kv=m.seq_len, h=m.hidden, heads=m.heads,
                      ffn=m.ffn_hidden, swiglu=m.swiglu, biases=has_biases(m),
                      dropout=has_dropout(m), t=t, sp=sp and t > 1, cp=cp, experts=m.experts,
                      top_k=m.top_k, ep=ep, dtype=dtype, flash=flash, causal=causal, activation=m.activation,
                      expert_ffn=expert_ffn(m) if m.experts else 0, shared_ffn=shared_ffn(m) if m.experts else 0,
                      imbalance=m.moe_imbalance, fp8=fp8, recipe=recipe, non_tn=non_tn and fp8, fa2=fa2,
                      fp8_dpa=fp8_dpa and fp8 and flash and not fa2,
                      fp8_head=fp8_head and recipe == "mxfp8",
                      fused_mlp=bool(m.experts) and m.use_transformer_engine_op_fuser and non_tn
                      and recipe in ("mxfp8", "nvfp4"),
                      fp8_weight_bytes=wbytes, head=m.head_dim,
                      load=_load(m, ep, micro_batch * (m.seq_len // cp), t, sp, etp),
                      etp=etp if etp and etp != t else 0, window=m.sliding_window, window_share=window_share(m),
                      sinks=m.softmax_type != "vanilla", ub_slow=ub, ub_cfg=_ub_cfg(parallel, sm_count) if ub else (),
                      cp_a2a=cp > 1 and parallel is not None and parallel.cp_comm_type == "a2a",
                      cp_hier=_cp_hier(parallel, cp),
                      cp_ag=cp > 1 and parallel is not None and parallel.cp_comm_type == "all_gather",
                      positions=position_embedding(m), latent=m.moe_latent_size if m.experts else 0,
                      out_gate=m.attention_output_gate, **_hc_fields(m),
                      **_mixer_fields(m), **mla,
                      **{**_dispatch_fields(m, parallel, sm_count),
                         **_quant_padding(m, parallel, recipe, micro_batch * (m.seq_len // cp), t, sp, ep, etp)})


# Quantised experts' alignment (Megatron-Core @ d98e8a64dd): an FP8, MXFP8 or NVFP4 grouped GEMM takes each expert's
# rows in a multiple of get_align_size_for_quantization (moe_utils.py): 16 for FP8, 32 for MXFP8 (fp8_utils.py
# get_fp8_align_size) and NVFP4 (fp4_utils.py get_fp4_align_size). Who pads:
# - with moe_router_padding_for_quantization, the alltoall dispatcher pads each source rank's routing map
#   (token_dispatcher.py, MoEAlltoAllTokenDispatcher.preprocess: pad_routing_map), so every rank sends more copies and
#   an expert receives a padded count from each of the EP group's ranks; DeepEP pads the routing map of the tokens it
#   received (_DeepepManager._pad_routing_map): rows, no traffic;
# - HybridEP pads in its own dispatch (moe_utils.py skip_routed_expert_padding);
# - else the experts pad (experts.py: TE's Fp8Padding of the rows and the probabilities, by the host's token counts;
#   Fp8Unpadding after fc2).
# ASSUMPTION: a routed count is spread evenly modulo the alignment a, so a padded count gains (a − 1)/2 rows.
QUANT_ALIGN = {"delayed": 16, "tensorwise": 16, "blockwise": 16, "mxfp8": 32, "nvfp4": 32}
# Megatron-Core's op fuser (model.use_transformer_engine_op_fuser): TE's grouped-tensor and fused grouped-MLP kernels
# take 256-row groups (moe_utils.py @ d98e8a64dd, get_align_size_for_quantization)
OP_FUSER_ALIGN = 256


def _quant_padding(m: ModelSpec, par: ParallelSpec | None, recipe: str, tokens: int, t: int, sp: bool, ep: int,
                   etp: int | None) -> dict[str, Any]:
    """LayerShape's pad_rows and pad_copies (and a2a_scale's padded share where the alltoall dispatcher's router
    pads) for a quantised MoE layer; {} otherwise."""
    align = QUANT_ALIGN.get(recipe, 0)
    if align and m.use_transformer_engine_op_fuser:
        align = OP_FUSER_ALIGN
    if not m.experts or not align or par is None:
        return {}
    half = (align - 1) / 2
    dispatcher, backend = par.moe_token_dispatcher_type, par.moe_flex_dispatcher_backend
    if dispatcher == "flex" and backend == "hybridep":
        return dict(pad_rows=half)
    if not m.moe_router_padding_for_quantization:
        return dict(pad_rows=half, pad_copies=True)
    if dispatcher == "flex":
        return dict(pad_rows=half)
    routed = _router_tokens(tokens, t, sp, etp) * m.top_k  # the copies this rank's router makes
    cap = m.moe_expert_capacity_factor if routing.padded(m) and m.moe_expert_capacity_factor else 1.0
    return dict(pad_rows=ep * half, a2a_scale=cap * (1 + m.experts * half / routed))


def _cp_hier(par: ParallelSpec | None, cp: int) -> int:
    """LayerShape.cp_hier: the all-to-all level's size under cp_comm_type a2a+p2p (0 otherwise, or where it is 1)."""
    if cp <= 1 or par is None or par.cp_comm_type != "a2a+p2p" or not par.hierarchical_context_parallel_sizes:
        return 0
    a = par.hierarchical_context_parallel_sizes[0]
    return a if a > 1 else 0


def _load(m: ModelSpec, ep: int, tokens: int, t: int, sp: bool, etp: int | None, layer: int | None = None,
          step: int = 0) -> float:
    """The busiest EP rank's load (models.moe_rank_load) in MoE layer ``layer`` at step ``step`` (None: the
    busiest layer) where the routing keys say more than moe_imbalance; 0: LayerShape.rank_load's reading of
    moe_imbalance, over the tokens the router sees (:func:`_router_tokens`)."""
    if not (m.moe_expert_load or m.moe_router_force_load_balancing or m.moe_expert_capacity_factor is not None
            or m.moe_load_seed is not None or routing.rank_budget(m) is not None):
        return 0.0
    return moe_rank_load(m, ep, _router_tokens(tokens, t, sp, etp), layer, step)


def _router_tokens(tokens: int, t: int, sp: bool, etp: int | None) -> int:
    """The tokens one rank's router sees of a micro-batch's ``tokens``: its sequence shard when the experts are
    folded (etp other than t, with sequence parallelism), else the TP group's whole micro-batch."""
    return tokens // t if bool(etp) and etp != t and sp and t > 1 else tokens


def layer_load_shape(L: LayerShape, m: ModelSpec, layer: int, step: int = 0) -> LayerShape:
    """``L`` with MoE layer ``layer``'s own load at step ``step`` (models.loads_vary: a row each, or drawn);
    ``L`` itself where every layer has the same load."""
    if not (L.experts and loads_vary(m)):
        return L
    return replace(L, load=_load(m, L.ep, L.b * L.s, L.t, L.sp, L.etp or None, layer, step))


def _dispatch_fields(m: ModelSpec, par: ParallelSpec | None, sm_count: int) -> dict[str, Any]:
    """LayerShape's dispatch and router fields from the parallel and model keys."""
    dispatcher = par.moe_token_dispatcher_type if par is not None else "alltoall"
    early = dispatcher == "alltoall" and not routing.padded(m) and (
        m.moe_expert_capacity_factor is not None or m.moe_router_padding_for_quantization)
    out: dict[str, Any] = dict(router_bytes=ROUTER_BYTES.get(m.moe_router_dtype, 0), groups=m.moe_router_num_groups,
                               router_fusion=m.moe_router_fusion, permute_fusion=m.moe_permute_fusion,
                               permute_into_hybridep=m.moe_permute_fusion_into_hybridep,
                     group_topk=m.moe_router_group_topk, drop_pad=routing.padded(m),
                     a2a_scale=m.moe_expert_capacity_factor if routing.padded(m) else 1.0, early_sync=early)
    if par is None:
        return out
    flex = par.moe_token_dispatcher_type == "flex"
    sms = par.moe_flex_dispatcher_num_sms
    slow = sm_count / (sm_count - sms) if flex and sm_count > sms else 1.0
    static = flex and par.moe_flex_dispatcher_backend == "hybridep" and routing.rank_budget(m) is not None
    return dict(out, dispatcher=par.moe_token_dispatcher_type, backend=par.moe_flex_dispatcher_backend,
                sm_slow=slow, shared_overlap=par.moe_shared_expert_overlap, static_ep=static)


ROUTER_BYTES = {"fp32": 4, "fp64": 8}  # moe_router_dtype


def _ub_slow(par: ParallelSpec | None, t: int, sp: bool, mla: bool, sm_count: int) -> float:
    """LayerShape.ub_slow: 0 without Userbuffers (tp_comm_overlap off, tp 1, no sequence parallelism, or MLA:
    see "Userbuffers"), else how much longer a GEMM runs on sm_count − UB_COMM_SMS SMs (1 with no SM count)."""
    if par is None or not par.tp_comm_overlap or t == 1 or not sp or mla:
        return 0.0
    return sm_count / (sm_count - UB_COMM_SMS) if sm_count > UB_COMM_SMS else 1.0


def _ub_cfg(par: ParallelSpec | None, sm_count: int) -> tuple[tuple[str, str, float, int], ...]:
    """LayerShape.ub_cfg: each GEMM of the scenario's NeMo Userbuffers configuration (tp_comm_overlap_cfg) as
    (name, method, sm_count/(sm_count − num_sm) where set_sm_margin else 1, num_splits); () without one."""
    if par is None or not par.tp_comm_overlap_cfg:
        return ()
    from emulator.scenario.ub_configs import configs

    out = []
    for name, g in configs()[par.tp_comm_overlap_cfg].items():
        slow = sm_count / (sm_count - g.num_sm) if g.set_sm_margin and sm_count > g.num_sm else 1.0
        out.append((name, g.method, slow, g.num_splits))
    return tuple(out)


def unquantised(L: LayerShape) -> LayerShape:
    """The same layer in BF16 (Megatron's first and last BF16 layers of a quantised run)."""
    return replace(L, fp8=False, recipe="", non_tn=False, fp8_weight_bytes=0.0, fp8_dpa=False, fp8_head=False,
                   fused_mlp=False)


def dense_shape(L: LayerShape) -> LayerShape:
    """The same layer with a dense MLP (a leading dense layer of an MoE model)."""
    return replace(L, experts=0, top_k=0, expert_ffn=0, shared_ffn=0, imbalance=1.0)


def part_shape(L: LayerShape, parts: str) -> LayerShape:
    """The layer that runs ``parts`` (workload/hybrid.py's symbols) of ``L``: a hybrid model's layer; without an
    E part it has no experts."""
    return replace(L if hybrid.MOE in parts else dense_shape(L), parts=parts)


def _dsa_fields(m: ModelSpec) -> dict[str, Any]:
    """DeepSeek Sparse Attention's LayerShape fields (sparse_attention.py); none without it."""
    return _indexer_fields(m) if is_dsa(m) else {}


def _indexer_fields(m: ModelSpec) -> dict[str, Any]:
    """The lightning indexer's LayerShape fields (DSA's, DeepSeek-V4's CSA layers'): its heads and head dim, the
    keys a query attends, and its loss: 0 none, 1 over the top-k keys, 2 over every key."""
    loss = 0 if m.dsa_indexer_loss_coeff <= 0 else 1 if m.dsa_indexer_use_sparse_loss else 2
    return dict(dsa_heads=m.dsa_indexer_n_heads, dsa_dim=m.dsa_indexer_head_dim, dsa_topk=m.dsa_indexer_topk,
                dsa_loss=loss)


def _dsv4_fields(m: ModelSpec) -> dict[str, Any]:
    """DeepSeek-V4's attention's LayerShape fields (compressed_attention.py) at models.attention_ratio (attention_shape
    gives a layer its own); none without dsv4_hybrid."""
    if not is_dsv4(m):
        return {}
    return dict(dsv4=True, csa=attention_ratio(m), csa_window=m.csa_window_size, o_groups=m.o_groups,
                o_rank=m.o_lora_rank, q_rank=m.q_lora_rank, rope_dim=m.qk_rope_head_dim, **_indexer_fields(m))


def attention_shape(L: LayerShape, m: ModelSpec, layer: int) -> LayerShape:
    """``L`` with layer ``layer``'s own attention: a dsv4_hybrid layer's compression ratio, a DSA layer that reuses
    an earlier one's top-k (models.dsa_skips); ``L`` itself where the layers do not differ."""
    if L.dsv4:
        return replace(L, csa=compress_ratio(m, layer))
    return replace(L, dsa_skip=dsa_skips(m, layer)) if L.dsa_topk else L


def _hc_fields(m: ModelSpec) -> dict[str, Any]:
    """mHC's LayerShape fields (hyper_connection.py); none without enable_mhc_connections."""
    if not m.enable_mhc_connections:
        return {}
    return dict(hc=m.mhc_num_residual_streams, hc_iters=m.mhc_sinkhorn_iterations, hc_fused=m.use_fused_mhc)


def _mixer_fields(m: ModelSpec) -> dict[str, Any]:
    """LayerShape's Mamba-2 mixer and gated delta net sizes of a hybrid model with M or G layers; {} otherwise."""
    out: dict[str, Any] = {}
    if hybrid.GDN in m.hybrid_layer_pattern:
        dd = hybrid.delta_dims(m)
        out = dict(g_key_heads=dd.key_heads, g_value_heads=dd.value_heads, g_key_dim=dd.key_dim,
                   g_value_dim=dd.value_dim, g_conv=dd.conv)
    if hybrid.MAMBA not in m.hybrid_layer_pattern:  # in the decoder or an MTP depth
        return out
    md = hybrid.mamba_dims(m)
    return dict(out, m_heads=md.heads, m_head_dim=md.head_dim, m_groups=md.groups, m_state=md.state)


# --- quantisation (the kernels' constructors are steps.py's) -----------------------------------------

AMAX_HISTORY_BYTES = 2 * 4 * 1024  # read and write 1024 fp32 amaxes (TE's default amax_history_len)
RHT_FLOPS = 32.0  # a 16×16 random Hadamard transform: 16 multiply-adds per element


def _with_category(steps: list[Step], cat: str) -> list[Step]:
    return [replace(st, category=cat) for st in steps]




def recipe_of(precision: str, fp8_recipe: str = "") -> str:
    """The quantisation recipe of ``training.precision`` (``training.fp8_recipe`` for fp8): delayed |
    tensorwise | blockwise | mxfp8 | nvfp4; "" for an unquantised precision."""
    if precision == "fp8":
        return fp8_recipe or "delayed"
    return precision if precision in ("mxfp8", "nvfp4") else ""


def weight_quant_bytes(recipe: str, non_tn: bool, fp8_params: bool) -> float:
    """Bytes per weight element of the step's weight quantisation (made at the first micro-batch: TE's
    ``update_ws = is_first_microbatch``). Per-tensor FP8: read 2, write 1 and, on Hopper, its transpose 1
    (fp8 weights, ``fp8_params``: only the transpose, read 1 write 1; none on Blackwell); tensorwise adds
    the amax pass (read 2). MXFP8: read 2, write both copies. NVFP4: an amax pass, then read 2 and write
    both 16×16-block copies."""
    if recipe == "mxfp8":
        return 2.0 + 2 * MXFP8_COPY
    if recipe == "blockwise":  # both copies from the bf16 weight (ASSUMPTION: as MXFP8's, fp8 weights or not)
        return 2.0 + 2 * BLOCK_WEIGHT_COPY
    if recipe == "nvfp4":  # fp4_param (passed as fp8_params): the column-wise copy made from the gathered row-wise
        return 2 * NVFP4_WEIGHT_COPY if fp8_params else 2.0 + 2.0 + 2 * NVFP4_WEIGHT_COPY
    if fp8_params:
        return 0.0 if non_tn else 2.0
    return (3.0 if non_tn else 4.0) + (2.0 if recipe == "tensorwise" else 0.0)


def _quant_kernels(name: str, elements: float, tensors: int, cat: str, L: LayerShape, gathered_over: int = 1,
                   grad: bool = False) -> list[Step]:
    """The kernels (and, with sequence parallelism, the amax all-reduce) that quantise one activation or
    gradient of ``elements`` for its GEMMs, by ``L.recipe`` (see the module docstring, "Recipes"). A tensor
    that sequence parallelism all-gathers (``gathered_over`` = t) is quantised on the local shard and
    gathered quantised; only the per-tensor FP8 transpose of Hopper is made after the gather (linear.py
    lines 378-398: "All-gather is not supported with FP8 column-wise data"). ``tensors``: the quantised
    tensors whose amax histories the delayed recipe updates in this kernel."""
    local = 1.0 / gathered_over
    sp = gathered_over > 1
    r = L.recipe
    steps: list[Step] = []
    if r in ("tensorwise", "nvfp4"):  # amax pass (nvte_compute_amax; NVFP4: of the input and its RHT)
        steps.append(Kernel(f"{name}_amax", "cast", elements * (1 + (RHT_FLOPS if r == "nvfp4" else 0)),
                            2.0 * elements * local, cat))
        if sp:  # amax all-reduce (MAX) over the TP group: quantizer.cpp, amax_reduction_group
            steps.append(Comm(f"{name}_amax_ar", "tp", "all_reduce", 8.0 if r == "nvfp4" else 4.0, 0, cat))
    if r == "mxfp8":
        steps.append(Kernel(name, "cast", elements, (2.0 + 2 * MXFP8_COPY) * elements * local, cat))
    elif r == "blockwise":  # both copies from the high-precision tensor, block scales found in the same pass
        steps.append(Kernel(name, "cast", elements, (2.0 + 2 * BLOCK_COPY) * elements * local, cat))
    elif r == "nvfp4":  # rowwise; column-wise of the RHT'd tensor, stochastically rounded for gradients
        steps.append(Kernel(name, "cast", elements * (1 + RHT_FLOPS + (1 if grad else 0)),
                            (2.0 + 2 * NVFP4_COPY) * elements * local, cat))
    else:
        transpose = 0.0 if L.non_tn else 2.0 if sp else 1.0
        history = tensors * AMAX_HISTORY_BYTES if r == "delayed" else 0.0
        steps.append(Kernel(name, "cast", elements, 3.0 * elements * local + transpose * elements + history, cat))
    return steps


def _gathered(out: list[Step], L: LayerShape) -> int:
    """t when the GEMM about to be appended reads a sequence-parallel all-gather, else 1."""
    last = out[-1] if out else None
    return L.t if isinstance(last, Comm) and last.collective == "all_gather" and last.overlap == 0 else 1


def _insert(out: list[Step], casts: list[Step]) -> None:
    """Append ``casts`` ahead of the GEMM about to be appended; ahead of the communications that
    overlap it too, so that their overlap windows still cover the GEMM (a cast precedes them)."""
    at = len(out)
    while at > 0:
        prev = out[at - 1]
        if not (isinstance(prev, Comm) and prev.overlap > 0):
            break
        at -= 1
    out[at:at] = casts


def fp8_forward_casts(steps: list[Step], L: LayerShape) -> list[Step]:
    """Before each forward quantised GEMM: its input's quantisation and (not in a recompute) its weight's,
    once per step (``L.fp8_weight_bytes`` per element per micro-batch)."""
    out: list[Step] = []
    for st in steps:
        if isinstance(st, Kernel) and st.kind == "gemm" and st.dtype == 1:
            casts = _quant_kernels(f"{st.name}.fp8_cast_x", float(st.m * st.k * st.batch), 3, st.category, L,
                                   _gathered(out, L))
            if L.fused_mlp and f"{st.name}.fp8_cast_x" in _FUSED_MLP_SKIPS:  # fc1's epilogue quantised it
                casts = []
            if st.category != RECOMPUTE and L.fp8_weight_bytes > 0:
                w = float(st.n * st.k * st.batch)
                casts.append(Kernel(f"{st.name}.fp8_cast_w", "cast", w / 4.0 * L.fp8_weight_bytes,
                                    w * L.fp8_weight_bytes, st.category))
            _insert(out, casts)
        out.append(st)
    return out


def fp8_backward_casts(steps: list[Step], L: LayerShape) -> list[Step]:
    """Before each quantised dgrad GEMM: the quantisation of the output gradient (m × its k elements)."""
    out: list[Step] = []
    for st in steps:
        if isinstance(st, Kernel) and st.kind == "gemm" and st.dtype == 1 and st.name.endswith(".dgrad") \
                and not (L.fused_mlp and f"{st.name[:-6]}.fp8_cast_dy" in _FUSED_MLP_SKIPS):
            _insert(out, _quant_kernels(f"{st.name[:-6]}.fp8_cast_dy", float(st.m * st.k * st.batch), 2, BWD, L,
                                        _gathered(out, L), grad=True))
        out.append(st)
    return out


# The sequence-parallel all-gathers of Transformer Engine's linear layers carry the quantised tensor: the
# forward quantises ln_out on the local shard and gathers it row-wise (layernorm_linear.py @ d0067d0da, lines
# 283-315: gather_along_first_dim(..., quantizer=quantizer)), the backward gathers the quantised output gradient
# and, for the weight gradient, the quantised input (linear.py lines 955-1000, grad_output_preprocess). Each element
# is then its recipe's bytes: 1 (per-tensor FP8), MXFP8_COPY, NVFP4_COPY, for one copy; the output gradient of the
# block-scaled recipes goes in both copies, row-wise for dgrad and column-wise for wgrad (linear.py line 905,
# set_usage(rowwise=True, columnwise=True)), while per-tensor FP8 gathers the row-wise one and transposes it
# (supports_only_rowwise_all_gather). The MoE layer's and MLA's gathers are Megatron's own, of the bf16
# activations (gather_from_sequence_parallel_region), and keep their bytes.
_TE_GATHERS = {"ln1.ag": "qkv", "ln2.ag": "mlp.up", "proj.ag_grad": "proj.dgrad", "mlp.down.ag_grad": "mlp.down.dgrad",
               "qkv.ag_input": "qkv.wgrad", "mlp.up.ag_input": "mlp.up.wgrad", "mamba.ln.ag": "mamba.in_proj",
               "mamba.out_proj.ag_grad": "mamba.out_proj.dgrad", "mamba.in_proj.ag_input": "mamba.in_proj.wgrad"}
_QUANT_BYTES = {"fp8": 1.0, "mxfp8": MXFP8_COPY, "nvfp4": NVFP4_COPY}


def quantised_gathers(steps: list[Step], L: LayerShape) -> list[Step]:
    """``steps`` with each TE linear layer's SP all-gather at the quantised size of the GEMM it feeds (above)."""
    gemms = {st.name: st for st in steps if isinstance(st, Kernel) and st.kind == "gemm"}
    out: list[Step] = []
    for st in steps:
        k = gemms.get(_TE_GATHERS.get(st.name, ""))
        if isinstance(st, Comm) and st.collective == "all_gather" and k is not None and k.dtype == 1:
            copies = 2 if st.name.endswith(".ag_grad") and k.quant in ("mxfp8", "nvfp4") else 1
            st = replace(st, bytes=st.bytes / L.dtype * _QUANT_BYTES[k.quant or "fp8"] * copies)
        out.append(st)
    return out


# --- forward ---------------------------------------------------------------------------

def _tp_in(L: LayerShape, name: str, cat: str) -> list[Step]:
    """Entering a column-parallel GEMM: SP all-gathers the sharded activations (blocking)."""
    if L.t > 1 and L.sp:
        return [Comm(f"{name}.ag", "tp", "all_gather", L.T * L.h * L.dtype, 0, cat)]
    return []


def _tp_out(L: LayerShape, name: str, cat: str) -> list[Step]:
    """Leaving a row-parallel GEMM: all-reduce (SP: reduce-scatter) of the T×h output."""
    if L.t == 1:
        return []
    op = "reduce_scatter" if L.sp else "all_reduce"
    return [Comm(f"{name}.{'rs' if L.sp else 'ar'}", "tp", op, L.T * L.h * L.dtype, 0, cat)]


def _bda(L: LayerShape, name: str, cat: str) -> Kernel:
    passes = 3.5 if L.dropout else 3.0  # read x, residual; write y (+ 1-byte mask)
    return elementwise(name, L.Te * L.h, passes, L, 3.0 if L.dropout else 1.0, cat)


def _norm(L: LayerShape, name: str, cat: str) -> Kernel:
    return elementwise(name, L.Te * L.h, 2.0, L, 8.0, cat)


def _pre(L: LayerShape, block: str, name: str, cat: str) -> list[Step]:
    """A block's entry: its pre-norm, after mHC's mappings and aggregate where the model has them."""
    return [*(HC.pre(L, block, cat) if L.hc else []), _norm(L, name, cat)]


def _post(L: LayerShape, block: str, name: str, cat: str) -> list[Step]:
    """A block's exit: the bias-dropout-add into the residual, or mHC's residual mix."""
    return HC.post(L, block, cat) if L.hc else [_bda(L, name, cat)]


# Context parallelism by all-to-all (parallel.cp_comm_type a2a; DeepSpeed-Ulysses), as Transformer Engine runs it
# (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py @ d0067d0da,
# AttnFuncWithCPAndQKVOA2A, lines 4170-4840): forward, one all-to-all over the CP group turns this rank's Q, K and V
# (its s tokens, all of its heads) into the whole sequence of heads/cp of them (flash_attn_a2a_communicate, line
# 4339), the fused attention runs on that, and one all-to-all turns its output back (line 4485); backward, an
# all-to-all of the output gradient (line 4677), the attention's backward, an all-to-all of dQ, dK and dV (line
# 4837). Each all-to-all's buffer S is this rank's tensor; (cp − 1)/cp of it leaves.


def _ulysses(L: LayerShape) -> LayerShape:
    """The attention an a2a CP rank runs: the whole sequence, heads/cp of its heads (the head dims kept)."""
    return replace(L, s=L.s_kv, cp=1, heads=L.heads // L.cp, kv_heads=max(1, L.kv_heads // L.cp),
                   head=L.head or L.d, cp_a2a=False)


def _qkv_elements(L: LayerShape) -> int:
    """Elements of this rank's Q, K and V: T tokens of a_l query heads and kv_l key and value heads."""
    return L.T * (L.a_l * L.d_qk + L.kv_l * (L.d_qk + L.d_v))


def _a2a_core(L: LayerShape, backward: bool, cat: str) -> list[Step]:
    """The attention core of an a2a CP rank (above): an all-to-all in, the fused kernel, an all-to-all out."""
    U = _ulysses(L)
    qkv, out = _qkv_elements(L) * L.dtype, L.T * L.a_l * L.d_v * L.dtype
    suffix = "_bwd" if backward else ""
    steps: list[Step] = [Comm(f"attn.a2a_{'dout' if backward else 'qkv'}", "cp", "all_to_all",
                              out if backward else qkv, 0, cat),
                         flash(f"attn.flash{suffix}", U, U.s, backward, cat)]
    if L.sinks:
        steps.append(elementwise(f"attn.sinks{suffix}", U.b * U.a_l * U.s, 2.0, U, 2.0, cat))
    return steps + [Comm(f"attn.a2a_{'dqkv' if backward else 'out'}", "cp", "all_to_all",
                         qkv if backward else out, 0, cat)]


# Hierarchical context parallelism (parallel.cp_comm_type a2a+p2p), as Transformer Engine runs it
# (context_parallel.py @ d0067d0da, AttnFuncWithCPAndKVP2P with cp_group [a2a, p2p]): forward, an all-to-all over
# the first level (a consecutive CP ranks, parallel_state.py create_hierarchical_groups) turns this rank's s
# tokens of all its heads into a·s tokens of heads/a (line 1492), the K/V ring runs over the second level (the
# ranks a apart: send_dst cp_global_ranks[(rank + 1) % cp_size · cp_size_a2a + rank_a2a], line 1418) with a step
# per block, and an all-to-all turns the output back (line 2034); backward, an all-to-all of the output gradient
# (line 2411), the ring's backward, an all-to-all of dQ, dK and dV (line 2895). The ring's K/V block holds as
# many elements as this rank's own K and V (a·s tokens of kv/a heads).


def _a2a_p2p_core(L: LayerShape, backward: bool, cat: str) -> list[Step]:
    """The attention core under a2a+p2p CP (above): the all-to-all in, the ring over cp/a ranks, the all-to-all out."""
    a = L.cp_hier
    U = replace(L, s=L.s * a, cp=L.cp // a, heads=L.heads // a, kv_heads=max(1, L.kv_heads // a),
                head=L.head or L.d, cp_hier=0)
    qkv, out = _qkv_elements(L) * L.dtype, L.T * L.a_l * L.d_v * L.dtype
    into, back = ("dout", "dqkv") if backward else ("qkv", "out")
    ring = attention_core_backward(U) if backward else attention_core_forward(U, cat)
    return [Comm(f"attn.a2a_{into}", "cp_a2a", "all_to_all", out if backward else qkv, 0, cat), *ring,
            Comm(f"attn.a2a_{back}", "cp_a2a", "all_to_all", qkv if backward else out, 0, cat)]


# Context parallelism by all-gather (parallel.cp_comm_type all_gather), as Transformer Engine runs it
# (context_parallel.py @ d0067d0da, AttnFuncWithCPAndKVAllGather, line 3014: "KV all-gather between CP ranks is
# exposed"; the Llama 3 paper's section 3.3.2): forward, K and V all-gathered over the CP group
# (gather_along_first_dim, lines 3215-3216); this rank's queries are two chunks of c = s/2 tokens, chunks r and
# 2cp − 1 − r of the load-balanced order (local_seq_chunk_ids, line 3254), each attending the keys up to its own,
# causal within its own chunk (bottom-right aligned); backward, K and V gathered again (lines 3788-3789), the
# attention's backward, dK and dV reduce-scattered (lines 4107-4108). Costed as rank 0's chunks: chunk 0 (c
# keys, causal) and chunk 2cp − 1 (2cp − 1 chunks whole and its own causal): 2cp·c² causal-equivalent pairs,
# the ring's. Without a causal mask every query attends the whole sequence.


def _ag_core(L: LayerShape, backward: bool, cat: str) -> list[Step]:
    """The attention core under all-gather CP (above): the K/V all-gather, the chunks' kernels, and backward the
    dK/dV reduce-scatter."""
    c = L.s // 2
    C = replace(L, s=c, cp=1, cp_ag=False)  # a chunk of this rank's queries
    suffix = "_bwd" if backward else ""
    if L.causal:
        kernels = [flash(f"attn.flash0{suffix}", C, c, backward, cat),
                   flash(f"attn.flash1{suffix}", replace(C, causal=False), (2 * L.cp - 1) * c, backward, cat),
                   flash(f"attn.flash2{suffix}", C, c, backward, cat)]
    else:
        kernels = [flash(f"attn.flash{suffix}", replace(L, cp=1, cp_ag=False), L.s_kv, backward, cat)]
    if L.sinks:
        kernels.append(elementwise(f"attn.sinks{suffix}", L.b * L.a_l * L.s, 2.0, L, 2.0, cat))
    gathered = L.cp * L.b * L.s * L.kv_l * (L.d_qk + L.d_v) * L.dtype  # every rank's K and V (nccl-tests S)
    steps: list[Step] = [Comm(f"attn.kv_ag{suffix}", "cp", "all_gather", gathered, 0, cat), *kernels]
    if backward:
        steps.append(Comm("attn.dkv_rs", "cp", "reduce_scatter", gathered, 0, cat))
    return steps


def _cp_core(L: LayerShape, backward: bool, cat: str) -> list[Step] | None:
    """The attention core under a CP communication other than the ring (cp_comm_type a2a, a2a+p2p or all_gather),
    forward or backward; None under the ring (or without CP)."""
    for on, core in ((L.cp_a2a, _a2a_core), (L.cp_hier, _a2a_p2p_core), (L.cp_ag, _ag_core)):
        if on:
            return core(L, backward, cat)
    return None


# Transformer Engine's FP8 attention (training.fp8_dot_product_attention; TE's fp8_dpa without fp8_mha,
# transformer_engine/common/recipe/__init__.py @ TE HEAD: "DPA casts the inputs from higher precision to FP8, performs
# attention in FP8, and casts tensors back to higher precision as outputs"): forward, Q, K and V to FP8 and the
# output back; backward, the output's gradient to FP8 and those of Q, K and V back. Each cast reads 2 bytes and
# writes 1 (or reads 1 and writes 2) an element, at the bandwidth measured for a cast (kernel_cost.py "cast").
def _dpa_casts(L: LayerShape, backward: bool, cat: str) -> tuple[list[Step], list[Step]]:
    """(before, after) the fused attention kernels of one pass: TE's FP8 casts with fp8_dpa; nothing otherwise."""
    if not L.fp8_dpa:
        return [], []
    tokens = L.b * L.s
    qkv = tokens * (L.a_l * L.d_qk + L.kv_l * (L.d_qk + L.d_v))
    out = tokens * L.a_l * L.d_v
    first, then = (out, qkv) if backward else (qkv, out)
    names = ("attn.fp8_cast_do", "attn.fp8_cast_dqkv") if backward else ("attn.fp8_cast_qkv", "attn.fp8_cast_o")
    return ([Kernel(names[0], "cast", first, 3.0 * first, cat)], [Kernel(names[1], "cast", then, 3.0 * then, cat)])


def _ring_bytes(L: LayerShape) -> int:
    """Bytes an element of K, V (and their gradients) take in the CP ring: FP8 with per-tensor FP8 attention (TE
    context_parallel.py ``AttnFuncWithCPAndKVP2P``: not under MXFP8, ``q, k, v = [q_fp8._data, ...]`` forward,
    ``kv_fp8._data`` and uint8 dK/dV buffers backward), else the activations' type."""
    return 1 if L.fp8_dpa and L.recipe != "mxfp8" else L.dtype


def attention_core_forward(L: LayerShape, cat: str = FWD) -> list[Step]:
    """Unfused: QKᵀ, softmax, dropout, PV. Fused: one flash kernel per CP ring step (with a2a CP: one on the
    whole sequence between two all-to-alls; with a2a+p2p, the ring between them; with all_gather, the query
    chunks' kernels after the K/V all-gather); with FP8 attention, TE's casts around them (:func:`_dpa_casts`)."""
    before, after = _dpa_casts(L, False, cat)
    return [*before, *_attention_core_forward(L, cat), *after]


def _attention_core_forward(L: LayerShape, cat: str) -> list[Step]:
    other = _cp_core(L, False, cat)
    if other is not None:
        return other
    if L.fused_attention:
        steps: list[Step] = []
        kv_block = L.b * L.s * L.kv_l * (L.d_qk + L.d_v) * _ring_bytes(L)  # K and V of this rank's tokens
        for i in range(L.cp):
            if i < L.cp - 1:
                steps.append(Comm(f"attn.kv_ring{i}", "cp", "ring", kv_block, 1, cat))
            steps.append(flash(f"attn.flash{i}" if L.cp > 1 else "attn.flash", L, L.s, False, cat))
        if L.sinks:  # the sink's logit in each row's softmax: one exp and add per (query, head) over its stats
            steps.append(elementwise("attn.sinks", L.b * L.a_l * L.s, 2.0, L, 2.0, cat))
        return steps
    bh = L.b * L.a_l
    scores = bh * L.s * L.s_kv
    steps = [gemm("attn.qk", L.s, L.s_kv, L.d_qk, L, bh, cat),
             elementwise("attn.softmax", scores, 2.0, L, 5.0, cat)]
    if L.dropout:
        steps.append(elementwise("attn.dropout", scores, 2.5, L, 2.0, cat))
    steps.append(gemm("attn.pv", L.s, L.d_v, L.s_kv, L, bh, cat))
    return steps


def _sp_gather(L: LayerShape, name: str, width: int, cat: str) -> list[Step]:
    """SP: all-gather T tokens of ``width`` elements ahead of a column-parallel GEMM (blocking)."""
    if L.t > 1 and L.sp:
        return [Comm(f"{name}.ag", "tp", "all_gather", L.T * width * L.dtype, 0, cat)]
    return []


def _mla_projections(L: LayerShape, cat: str) -> list[Step]:
    """MLA's query and key/value projections with their latent norms, and the decoupled rope."""
    steps: list[Step] = []
    if L.q_rank:
        steps += [gemm("q_down", L.Te, L.q_rank, L.h, L, 1, cat),
                  elementwise("q_norm", L.Te * L.q_rank, 2.0, L, 8.0, cat), *_sp_gather(L, "q_up", L.q_rank, cat),
                  gemm("q_up", L.T, L.a_l * L.d_qk, L.q_rank, L, 1, cat)]
    else:
        steps += [*_sp_gather(L, "q", L.h, cat), gemm("q", L.T, L.a_l * L.d_qk, L.h, L, 1, cat)]
    steps += [gemm("kv_down", L.Te, L.kv_rank + L.rope_dim, L.h, L, 1, cat),
              elementwise("kv_norm", L.Te * L.kv_rank, 2.0, L, 8.0, cat)]
    if L.dsa_topk:  # absorbed MLA (sparse_attention.py): the latent key gathered whole, no kv_up
        steps += [*_sp_gather(L, "kv", L.kv_rank + L.rope_dim, cat), sparse_attention.q_absorb(L, cat)]
    else:
        steps += [*_sp_gather(L, "kv_up", L.kv_rank + L.rope_dim, cat),
                  gemm("kv_up", L.T, L.a_l * (L.d_qk - L.rope_dim + L.d_v), L.kv_rank, L, 1, cat)]
    if L.rope_dim:
        steps.append(elementwise("rope", L.T * (L.a_l + 1) * L.rope_dim, 2.0, L, 3.0, cat))
    return steps


def _attention_forward(L: LayerShape, cat: str) -> list[Step]:
    if L.dsv4:
        return _dsv4_forward(L, cat)
    steps: list[Step] = [*_pre(L, "attn", "ln1", cat), *([] if L.mla else _tp_in(L, "ln1", cat))]
    if L.mla:
        steps += _mla_projections(L, cat)
    else:
        steps.append(gemm("qkv", L.T, L.qkv_n, L.h, L, 1, cat))
    if L.rope and not L.mla:  # rotary embeddings on q and k
        steps.append(elementwise("rope", L.T * (L.a_l + L.kv_l) * L.d, 2.0, L, 3.0, cat))
    if L.kv_l < L.a_l and not L.fused_attention and not L.dsa_topk:  # unfused GQA expands K, V to every head
        steps.append(elementwise("kv_expand", L.T * L.d * (L.kv_l + L.a_l), 2.0, L, 0.0, cat))
    if L.dsa_topk:
        steps += [*sparse_attention.core_forward(L, cat), sparse_attention.v_up(L, cat)]
    else:
        steps += attention_core_forward(L, cat)
    if L.out_gate:  # attention_output_gate: the output times the gate's sigmoid (read both, write one)
        steps.append(elementwise("attn_gate", L.T * L.a_l * L.d_v, 3.0, L, 5.0, cat))
    steps.append(elementwise("ctx_copy", L.T * L.a_l * L.d_v, 2.0, L, 0.0, cat))
    steps += [gemm("proj", L.T, L.h, L.a_l * L.d_v, L, 1, cat), *_tp_out(L, "proj", cat),
              *_post(L, "attn", "bda1", cat)]
    return steps


def _dsv4_forward(L: LayerShape, cat: str) -> list[Step]:
    """DeepSeek-V4's attention block (compressed_attention.py): q_a (replicated, on Te tokens) and its norm, [SP
    all-gather of the query latent], q_b (column-parallel) and its weightless per-head norm, kv_proj (replicated) and
    its norm, [SP all-gather of the key], the rope on the query heads and the key, the compressor, indexer and sparse
    core, the grouped o_a (a_l·D/g_l → o_lora_rank for each of this rank's g_l = o_groups/t groups) and o_b, the
    row-parallel projection."""
    g_l = L.o_groups // L.t
    return [*_pre(L, "attn", "ln1", cat), gemm("q_a", L.Te, L.q_rank, L.h, L, 1, cat),
            elementwise("q_a_norm", L.Te * L.q_rank, 2.0, L, 8.0, cat), *_sp_gather(L, "q_b", L.q_rank, cat),
            gemm("q_b", L.T, L.a_l * L.d, L.q_rank, L, 1, cat),
            elementwise("q_b_norm", L.T * L.a_l * L.d, 2.0, L, 4.0, cat), gemm("kv_proj", L.Te, L.d, L.h, L, 1, cat),
            elementwise("kv_norm", L.Te * L.d, 2.0, L, 8.0, cat), *_sp_gather(L, "kv", L.d, cat),
            elementwise("rope", L.T * (L.a_l + 1) * L.rope_dim, 2.0, L, 3.0, cat),
            *compressed_attention.core_forward(L, cat), gemm("o_a", L.T, L.o_rank, L.a_l * L.d // g_l, L, g_l, cat),
            gemm("proj", L.T, L.h, g_l * L.o_rank, L, 1, cat), *_tp_out(L, "proj", cat),
            *_post(L, "attn", "bda1", cat)]


def _dsv4_backward(L: LayerShape) -> list[Step]:
    """DeepSeek-V4's attention block backward, :func:`_dsv4_forward` reversed; the shared key's gradient is summed
    over TP (each rank's heads give a part: reduce-scattered with SP, else all-reduced) under its norm's backward."""
    g_l = L.o_groups // L.t
    steps: list[Step] = [*_post_backward(L, "attn", "bda1_bwd"), *_grad_gather(L, "proj"),
                         *linear_backward(L, "proj", L.T, L.h, g_l * L.o_rank),
                         *linear_backward(L, "o_a", L.T, L.o_rank, L.a_l * L.d // g_l, g_l),
                         *compressed_attention.core_backward(L),
                         elementwise("rope_bwd", L.T * (L.a_l + 1) * L.rope_dim, 2.0, L, 3.0, BWD)]
    if L.t > 1:
        op = "reduce_scatter" if L.sp else "all_reduce"
        steps.append(Comm(f"kv.{'rs' if L.sp else 'ar'}_dgrad", "tp", op, L.T * L.d * L.dtype, 1, BWD))
    return steps + [elementwise("kv_norm_bwd", L.Te * L.d, 3.0, L, 10.0, BWD),
                    *linear_backward(L, "kv_proj", L.Te, L.d, L.h),
                    elementwise("q_b_norm_bwd", L.T * L.a_l * L.d, 3.0, L, 6.0, BWD),
                    *_column_backward(L, "q_b", L.T, L.a_l * L.d, L.q_rank, L.q_rank),
                    elementwise("q_a_norm_bwd", L.Te * L.q_rank, 3.0, L, 10.0, BWD),
                    *linear_backward(L, "q_a", L.Te, L.q_rank, L.h), *_pre_backward(L, "attn", "ln1")]


def _moe_sizes(L: LayerShape) -> tuple[int, int, int, float]:
    """(routed token copies, local experts, tokens per local expert, all-to-all bytes) of the busiest rank.
    The all-to-all's S is one rank's routed copies (times the capacity factor when padded): the busiest
    receiver's larger share is the plan's (network/dispatch.py), not every rank's."""
    routed = L.T * L.top_k  # token copies this rank sends (and, balanced, receives)
    local = max(1, L.experts // L.ep)
    load = L.rank_load
    received = routed if load == 1.0 else int(round(routed * load))
    m_e = max(1, received // local) + round(L.pad_rows)  # tokens per local expert (quantised: aligned)
    return routed, local, m_e, routed * L.hx * L.dtype * L.a2a_scale


def _shared_forward(L: LayerShape, cat: str) -> list[Step]:
    """The shared experts: one TP-sharded MLP of their summed width over every token."""
    if not L.shared_ffn:
        return []
    f_l = L.shared_ffn // L.t
    up = 2 * f_l if L.swiglu else f_l
    return [gemm("shared.up", L.T, up, L.h, L, 1, cat), _act_forward(L, cat, L.T, f_l, "shared."),
            gemm("shared.down", L.T, L.h, f_l, L, 1, cat)]


def _mlp_core_forward(L: LayerShape, cat: str) -> list[Step]:
    if not L.experts:
        act = _act_forward(L, cat)
        return [gemm("mlp.up", L.T, L.up_n, L.h, L, 1, cat), act, gemm("mlp.down", L.T, L.h, L.f_l, L, 1, cat)]
    routed, local, m_e, a2a = _moe_sizes(L)
    fe = L.fe_l
    shared = _shared_forward(L, cat)
    first, second = shared_split(L, shared)
    steps: list[Step] = [*route_and_permute(L, L.T, routed, cat), *(shared if not first else [])]
    steps += dispatch_steps(L, L.T, a2a, cat, first)
    act = _act_forward(L, cat, m_e * local if L.rank_load != 1.0 or L.pad_rows else routed, fe)
    steps += chunk_sort(L, "moe.sort_chunks", m_e * local, cat) + expert_padding(L, m_e * local, cat, True)
    steps += _experts_forward(L, m_e, local, act, cat)
    steps += expert_padding(L, m_e * local, cat, False) + chunk_sort(L, "moe.unsort_chunks", m_e * local, cat)
    steps += combine_steps(L, L.T, a2a, cat, second)
    steps += unpermute(L, routed, cat) + latent_up(L, L.T, cat)
    return steps


def _mlp_forward(L: LayerShape, cat: str) -> list[Step]:
    if L.folded:
        return [*_pre(L, "mlp", "ln2", cat), *_folded_moe_forward(L, cat), *_post(L, "mlp", "bda2", cat)]
    return [*_pre(L, "mlp", "ln2", cat), *_tp_in(L, "ln2", cat), *_mlp_core_forward(L, cat),
            *_tp_out(L, "mlp", cat), *_post(L, "mlp", "bda2", cat)]


# --- MoE parallel folding (parallel.etp other than tp) --------------------------------------
# Megatron-Core's MoE layer with the alltoall dispatcher (megatron/core/transformer/moe/token_dispatcher.py
# @ d98e8a64dd, MoEAlltoAllTokenDispatcher): the router runs on this rank's Te sequence-parallel tokens,
# which are permuted and sent over the EP group (all-to-all), then gathered over the expert
# tensor-parallel group (``dispatch_postprocess``: gather_from_sequence_parallel_region over tp_group,
# the ETP group) for the local experts' grouped GEMMs of width f_e/etp; the way back is a reduce-scatter
# over ETP (``combine_preprocess``) and the all-to-all. No TP communication wraps the routed experts;
# the shared experts are TP-sharded and all-gather / reduce-scatter the sequence over the attention's
# TP group (shared_experts.py, gather_from_sequence_parallel_region / reduce_scatter_to_sequence_parallel_region).

def _folded_sizes(L: LayerShape) -> tuple[int, int, int, float]:
    """(routed copies of this rank's tokens, local experts, tokens per local expert after the ETP
    gather, all-to-all bytes) of the busiest rank (S as :func:`_moe_sizes`)."""
    routed = L.Te * L.top_k
    local = max(1, L.experts // L.ep)
    load = L.rank_load
    received = routed if load == 1.0 else int(round(routed * load))
    m_e = max(1, received * L.etp // local) + round(L.pad_rows)
    return routed, local, m_e, routed * L.hx * L.dtype * L.a2a_scale


def _etp(L: LayerShape, name: str, collective: str, nbytes: float, cat: str) -> list[Step]:
    return [Comm(name, "etp", collective, nbytes, 0, cat)] if L.etp > 1 else []


def _folded_moe_forward(L: LayerShape, cat: str) -> list[Step]:
    routed, local, m_e, a2a = _folded_sizes(L)
    fe = L.fe_l
    gathered = m_e * local * L.hx * L.dtype  # the ETP all-gather's output (nccl-tests S)
    shared = _shared_forward(L, cat) if L.shared_ffn else []
    first, second = shared_split(L, shared)
    steps: list[Step] = route_and_permute(L, L.Te, routed, cat)
    if L.shared_ffn:
        steps += _tp_in(L, "shared", cat) + (shared + _tp_out(L, "shared", cat) if not first else [])
    steps += dispatch_steps(L, L.Te, a2a, cat, first)
    steps += _etp(L, "moe.etp_ag", "all_gather", gathered, cat) + chunk_sort(L, "moe.sort_chunks", m_e * local, cat)
    steps += expert_padding(L, m_e * local, cat, True)
    steps += _experts_forward(L, m_e, local, _act_forward(L, cat, m_e * local, fe), cat)
    steps += expert_padding(L, m_e * local, cat, False) + chunk_sort(L, "moe.unsort_chunks", m_e * local, cat)
    steps += _etp(L, "moe.etp_rs", "reduce_scatter", gathered, cat)
    steps += combine_steps(L, L.Te, a2a, cat, second)
    if first and L.shared_ffn:
        steps += _tp_out(L, "shared", cat)
    steps += unpermute(L, routed, cat) + latent_up(L, L.Te, cat)
    return steps


def _folded_moe_backward(L: LayerShape) -> list[Step]:
    routed, local, m_e, a2a = _folded_sizes(L)
    fe = L.fe_l
    gathered = m_e * local * L.hx * L.dtype
    steps: list[Step] = [*latent_up_backward(L, L.Te), *unpermute_backward(L, routed)]
    steps += combine_backward(L, L.Te, a2a)
    steps += _etp(L, "moe.etp_ag_bwd", "all_gather", gathered, BWD) + chunk_sort(L, "moe.unsort_chunks_bwd",
                                                                                  m_e * local, BWD)
    steps += expert_padding(L, m_e * local, BWD, False)
    steps += _experts_backward(L, m_e, local, _act_backward(L, m_e * local, fe))
    steps += expert_padding(L, m_e * local, BWD, True) + chunk_sort(L, "moe.sort_chunks_bwd", m_e * local, BWD)
    steps += _etp(L, "moe.etp_rs_bwd", "reduce_scatter", gathered, BWD)
    steps += dispatch_backward(L, L.Te, a2a)
    if L.shared_ffn:
        steps += [*_grad_gather(L, "shared.down"), *_shared_backward(L), *_tp_out(L, "shared_bwd", BWD)]
    steps += permute_and_router_backward(L, L.Te, routed)
    return steps


def _mamba_forward(L: LayerShape, cat: str) -> list[Step]:
    """A hybrid model's M layer: pre-norm, [SP all-gather], the Mamba-2 mixer (mixer.py), [TP all-reduce | SP
    reduce-scatter], residual add: an attention block's frame around the mixer."""
    return [_norm(L, "mamba.ln", cat), *_tp_in(L, "mamba.ln", cat), *mixer.mixer_forward(L, cat),
            *_tp_out(L, "mamba.out_proj", cat), _bda(L, "mamba.bda", cat)]


def _mamba_backward(L: LayerShape) -> list[Step]:
    width = mixer.local_dims(L)[3]
    return [*_bda_backward(L, "mamba.bda_bwd"), *_grad_gather(L, "mamba.out_proj"), *mixer.mixer_backward(L),
            *_column_backward(L, "mamba.in_proj", L.T, width, L.h), *_norm_backward(L, "mamba.ln")]


def _delta_forward(L: LayerShape, cat: str) -> list[Step]:
    """A hybrid model's G layer: a Mamba layer's frame around the gated delta net (delta_net.py)."""
    return [_norm(L, "gdn.ln", cat), *_tp_in(L, "gdn.ln", cat), *delta_net.delta_forward(L, cat),
            *_tp_out(L, "gdn.out_proj", cat), _bda(L, "gdn.bda", cat)]


def _delta_backward(L: LayerShape) -> list[Step]:
    width = delta_net.local_dims(L)[3]
    return [*_bda_backward(L, "gdn.bda_bwd"), *_grad_gather(L, "gdn.out_proj"), *delta_net.delta_backward(L),
            *_column_backward(L, "gdn.in_proj", L.T, width, L.h), *_norm_backward(L, "gdn.ln")]


def _part_forward(L: LayerShape, part: str, cat: str) -> list[Step]:
    if part == hybrid.MAMBA:
        return _mamba_forward(L, cat)
    if part == hybrid.GDN:
        return _delta_forward(L, cat)
    return _attention_forward(L, cat) if part == hybrid.ATTENTION else _mlp_forward(L, cat)


def forward_steps(L: LayerShape, cat: str = FWD) -> list[Step]:
    """The forward pass of one layer for one micro-batch: attention then the MLP, or a hybrid layer's parts."""
    if L.parts:
        steps = [st for part in L.parts for st in _part_forward(L, part, cat)]
    else:
        steps = _attention_forward(L, cat) + _mlp_forward(L, cat)
    return userbuffers(quantised_gathers(fp8_forward_casts(steps, L), L) if L.fp8 else steps, L)


# --- backward --------------------------------------------------------------------------

def _column_backward(L: LayerShape, name: str, m: int, n_out: int, k_in: int, width: int = 0) -> list[Step]:
    """Backward of a column-parallel linear y = x·W (x: m×k_in, W: k_in×n_out).

    [SP: all-gather of the saved input, under dgrad] · dgrad · [TP AR | SP RS of dx, under
    wgrad] · wgrad. The communicated input is T tokens of ``width`` elements (0: h).
    """
    steps: list[Step] = []
    nbytes = L.T * (width or L.h) * L.dtype
    if L.t > 1 and L.sp:
        steps.append(Comm(f"{name}.ag_input", "tp", "all_gather", nbytes, 1, BWD))
    steps.append(gemm(f"{name}.dgrad", m, k_in, n_out, L, 1, BWD))
    if L.t > 1:
        op = "reduce_scatter" if L.sp else "all_reduce"
        steps.append(Comm(f"{name}.{'rs' if L.sp else 'ar'}_dgrad", "tp", op, nbytes, 1, BWD))
    steps.append(gemm(f"{name}.wgrad", k_in, n_out, m, L, 1, BWD))
    return steps


column_backward = _column_backward  # the column-parallel linear's backward, for the modules beside a layer (mtp.py)


def _grad_gather(L: LayerShape, name: str) -> list[Step]:
    """Backward into a row-parallel linear with SP: all-gather dy (on the critical path)."""
    if L.t > 1 and L.sp:
        return [Comm(f"{name}.ag_grad", "tp", "all_gather", L.T * L.h * L.dtype, 0, BWD)]
    return []


def _bda_backward(L: LayerShape, name: str) -> list[Step]:
    passes = (2.5 if L.dropout else 0.0) + (1.0 if L.biases else 0.0)
    return [elementwise(name, L.Te * L.h, passes, L, 2.0, BWD)] if passes else []


def _post_backward(L: LayerShape, block: str, name: str) -> list[Step]:
    return HC.post_backward(L, block) if L.hc else _bda_backward(L, name)


def _pre_backward(L: LayerShape, block: str, name: str) -> list[Step]:
    """The pre-norm's backward and the residual gradient's accumulation, or with mHC the streams' (hyper_connection.py:
    the pre's backward sums them)."""
    if L.hc:
        return [elementwise(f"{name}_bwd", L.Te * L.h, 3.0, L, 10.0, BWD), *HC.pre_backward(L, block)]
    return _norm_backward(L, name)


def _norm_backward(L: LayerShape, name: str) -> list[Step]:
    """Norm backward (3 passes) and the residual-gradient accumulation (3 passes)."""
    return [elementwise(f"{name}_bwd", L.Te * L.h, 3.0, L, 10.0, BWD),
            elementwise(f"{name}_residual_grad", L.Te * L.h, 3.0, L, 1.0, BWD)]


def attention_core_backward(L: LayerShape) -> list[Step]:
    """The core's backward, as :func:`attention_core_forward` in reverse."""
    before, after = _dpa_casts(L, True, BWD)
    return [*before, *_attention_core_backward(L), *after]


def _attention_core_backward(L: LayerShape) -> list[Step]:
    other = _cp_core(L, True, BWD)
    if other is not None:
        return other
    if L.fused_attention:
        steps: list[Step] = []
        block = 2 * L.b * L.s * L.kv_l * (L.d_qk + L.d_v) * _ring_bytes(L)  # K, V and their gradients
        for i in range(L.cp):
            if i < L.cp - 1:
                steps.append(Comm(f"attn.kv_ring{i}_bwd", "cp", "ring", block, 1, BWD))
            steps.append(flash(f"attn.flash{i}_bwd" if L.cp > 1 else "attn.flash_bwd", L, L.s, True, BWD))
        if L.sinks:  # the sink's gradient: a sum over the queries of each head
            steps.append(elementwise("attn.sinks_bwd", L.b * L.a_l * L.s, 2.0, L, 2.0, BWD))
        return steps
    bh = L.b * L.a_l
    scores = bh * L.s * L.s_kv
    steps = [gemm("attn.pv.dgrad_p", L.s, L.s_kv, L.d_v, L, bh, BWD),  # dP = dO·Vᵀ
             gemm("attn.pv.dgrad_v", L.s_kv, L.d_v, L.s, L, bh, BWD)]  # dV = Pᵀ·dO
    if L.dropout:
        steps.append(elementwise("attn.dropout_bwd", scores, 2.5, L, 1.0, BWD))
    steps += [elementwise("attn.softmax_bwd", scores, 3.0, L, 4.0, BWD),
              gemm("attn.qk.dgrad_q", L.s, L.d_qk, L.s_kv, L, bh, BWD),  # dQ = dS·K
              gemm("attn.qk.dgrad_k", L.s_kv, L.d_qk, L.s, L, bh, BWD)]  # dK = dSᵀ·Q
    return steps


def _act_forward(L: LayerShape, cat: str, tokens: int | None = None, f_l: int | None = None,
                 prefix: str = "") -> Kernel:
    """The MLP's element-wise activation: SwiGLU reads two halves; GeLU and squared ReLU one input.
    Over ``tokens`` (default T) rows of width ``f_l`` (default the dense MLP's share)."""
    n = (L.T if tokens is None else tokens) * (L.f_l if f_l is None else f_l)
    if L.swiglu:
        return elementwise(prefix + "swiglu", n, 3.0, L, 4.0, cat)
    if L.activation == "squared_relu":
        return elementwise(prefix + "squared_relu", n, 2.0, L, 2.0, cat)
    return elementwise(prefix + "gelu", n, 2.0, L, 8.0, cat)


def _act_backward(L: LayerShape, tokens: int, f_l: int | None = None, prefix: str = "") -> Kernel:
    passes = 5.0 if L.swiglu else 3.0 + (1.0 if L.biases else 0.0)  # + bias gradient
    n = tokens * (L.f_l if f_l is None else f_l)
    if L.swiglu:
        return elementwise(prefix + "swiglu_bwd", n, passes, L, 8.0, BWD)
    if L.activation == "squared_relu":
        return elementwise(prefix + "squared_relu_bwd", n, passes, L, 3.0, BWD)
    return elementwise(prefix + "gelu_bwd", n, passes, L, 8.0, BWD)


def _shared_backward(L: LayerShape) -> list[Step]:
    if not L.shared_ffn:
        return []
    f_l = L.shared_ffn // L.t
    up = 2 * f_l if L.swiglu else f_l
    return [*linear_backward(L, "shared.down", L.T, L.h, f_l), _act_backward(L, L.T, f_l, "shared."),
            *linear_backward(L, "shared.up", L.T, up, L.h)]


# Transformer Engine's CuTe DSL fused grouped MLP (model.use_transformer_engine_op_fuser; transformer_engine/pytorch/
# ops/fused/grouped_mlp.py @ d0067d0da, _GroupedMLP_CuTeGEMMBase: sm_100, MXFP8 or NVFP4). Forward, cuDNN frontend's
# grouped_gemm_glu (or _srelu) runs fc1 and in its epilogue the activation, the router's probabilities and the
# quantisation of fc2's input, writing the BF16 pre-activation (c_tensor, the GEMM's own output here) and fc2's input
# in both quantised copies (d_tensor, d_col_tensor); fc2 then reads that input as it is. Backward, grouped_gemm_dglu
# runs fc2's dgrad and in its epilogue the activation's backward from the saved pre-activation and the quantisation of
# fc1's output gradient, both copies (d_row_tensor, d_col_tensor), in place of the BF16 gradient of the activation's
# output. The separate activation kernels and those two casts go.
_FUSED_MLP_SKIPS = ("moe.down.fp8_cast_x", "moe.up.fp8_cast_dy")


def _experts_forward(L: LayerShape, m_e: int, local: int, act: Kernel, cat: str) -> list[Step]:
    """The local experts' fc1 · activation (``act``) · fc2 grouped GEMMs of ``m_e`` rows each; under TE's fused
    grouped MLP (``L.fused_mlp``) the activation in fc1's epilogue, which writes fc2's input both quantised copies."""
    fe = L.fe_l
    up = grouped_gemm("moe.up", m_e, 2 * fe if L.swiglu else fe, L.hx, L, local, cat)
    down = grouped_gemm("moe.down", m_e, L.hx, fe, L, local, cat)
    if not L.fused_mlp:
        return [up, act, down]
    return [replace(up, bytes=up.bytes + 2 * _QUANT_BYTES[L.recipe] * m_e * local * fe), down]


def _experts_backward(L: LayerShape, m_e: int, local: int, act: Kernel) -> list[Step]:
    """fc2's dgrad and wgrad, the activation's backward (``act``), fc1's; under TE's fused grouped MLP the activation's
    backward in fc2's dgrad epilogue, which reads the saved BF16 pre-activation and writes fc1's output gradient in
    both quantised copies instead of the BF16 gradient of the activation's output."""
    fe = L.fe_l
    up = 2 * fe if L.swiglu else fe
    fc2, fc1 = _grouped_backward(L, "moe.down", m_e, L.hx, fe, local), _grouped_backward(L, "moe.up", m_e, up, L.hx,
                                                                                          local)
    if not L.fused_mlp:
        return [*fc2, act, *fc1]
    rows = m_e * local
    epilogue = rows * up * (2.0 + 2 * _QUANT_BYTES[L.recipe]) - rows * fe * 2.0
    return [replace(fc2[0], bytes=fc2[0].bytes + epilogue), fc2[1], *fc1]


def _grouped_backward(L: LayerShape, name: str, m: int, n_out: int, k_in: int, groups: int) -> list[Step]:
    """dgrad then wgrad of the local experts' grouped GEMM."""
    return [grouped_gemm(f"{name}.dgrad", m, k_in, n_out, L, groups, BWD),
            grouped_gemm(f"{name}.wgrad", k_in, n_out, m, L, groups, BWD)]


def _mlp_core_backward(L: LayerShape) -> list[Step]:
    if not L.experts:
        return [*linear_backward(L, "mlp.down", L.T, L.h, L.f_l), _act_backward(L, L.T),
                *_column_backward(L, "mlp.up", L.T, L.up_n, L.h)]
    routed, local, m_e, a2a = _moe_sizes(L)
    fe = L.fe_l
    steps: list[Step] = [*latent_up_backward(L, L.T), *unpermute_backward(L, routed)]
    steps += combine_backward(L, L.T, a2a)
    steps += chunk_sort(L, "moe.unsort_chunks_bwd", m_e * local, BWD) + expert_padding(L, m_e * local, BWD, False)
    steps += _experts_backward(L, m_e, local, _act_backward(L, m_e * local if L.rank_load != 1.0 or L.pad_rows
                                                          else routed, fe))
    steps += expert_padding(L, m_e * local, BWD, True) + chunk_sort(L, "moe.sort_chunks_bwd", m_e * local, BWD)
    steps += dispatch_backward(L, L.T, a2a)
    steps += [*_shared_backward(L), *permute_and_router_backward(L, L.T, routed)]
    return steps


def _mla_backward(L: LayerShape) -> list[Step]:
    """MLA's projections backward, from the rope back to the replicated down projections (on Te tokens)."""
    steps: list[Step] = []
    if L.rope_dim:
        steps.append(elementwise("rope_bwd", L.T * (L.a_l + 1) * L.rope_dim, 2.0, L, 3.0, BWD))
    kv_in = L.kv_rank + L.rope_dim  # the gathered latent and rope key
    if L.dsa_topk:  # absorbed: the query's einsum, and the latent key's gradient summed over TP under it
        steps += [*sparse_attention.kv_grad_comm(L),
                  *sparse_attention.absorb_backward(L, "q_absorb", L.T, L.kv_rank, L.d_qk - L.rope_dim)]
    else:
        steps += _column_backward(L, "kv_up", L.T, L.a_l * (L.d_qk - L.rope_dim + L.d_v), L.kv_rank, kv_in)
    steps += [elementwise("kv_norm_bwd", L.Te * L.kv_rank, 3.0, L, 10.0, BWD),
              *linear_backward(L, "kv_down", L.Te, kv_in, L.h)]
    if L.q_rank:
        steps += [*_column_backward(L, "q_up", L.T, L.a_l * L.d_qk, L.q_rank, L.q_rank),
                  elementwise("q_norm_bwd", L.Te * L.q_rank, 3.0, L, 10.0, BWD),
                  *linear_backward(L, "q_down", L.Te, L.q_rank, L.h)]
    else:
        steps += _column_backward(L, "q", L.T, L.a_l * L.d_qk, L.h)
    return steps


def backward_steps(L: LayerShape, recompute: str = "none") -> list[Step]:
    """The backward pass of one layer for one micro-batch, with its recomputation.

    recompute: none; selective (the unfused attention core is recomputed just before its
    backward; nothing with fused attention, which recomputes inside its kernel); full
    (the whole forward, TP comms included, is rerun first).
    """
    steps = _backward_steps(L, recompute)
    rerun = forward_steps(L, RECOMPUTE) if recompute == "full" else []
    return rerun + userbuffers(quantised_gathers(fp8_backward_casts(steps, L), L) if L.fp8 else steps, L)


def _backward_steps(L: LayerShape, recompute: str) -> list[Step]:
    """The backward's own steps (a full recompute's forward goes before them: backward_steps): the MLP's then the
    attention's, or a hybrid layer's parts in reverse."""
    if L.parts:
        return [st for part in reversed(L.parts) for st in _part_backward(L, part, recompute)]
    return _mlp_backward(L) + _attention_backward(L, recompute)


def _part_backward(L: LayerShape, part: str, recompute: str) -> list[Step]:
    if part == hybrid.MAMBA:
        return _mamba_backward(L)
    if part == hybrid.GDN:
        return _delta_backward(L)
    return _attention_backward(L, recompute) if part == hybrid.ATTENTION else _mlp_backward(L)


def _mlp_backward(L: LayerShape) -> list[Step]:
    steps: list[Step] = []
    steps += _post_backward(L, "mlp", "bda2_bwd")
    if L.folded:
        steps += _folded_moe_backward(L)
    else:
        steps += _grad_gather(L, "mlp.down")
        steps += _mlp_core_backward(L)
    return steps + _pre_backward(L, "mlp", "ln2")


def _attention_backward(L: LayerShape, recompute: str) -> list[Step]:
    steps: list[Step] = []
    if L.dsv4:
        return _dsv4_backward(L)
    steps += _post_backward(L, "attn", "bda1_bwd")
    steps += _grad_gather(L, "proj")
    steps += linear_backward(L, "proj", L.T, L.h, L.a_l * L.d_v)
    steps.append(elementwise("ctx_copy_bwd", L.T * L.a_l * L.d_v, 2.0, L, 0.0, BWD))
    if L.out_gate:  # the gradients of the output and of the gate (read dy, the output and the gate; write two)
        steps.append(elementwise("attn_gate_bwd", L.T * L.a_l * L.d_v, 5.0, L, 8.0, BWD))
    if L.dsa_topk:
        steps += [*sparse_attention.absorb_backward(L, "v_up", L.T, L.d_v, L.kv_rank),
                  *sparse_attention.core_backward(L)]
        return steps + _mla_backward(L) + _pre_backward(L, "attn", "ln1")
    if recompute == "selective" and not L.fused_attention:
        steps += _with_category(attention_core_forward(L), RECOMPUTE)
    steps += attention_core_backward(L)
    if L.mla:
        return steps + _mla_backward(L) + _pre_backward(L, "attn", "ln1")
    if L.kv_l < L.a_l and not L.fused_attention:
        steps.append(elementwise("kv_expand_bwd", L.T * L.d * (L.kv_l + L.a_l), 2.0, L, 1.0, BWD))
    if L.rope:
        steps.append(elementwise("rope_bwd", L.T * (L.a_l + L.kv_l) * L.d, 2.0, L, 3.0, BWD))
    if L.biases:
        steps.append(elementwise("qkv.bias_grad", L.T * L.qkv_n, 1.0, L, 1.0, BWD))
    steps += _column_backward(L, "qkv", L.T, L.qkv_n, L.h)
    steps += _pre_backward(L, "attn", "ln1")
    return steps


# --- embeddings and head ------------------------------------------------------------

def embedding_forward(L: LayerShape, learned_positions: bool) -> list[Step]:
    """Vocab-parallel lookup (gather T rows), position add, dropout, then TP AR (SP: RS)."""
    steps: list[Step] = [elementwise("embed.lookup", L.T * L.h, 2.0, L, 0.0, FWD)]
    if learned_positions:
        steps.append(elementwise("embed.pos_add", L.T * L.h, 3.0, L, 1.0, FWD))
    if L.t > 1:
        steps += _tp_out(L, "embed", FWD)
    if L.dropout:
        steps.append(elementwise("embed.dropout", L.Te * L.h, 2.5, L, 2.0, FWD))
    return steps + HC.expand(L)


def embedding_backward(L: LayerShape) -> list[Step]:
    """[SP: AG of dy] · scatter-add of dy into the embedding-table gradient (3 passes of T·h)."""
    steps: list[Step] = HC.expand_backward(L)
    if L.dropout:
        steps.append(elementwise("embed.dropout_bwd", L.Te * L.h, 2.5, L, 1.0, BWD))
    steps += _grad_gather(L, "embed")
    steps.append(elementwise("embed.wgrad", L.T * L.h, 3.0, L, 1.0, BWD))
    return steps


def head_forward(L: LayerShape, vocab: int) -> list[Step]:
    """Final norm · [SP AG] · logits GEMM (vocab-parallel) · cross-entropy.

    The vocab-parallel cross-entropy (Megatron) converts the T×V/t logits to fp32 and
    makes passes for max, exp and sum: 18 B per logit (read 2 + write 4, then read/write
    4 twice); its small TP all-reduces of T floats are left out.
    """
    v_l = vocab // L.t
    return head_casts([*HC.contract(L), _norm(L, "final_norm", FWD), *_tp_in(L, "head", FWD),
                       gemm("lm_head", L.T, v_l, L.h, L, 1, FWD),
                       Kernel("loss", "elementwise", 5.0 * L.T * v_l, 18.0 * L.T * v_l, FWD)], L)


def head_backward(L: LayerShape, vocab: int) -> list[Step]:
    """Cross-entropy gradient (10 B per logit: read fp32 softmax, write bf16 grad and a
    fp32 pass), the logits GEMM backward as a column-parallel linear, the final norm."""
    v_l = vocab // L.t
    return head_casts([Kernel("loss_bwd", "elementwise", 2.0 * L.T * v_l, 10.0 * L.T * v_l, BWD),
                       *_column_backward(L, "lm_head", L.T, v_l, L.h),
                       elementwise("final_norm_bwd", L.Te * L.h, 3.0, L, 10.0, BWD), *HC.contract_backward(L)], L,
                      backward=True)


def head_casts(steps: list[Step], L: LayerShape, backward: bool = False) -> list[Step]:
    """The LM head's ``steps`` with Transformer Engine's casts where its GEMMs run in MXFP8 (``L.fp8_head``,
    training.fp8_output_proj): the input's and, once a step, the weight's before the forward GEMM, the output
    gradient's before dgrad; ``steps`` as they are otherwise."""
    if not L.fp8_head:
        return steps
    return fp8_backward_casts(steps, L) if backward else fp8_forward_casts(steps, L)

"""The MoE layer's token dispatch as the steps one GPU runs: the router, the routing and aux-loss kernels, the
dispatcher's token counts and host sync, the permutation (fused or Megatron-Core's own ops), the exchange over the
expert-parallel group (alltoall, allgather or flex: DeepEP, HybridEP) and its combine, and their backward.

layer.py places them around the experts' grouped GEMMs (its MoE forward and backward); the Megatron-Core and
Transformer Engine sources each constant comes from are cited beside it below.
"""
from __future__ import annotations

from dataclasses import replace

from emulator.devices import compute
from emulator.program import dispatch_op
from emulator.workload.steps import (
    BWD,
    Comm,
    Kernel,
    LayerShape,
    Step,
    gemm,
    kernels,
    linear_backward,
)

# --- token dispatch (parallel.moe_token_dispatcher_type) ------------------------------------------
# Megatron-Core's dispatchers (megatron/core/transformer/moe/token_dispatcher.py @ d98e8a64dd):
# - alltoall (MoEAlltoAllTokenDispatcher): ``preprocess`` all-gathers every rank's tokens per expert over
#   the TP×EP group (gather_from_sequence_parallel_region(num_local_tokens_per_expert, tp_ep_group): E int64
#   per rank), the host syncs at ``cuda_sync_point`` "before_ep_alltoall" to read the splits
#   (_maybe_dtoh_and_synchronize; with token dropping or router padding at "before_permutation_1", so before the
#   permutation: LayerShape.early_sync; under drop and pad ``preprocess`` returns early with the capacity as every
#   count: neither the all-gather nor the sync), then ``token_dispatch`` runs the tokens' all-to-all-v and a
#   second one of the routing probabilities (one per copy, fp32); ``token_combine`` one all-to-all back. The
#   emulator sends the probabilities with the tokens (same pairs, their bytes added), leaving out the second
#   call's launch and latency (~10 us) for fewer events. The shared experts' fc1 runs after the
#   tokens' all-to-all is launched and fc2 after the combine's (``linear_fc1_forward_and_act``,
#   ``linear_fc2_forward``): under them with moe_shared_expert_overlap.
# - allgather (MoEAllGatherTokenDispatcher): the routing map, the probabilities and the hidden states are
#   all-gathered over TP×EP; the combine reduce-scatters.
# - flex (MoEFlexTokenDispatcher, fused_a2a.py): DeepEP's (or HybridEP's) dispatch and combine over TP×EP,
#   each token once per destination (network/dispatch.py); the probabilities travel with the tokens; DeepEP's normal
#   dispatch waits on the host for the received count (deep_ep/buffer.py ``dispatch``: "the CPU will wait
#   for GPU's signal"), as HybridEP's does without moe_expert_rank_capacity_factor (token_dispatcher.py
#   ``_HybridEPManager.setup_metadata``: "HybridEP sizes buffers dynamically (CPU sync in dispatch)"; with it, the
#   budget tokens·top_k·f is num_permuted_tokens, known on the host: no sync, LayerShape.static_ep);
#   its kernels hold moe_flex_dispatcher_num_sms SMs, so compute under them is slower.
# The EP group stands for TP×EP: they are one group with MoE parallel folding (etp 1).

# The host sync: the stream drains, the host reads the splits and launches the next kernels; the GPU waits
# one host launch. ASSUMPTION: one host-bound launch as measured, 11.3 us a call (../shared/calibration/
# h100/other.csv, NVIDIA/dgxc-benchmarking cpu_overhead sample, torch_small_matmul_time_per_call_us 4x4).
HOST_SYNC_S = 11.3e-6
COUNT_BYTES = 8  # num_local_tokens_per_expert: one int64 per expert


# moe_router_dtype fp32 runs through Transformer Engine's general_gemm (Megatron-Core moe_utils.py @ d98e8a64dd,
# RouterGatingLinearFunction, lines 1389-1394 and 1424-1432): forward on the BF16 input and weight with an
# fp32 output (the BF16 rate; 4-byte logits); backward on fp32 copies (weight.to, inp.to) of both GEMMs'
# operands, the input gradient cast back. fp64 has no TE GEMM: torch.mm in fp64, as priced by the dtype.
TE_ROUTER_BYTES = 4


def _router(L: LayerShape, tokens: int, cat: str) -> Kernel:
    """The router GEMM tokens × h → E: fp32 logits from BF16 operands with moe_router_dtype fp32 (TE), else
    in moe_router_dtype (fp64: 8-byte operands at the FP64 rate) or the training dtype."""
    k = gemm("moe.router", tokens, L.experts, L.h, L, 1, cat)
    if L.router_bytes == TE_ROUTER_BYTES:
        return replace(k, bytes=float((tokens * L.h + L.h * L.experts) * L.dtype + tokens * L.experts * 4))
    return _in_router_dtype(L, k)


def _in_router_dtype(L: LayerShape, k: Kernel) -> Kernel:
    if not L.router_bytes:
        return k
    return replace(k, dtype=L.router_bytes, bytes=compute.gemm_bytes(k.m, k.n, k.k, L.router_bytes, k.batch))


def _router_backward(L: LayerShape, tokens: int) -> list[Step]:
    """The router GEMM's dgrad and wgrad in moe_router_dtype; with fp32 (TE, :data:`TE_ROUTER_BYTES`) also the
    casts: the weight and the saved input to fp32 before them, the input gradient back to the input's dtype."""
    dgrad, wgrad = (_in_router_dtype(L, st) for st in kernels(linear_backward(L, "moe.router", tokens, L.experts,
                                                                               L.h)))
    if L.router_bytes != TE_ROUTER_BYTES:
        return [dgrad, wgrad]
    h, e, d, r = L.h, L.experts, L.dtype, TE_ROUTER_BYTES
    return [_small("moe.router.weight_cast_bwd", h * e * (d + r), BWD), dgrad,
            _small("moe.router.dgrad_cast_bwd", tokens * h * (r + d), BWD),
            _small("moe.router.input_cast_bwd", tokens * h * (d + r), BWD), wgrad]


# --- the router's and the permutation's small kernels -------------------------------------------------
# What Megatron-Core runs around the router GEMM and the token copies, per MoE layer and micro-batch
# (NVIDIA/Megatron-LM @ d98e8a64dd, megatron/core/transformer/moe/router.py TopKRouter.routing,
# moe_utils.py, token_dispatcher.py; NVIDIA/TransformerEngine @ d0067d0, transformer_engine/pytorch/
# permutation.py and triton/permutation.py), in the configuration of Megatron-LM's MoE examples
# (examples/gptoss/02_train.sh, examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh,
# examples/post_training/modelopt/conf/Qwen/Qwen3-30B-A3B.sh): the softmax score function after top-k
# (moe_router_pre_softmax off), an auxiliary load-balancing loss (moe_aux_loss_coeff > 0; every example
# sets one), TE's fused permutation (--moe-permute-fusion), and the router unfused (moe_router_fusion
# off, the default): every PyTorch op is its own kernel. ASSUMPTION: one kernel per PyTorch op (a lower
# bound: a sorted torch.topk may add a sort kernel, an out-of-place scatter a copy). N tokens seen by the
# router, E experts, k = top_k, r the logits' bytes (moe_router_dtype, else the training dtype):
# - routing (moe_utils.topk_routing_with_score_function): topk of the logits; softmax of the k scores
#   (fp32); the probabilities cast back to the logits' dtype (none when r = 4); routing_probs =
#   zeros_like(logits).scatter(...) (2); routing_map = zeros_like(logits).int().scatter(...).bool() (4):
#   8 kernels (9 with the cast). Group-limited routing (moe_router_num_groups, group_limited_topk)
#   replaces the one topk by ten: the per-group topk, its sum, the group topk, the group mask's zeros
#   and scatter, its expand to the experts, bool, not, masked_fill and the final topk.
# - aux loss (compute_routing_scores_for_aux_loss, get_tokens_per_expert_and_token_count,
#   switch_load_balancing_loss_func, attach_and_log_load_balancing_loss): softmax over all E, topk, the
#   routing map's zeros, int, scatter and bool (6); the map's column sum (the tokens per expert), all-
#   reduced over the TP×CP group (reduce_from_tensor_model_parallel_region: a Comm with TP > 1); the
#   probabilities' column sum; the loss's product, sum and scale; the tracker's division and add (5):
#   13 kernels. Backward (autograd of the same ops): MoEAuxLossAutoScaler's ones_like and scale, the
#   scale's and the product's gradients, the full softmax's backward on its materialised gradient
#   (contiguous), and the add of the two paths' logit gradients: 7; the routing's: the scatter's gather,
#   the softmax's backward, topk's zeros and scatter (4; 5 with the cast).
# - the alltoall dispatcher's counts (MoEAlltoAllTokenDispatcher.preprocess): routing_map.sum(dim=0),
#   and with EP or TP the input splits' sum, the local experts' slice (contiguous) and three sums: 1 or 6.
# - TE's fused permutation (moe_permute_mask_map_forward): make_row_id_map's three Triton passes over
#   the N×E map (int32 N×(2E+1) out) before the permute kernel (``moe.permute``); nothing backward (the
#   map is saved).
# - the alltoall dispatcher's chunk sort with EP and more than one local expert (dispatch_postprocess
#   and combine_preprocess: sort_chunks_by_idxs, TE's moe_chunk_sort_forward): make_chunk_sort_map and
#   sort_chunks_by_map, a copy of every received token (and its probability), after the dispatch and
#   again before the combine; backward one copy each.
# Pricing: every kernel at the elementwise roofline (compute.elementwise_time: its bytes at E_MEM plus
# the GPU's launch_overhead). The small ones are launch-bound: N·E·4 bytes are 2 MB for N 4096, E 128,
# 0.7 us on an H100 against the 4 us floor. ASSUMPTION: that floor is the catalog's launch_overhead; no
# calibration row measures a small kernel alone (../shared/calibration/h200/elementwise.csv rows are 30 us
# or more, and h200/sources.md says their per-call times below 60 us hold the host's dispatch; h100/
# other.csv's torch_small_matmul_time_per_call_us, 11.3 us, is host-bound: an upper bound). The token
# copies (permute, unpermute, chunk sort and their gradients) are ``copy`` kernels, at the bandwidth a
# copy reached (compute.COPY_MEM_EFFICIENCY).
IDX_BYTES = 8  # an int64 index (torch.topk's indices, a token count)
SCORE_BYTES = 4  # the router's scores and probabilities are fp32 (topk_routing_with_score_function)
MAP_PASSES = 3  # make_row_id_map's three Triton kernels (TE triton/permutation.py, _row_id_map_pass_1..3)


def _small(name: str, nbytes: float, cat: str) -> Kernel:
    """One of the router's or the permutation's small kernels, moving ``nbytes`` (no FLOPs counted)."""
    return Kernel(name, "elementwise", 0.0, float(nbytes), cat)


def _copy(name: str, nbytes: float, cat: str, flops: float = 0.0) -> Kernel:
    """A token copy (permute, unpermute, chunk sort): a memory-bound row gather of ``nbytes`` read and written."""
    return Kernel(name, "copy", flops, float(nbytes), cat)


def _logit_bytes(L: LayerShape) -> int:
    return L.router_bytes or L.dtype


def _topk(L: LayerShape, n: int, cat: str) -> list[Kernel]:
    """The routing's top-k of the N×E logits: one torch.topk, or group_limited_topk's ten kernels."""
    e, k, r = L.experts, L.top_k, _logit_bytes(L)
    ne, nk = n * e, n * k
    if not (L.groups and L.group_topk):
        return [_small("moe.router.topk", ne * r + nk * (r + IDX_BYTES), cat)]
    g = n * L.groups  # one score per token and group
    return [_small("moe.router.group_topk_in", ne * r + g * (r + IDX_BYTES), cat),
            _small("moe.router.group_sum", 2 * g * r, cat),
            _small("moe.router.group_topk", g * r + n * L.group_topk * (r + IDX_BYTES), cat),
            _small("moe.router.group_zeros", g * r, cat),
            _small("moe.router.group_scatter", g * r + n * L.group_topk * IDX_BYTES, cat),
            _small("moe.router.group_expand", g * r + ne * r, cat),
            _small("moe.router.group_bool", ne * (r + 1), cat),
            _small("moe.router.group_not", ne * 2, cat),
            _small("moe.router.masked_fill", ne * (2 * r + 1), cat),
            _small("moe.router.topk", ne * r + nk * (r + IDX_BYTES), cat)]


def _routing_map(prefix: str, n: int, L: LayerShape, cat: str) -> list[Kernel]:
    """zeros_like(logits).int().scatter(1, top_indices, 1).bool(): four kernels over N×E."""
    ne, r = n * L.experts, _logit_bytes(L)
    return [_small(f"{prefix}.map_zeros", ne * r, cat), _small(f"{prefix}.map_int", ne * (r + 4), cat),
            _small(f"{prefix}.map_scatter", 2 * ne * 4 + n * L.top_k * IDX_BYTES, cat),
            _small(f"{prefix}.map_bool", ne * (4 + 1), cat)]


# moe_router_fusion (Megatron-Core moe_utils.py @ d98e8a64dd, ``fused=``; TransformerEngine @ d0067d0,
# transformer_engine/pytorch/router.py): the routing is one kernel each way (FusedTopkScoreFunction:
# tex.fused_topk_with_score_function_fwd/_bwd, group-limited top-k included), the aux loss's scores one
# each way (FusedComputeScoresForMoEAuxLoss), the aux loss one each way (FusedAuxLoss); the tokens per
# expert (routing_map.sum), their all-reduce and the tracker's two ops stay. Each kernel reads the N×E
# logits (or its gradient) and writes its N×E outputs: probabilities and the bool map.


def _fused_routing(L: LayerShape, n: int, cat: str) -> list[Kernel]:
    ne, r = n * L.experts, _logit_bytes(L)
    return [_small("moe.router.fused_topk", ne * (r + r + 1), cat)]


def _routing_kernels(L: LayerShape, n: int, cat: str) -> list[Kernel]:
    """topk_routing_with_score_function (softmax after top-k) on N tokens, after the router GEMM."""
    if L.router_fusion:
        return _fused_routing(L, n, cat)
    e, k, r = L.experts, L.top_k, _logit_bytes(L)
    ne, nk = n * e, n * k
    out = _topk(L, n, cat) + [_small("moe.router.softmax", nk * (r + SCORE_BYTES), cat)]
    if r != SCORE_BYTES:  # probs.type_as(logits)
        out.append(_small("moe.router.probs_cast", nk * (SCORE_BYTES + r), cat))
    out += [_small("moe.router.probs_zeros", ne * r, cat),
            _small("moe.router.probs_scatter", 2 * ne * r + nk * (IDX_BYTES + r), cat)]
    return out + _routing_map("moe.router", n, L, cat)


AUX_LOSS_TINY = ("moe.aux.loss_mul", "moe.aux.loss_sum", "moe.aux.loss_scale", "moe.aux.log_div",
                 "moe.aux.log_add")


def _aux_loss_steps(L: LayerShape, n: int, cat: str) -> list[Step]:
    """The auxiliary load-balancing loss on N tokens: 13 kernels and, with TP, the all-reduce of the
    tokens per expert (its TP×CP group taken as TP)."""
    if L.router_fusion:
        return _fused_aux_loss_steps(L, n, cat)
    e, k, r = L.experts, L.top_k, _logit_bytes(L)
    ne = n * e
    out: list[Step] = [_small("moe.aux.softmax", ne * (r + SCORE_BYTES), cat),
                       _small("moe.aux.topk", ne * SCORE_BYTES + n * k * (SCORE_BYTES + IDX_BYTES), cat)]
    out += _routing_map("moe.aux", n, L, cat)
    out.append(_small("moe.aux.tokens_per_expert", ne + e * IDX_BYTES, cat))
    if L.t > 1:
        out.append(Comm("moe.aux_counts", "tp", "all_reduce", e * IDX_BYTES, 0, cat))
    out.append(_small("moe.aux.probs_sum", ne * SCORE_BYTES + e * SCORE_BYTES, cat))
    out += [_small(name, e * (SCORE_BYTES + IDX_BYTES), cat) for name in AUX_LOSS_TINY]
    return out


def _fused_aux_loss_steps(L: LayerShape, n: int, cat: str) -> list[Step]:
    """The aux loss with moe_router_fusion: the fused scores, the tokens per expert and their all-reduce (TP),
    the fused loss, the tracker's two ops: 5 kernels."""
    e, r = L.experts, _logit_bytes(L)
    ne = n * e
    out: list[Step] = [_small("moe.aux.fused_scores", ne * (r + SCORE_BYTES + 1), cat),
                       _small("moe.aux.tokens_per_expert", ne + e * IDX_BYTES, cat)]
    if L.t > 1:
        out.append(Comm("moe.aux_counts", "tp", "all_reduce", e * IDX_BYTES, 0, cat))
    out.append(_small("moe.aux.fused_loss", ne * SCORE_BYTES + e * (IDX_BYTES + SCORE_BYTES), cat))
    return out + [_small(name, e * (SCORE_BYTES + IDX_BYTES), cat) for name in ("moe.aux.log_div", "moe.aux.log_add")]


def _fused_router_backward(L: LayerShape, n: int) -> list[Kernel]:
    """The gradients with moe_router_fusion: the scaler's two, the fused loss's, the fused scores', the fused
    routing's (each reading and writing N×E), and the add of the two paths' logit gradients: 6 kernels."""
    ne, r = n * L.experts, _logit_bytes(L)
    return [_small("moe.aux.scaler_bwd", SCORE_BYTES, BWD), _small("moe.aux.scale_bwd", SCORE_BYTES, BWD),
            _small("moe.aux.fused_loss_bwd", ne * SCORE_BYTES, BWD),
            _small("moe.aux.fused_scores_bwd", ne * (2 * SCORE_BYTES + r), BWD),
            _small("moe.router.fused_topk_bwd", ne * (2 * r + 1), BWD),
            _small("moe.router.grad_add", 3 * ne * r, BWD)]


def _router_small_backward(L: LayerShape, n: int) -> list[Kernel]:
    """The routing's and the aux loss's gradients back to the logits (autograd of the ops above)."""
    if L.router_fusion:
        return _fused_router_backward(L, n)
    e, k, r = L.experts, L.top_k, _logit_bytes(L)
    ne, nk = n * e, n * k
    out = [_small("moe.aux.scaler_bwd", SCORE_BYTES, BWD), _small("moe.aux.scale_bwd", SCORE_BYTES, BWD),
           _small("moe.aux.loss_scale_bwd", e * SCORE_BYTES, BWD),
           _small("moe.aux.loss_mul_bwd", e * (2 * SCORE_BYTES + IDX_BYTES), BWD),
           _small("moe.aux.grad_contiguous", e * SCORE_BYTES + ne * SCORE_BYTES, BWD),
           _small("moe.aux.softmax_bwd", 3 * ne * SCORE_BYTES, BWD),
           _small("moe.router.probs_gather_bwd", ne * r + nk * (IDX_BYTES + r), BWD)]
    if r != SCORE_BYTES:
        out.append(_small("moe.router.probs_cast_bwd", nk * (r + SCORE_BYTES), BWD))
    out += [_small("moe.router.softmax_bwd", 3 * nk * SCORE_BYTES, BWD),
            _small("moe.router.topk_zeros_bwd", ne * r, BWD),
            _small("moe.router.topk_scatter_bwd", 2 * ne * r + nk * (IDX_BYTES + r), BWD),
            _small("moe.router.grad_add", 3 * ne * r, BWD)]
    return out


def _count_kernels(L: LayerShape, n: int, cat: str) -> list[Kernel]:
    """The alltoall dispatcher's token counts (preprocess): routing_map.sum(dim=0), and with EP or TP
    the input splits, the local experts' slice and three sums. Under drop and pad the counts are the
    capacity, known ahead: one fill of the E·t received counts (``preprocess``'s early return)."""
    if L.dispatcher != "alltoall":
        return []
    e = L.experts
    if L.drop_pad:
        return [_small("moe.counts", e * IDX_BYTES * max(L.t, 1), cat)]
    out = [_small("moe.counts", n * e + e * IDX_BYTES, cat)]
    if L.ep > 1 or L.t > 1:
        out += [_small(name, 2 * e * IDX_BYTES * max(L.t, 1), cat)
                for name in ("moe.counts.splits", "moe.counts.local", "moe.counts.per_rank",
                             "moe.counts.per_tp", "moe.counts.per_expert")]
    return out


def _row_id_map(L: LayerShape, n: int, cat: str) -> list[Kernel]:
    """TE's make_row_id_map: three Triton passes over the N×E routing map into an int32 N×(2E+1) map."""
    ne = n * L.experts
    return [_small("moe.permute.map1", ne * (1 + 4), cat), _small("moe.permute.map2", 2 * ne * 4, cat),
            _small("moe.permute.map3", ne * 4 + n * (2 * L.experts + 1) * 4, cat)]


# Without moe_permute_fusion, Megatron-Core permutes and unpermutes with PyTorch ops (megatron/core/transformer/
# moe/moe_utils.py @ d98e8a64dd, ``permute`` and ``unpermute`` with fused=False; both dispatchers pass the
# probabilities to permute and none to unpermute: token_dispatcher.py lines 671-676, 891-897, 1446-1466):
# - permute: routing_map.bool().T.contiguous() (the N×E map, a byte each, read and written); its flat
#   argsort(descending, stable); flat_sorted % num_tokens (the int64 indices); probs.T.contiguous() (fp32)
#   and the gather of the routed copies' probabilities; tokens.index_select, the copy the fused kernel makes.
#   ASSUMPTION: the argsort is one radix pass over 1-byte keys with int64 values (CUB's onesweep for an 8-bit
#   key): the values' iota written, the keys and values read and written: 8 + 1 + 2·(1 + 8) = 27 bytes an
#   element (SORT_BYTES); no measurement of it here.
# - unpermute: torch.zeros of the N×h output, then scatter_add_ of the R routed rows into it: the rows read,
#   the output read and written by the atomic adds (R·h·d + 2·N·h·d), and an int64 index per row.
# - the gradients: unpermute's (scatter_add's) is a gather of the rows, as the fused kernel's; permute's
#   (index_select's) is index_select_backward: a zeroed N×h and an index_add_ of the R rows (as unpermute).
SORT_BYTES = 27


# HybridEP with moe_permute_fusion_into_hybridep (Megatron-Core token_dispatcher.py @ d98e8a64dd, lines 1150-1194:
# hybrid_ep_dispatch/hybrid_ep_combine with fused=True) writes the dispatched tokens in the experts' order and
# reads them back from it in the combine: no permutation map, permute or unpermute of its own.


def _in_dispatch(L: LayerShape) -> bool:
    """Whether the dispatch itself permutes (HybridEP with moe_permute_fusion_into_hybridep)."""
    return L.permute_into_hybridep and L.dispatcher == "flex" and L.backend == "hybridep"


def _permute_map(L: LayerShape, n: int, routed: int, cat: str) -> list[Kernel]:
    """What permute does before its copy: TE's row-id map (fused), or the unfused argsort path (above)."""
    if _in_dispatch(L):
        return []
    if L.permute_fusion:
        return _row_id_map(L, n, cat)
    ne = n * L.experts
    return [_small("moe.permute.map_t", ne * 2, cat), _small("moe.permute.argsort", ne * SORT_BYTES, cat),
            _small("moe.permute.index", routed * IDX_BYTES * 2, cat),
            _small("moe.permute.probs_t", ne * SCORE_BYTES * 2, cat),
            _small("moe.permute.probs", routed * (IDX_BYTES + 2 * SCORE_BYTES), cat)]


# TE's fused kernels (transformer_engine/common/triton/permutation.py @ d0067d0da): ``_permute_kernel`` reads each
# token's row once and writes it to each of its routed rows, N·h + R·h elements; ``_unpermute_kernel`` reads a
# token's R/N routed rows and writes its one row, the same. Their gradients are each other.


def _spread_rows(L: LayerShape, name: str, routed: int, cat: str) -> list[Kernel]:
    """N = routed / top_k tokens copied to their ``routed`` rows: TE's permute (the N rows read once), or
    unfused index_select (a row read per copy); none where the dispatch permutes."""
    if _in_dispatch(L):
        return []
    rows = routed * L.hx * L.dtype
    tokens = max(1, routed // max(1, L.top_k)) * L.hx * L.dtype
    return [_copy(name, rows + (tokens if L.permute_fusion else rows), cat)]


def _scatter_rows(L: LayerShape, name: str, routed: int, cat: str) -> list[Kernel]:
    """``routed`` token copies summed back into their N = routed / top_k tokens: TE's unpermute (the rows read,
    the tokens written), or unfused a zeroed output and an atomic scatter_add_ / index_add_ into it (above)."""
    if _in_dispatch(L):
        return []
    rows = routed * L.hx * L.dtype
    out = max(1, routed // max(1, L.top_k)) * L.hx * L.dtype
    if L.permute_fusion:
        return [_copy(name, rows + out, cat, routed * L.hx)]
    return [_small(f"{name}.zeros", out, cat), _copy(name, rows + 2.0 * out + routed * IDX_BYTES, cat, routed * L.hx)]


def route_and_permute(L: LayerShape, tokens: int, routed: int, cat: str) -> list[Step]:
    """The router GEMM, the routing, the aux loss, [the latent projection], the dispatcher's counts, the
    permutation's map (TE's row-id map, or unfused its argsort) and the permute of ``routed`` token copies:
    everything of the MoE layer before the dispatch."""
    return [_router(L, tokens, cat), *_routing_kernels(L, tokens, cat), *_aux_loss_steps(L, tokens, cat),
            *_latent_down(L, tokens, cat), *_count_kernels(L, tokens, cat), *_early_sync(L, cat),
            *_permute_map(L, tokens, routed, cat), *_spread_rows(L, "moe.permute", routed, cat)]


# Megatron-Core's latent MoE (moe_layer.py @ d98e8a64dd, model.moe_latent_size): ``preprocess`` projects the layer's
# tokens from h to the latent size by fc1_latent_proj before the dispatcher's preprocess, ``postprocess`` projects
# the combined output back by fc2_latent_proj, before the shared experts' output is added. Both are TELinear with
# parallel_mode "duplicated": every TP rank holds the whole weight and runs it on the tokens it routes.

def _latent_down(L: LayerShape, tokens: int, cat: str) -> list[Step]:
    return [gemm("moe.latent_down", tokens, L.latent, L.h, L, 1, cat)] if L.latent else []


def latent_up(L: LayerShape, tokens: int, cat: str) -> list[Step]:
    """fc2_latent_proj: the combined tokens from the latent width back to h (none without a latent size)."""
    return [gemm("moe.latent_up", tokens, L.h, L.latent, L, 1, cat)] if L.latent else []


def latent_up_backward(L: LayerShape, tokens: int) -> list[Step]:
    return linear_backward(L, "moe.latent_up", tokens, L.h, L.latent) if L.latent else []


def _latent_down_backward(L: LayerShape, tokens: int) -> list[Step]:
    return linear_backward(L, "moe.latent_down", tokens, L.latent, L.h) if L.latent else []


def _count_exchange(L: LayerShape, cat: str) -> list[Step]:
    """The alltoall dispatcher's all-gather of every rank's tokens per expert over the EP group (none without EP),
    then the host's sync that reads them."""
    gather: list[Step] = [Comm("moe.token_counts", "ep", "all_gather", L.experts * COUNT_BYTES * L.ep, 0, cat)] \
        if L.ep > 1 else []
    return [*gather, _host_sync(cat)]


def _early_sync(L: LayerShape, cat: str) -> list[Step]:
    """With token dropping or router padding (LayerShape.early_sync), Megatron-Core's ``preprocess`` all-gathers
    the counts and moves the sync to "before_permutation_1" (token_dispatcher.py @ d98e8a64dd: "output size is
    dynamic. Need to sync output size GPU->CPU before allocating output buffer"): the host waits for the router
    and the count exchange before it issues the permutation."""
    return _count_exchange(L, cat) if L.early_sync and L.experts else []


def permute_and_router_backward(L: LayerShape, tokens: int, routed: int) -> list[Step]:
    """The permute's gradient (TE's unpermute of the gradient, or unfused index_select's backward), [the latent
    projection's], the routing's and aux loss's, the router GEMM's."""
    return [*_scatter_rows(L, "moe.permute_bwd", routed, BWD), *_latent_down_backward(L, tokens),
            *_router_small_backward(L, tokens),
            *_router_backward(L, tokens)]


def _sorted(L: LayerShape) -> bool:
    """Whether the alltoall dispatcher sorts the received chunks by local expert (EP, several local experts)."""
    return L.dispatcher == "alltoall" and L.ep > 1 and L.experts // L.ep > 1


def chunk_sort(L: LayerShape, name: str, received: int, cat: str) -> list[Step]:
    """sort_chunks_by_idxs (fused): make_chunk_sort_map and the copy of ``received`` tokens with their
    probabilities; backward (cat bwd) the copy alone. None without the sort."""
    if not _sorted(L):
        return []
    copy = _copy(name, received * (L.hx * L.dtype + SCORE_BYTES) * 2.0, cat)
    if cat == BWD:
        return [copy]
    chunks = L.ep * (L.experts // L.ep) * max(L.t, 1)
    return [_small(f"{name}_map", chunks * 4 * 3, cat), copy]


def unpermute(L: LayerShape, routed: int, cat: str) -> list[Kernel]:
    """The token copies back, summed per token: TE's unpermute, or unfused a zeroed output and a scatter_add_."""
    return _scatter_rows(L, "moe.unpermute", routed, cat)


def unpermute_backward(L: LayerShape, routed: int) -> list[Kernel]:
    """The unpermute's gradient: each token's gradient copied to its routed rows (TE's permute, or the
    gather that is scatter_add's backward)."""
    return _spread_rows(L, "moe.unpermute_bwd", routed, BWD)


def shared_split(L: LayerShape, shared: list[Step]) -> tuple[list[Step], list[Step]]:
    """With moe_shared_expert_overlap: (fc1 and its activation, fc2), run under the dispatch and the combine;
    else ([], [])."""
    if not (L.shared_overlap and shared and L.ep > 1 and L.dispatcher != "allgather"):
        return [], []
    slow = L.sm_slow if L.dispatcher == "flex" else 1.0
    out = [replace(st, slow=slow) if isinstance(st, Kernel) else st for st in shared]
    return out[:-1], out[-1:]


def _probs_bytes(L: LayerShape) -> int:
    return L.router_bytes or 4  # Megatron-Core's probabilities are fp32 unless moe_router_dtype says fp64


def _a2a_name(L: LayerShape, direction: str, tokens: int = 0, probs: bool = False) -> str:
    """The token all-to-all's collective: plain all_to_all when every rank receives the mean, else the
    routing-dependent plan (network/dispatch.py) with the busiest receiver's load over what is sent.
    hybridep also takes each rank's ``tokens`` (its 64-token pipeline), their row bytes, and whether the
    rows carry the routing probabilities (the dispatch and its gradient: fused_a2a.py ``HybridEPDispatch``)."""
    skew = L.rank_load / L.a2a_scale
    if L.dispatcher == "flex":
        extra = dict(tokens=tokens, row=L.hx * L.dtype, probs=float(probs)) if L.backend == "hybridep" else {}
        return dispatch_op(L.backend, direction, experts=L.experts, top_k=L.top_k, groups=L.groups or 1,
                           group_topk=L.group_topk or 1, load=skew, **extra)
    if skew == 1.0:
        return "all_to_all"
    return dispatch_op("all_to_all_v", direction, load=skew)


def _host_sync(cat: str) -> Kernel:
    return Kernel("moe.host_sync", "host", 0.0, 0.0, cat, seconds=HOST_SYNC_S)


def expert_padding(L: LayerShape, rows: int, cat: str, first: bool) -> list[Step]:
    """The experts' own alignment of quantised rows (LayerShape.pad_copies; layer.py "Quantised experts'
    alignment"): forward, TE's Fp8Padding copies the ``rows`` (``first``), then Fp8Unpadding copies them back after
    fc2; backward, the gradients' copies in reverse. A copy reads and writes rows of h. The counts it splits by
    (``tokens_per_expert.tolist()``) are already on the host: the alltoall dispatcher moved them at its sync point,
    DeepEP returns them as a list, so no sync of its own."""
    if not L.pad_copies:
        return []
    name = "moe.quant_pad" if first else "moe.quant_unpad"
    return [_copy(name + ("_bwd" if cat == BWD else ""), 2.0 * rows * L.hx * L.dtype, cat)]


def dispatch_steps(L: LayerShape, tokens: int, a2a: float, cat: str, under: list[Step]) -> list[Step]:
    """The forward dispatch of ``tokens`` (their routed copies ``a2a`` bytes), with ``under`` run under it. Without
    EP the alltoall dispatcher still reads the experts' counts on the host, for the grouped GEMM's splits
    (``cuda_sync_point`` "before_finish", or "before_permutation_2" unfused), but under drop and pad."""
    if L.ep <= 1:
        late = L.dispatcher == "alltoall" and L.experts and not L.drop_pad and not L.early_sync
        return [_host_sync(cat), *under] if late else list(under)
    routed = tokens * L.top_k
    if L.dispatcher == "allgather":
        return [Comm("moe.dispatch_routing", "ep", "all_gather", tokens * L.experts * (1 + _probs_bytes(L)) * L.ep,
                     0, cat),
                Comm("moe.dispatch", "ep", "all_gather", tokens * L.hx * L.dtype * L.ep, 0, cat), *under]
    if L.dispatcher == "flex":
        name = _a2a_name(L, "in", tokens, True)
        sync = [] if L.static_ep else [_host_sync(cat)]  # a static budget: num_permuted_tokens known on the host
        return [*sync, Comm("moe.dispatch", "ep", name, tokens * L.hx * L.dtype, len(under), cat), *under]
    probs = routed * _probs_bytes(L) * L.a2a_scale
    dispatch = Comm("moe.dispatch", "ep", _a2a_name(L, "in"), a2a + probs, len(under), cat)
    if L.drop_pad or L.early_sync:  # drop and pad: no count exchange nor sync; early: both before the permutation
        return [dispatch, *under]
    return [*_count_exchange(L, cat), dispatch, *under]


def combine_steps(L: LayerShape, tokens: int, a2a: float, cat: str, under: list[Step]) -> list[Step]:
    """The forward combine back to the tokens' ranks, with ``under`` run under it."""
    if L.ep <= 1:
        return list(under)
    if L.dispatcher == "allgather":
        return [Comm("moe.combine", "ep", "reduce_scatter", tokens * L.hx * L.dtype * L.ep, 0, cat), *under]
    nbytes = tokens * L.hx * L.dtype if L.dispatcher == "flex" else a2a
    return [Comm("moe.combine", "ep", _a2a_name(L, "out", tokens), nbytes, len(under), cat), *under]


def combine_backward(L: LayerShape, tokens: int, a2a: float) -> list[Step]:
    """The combine's gradient: towards the experts, as the dispatch."""
    if L.ep <= 1:
        return []
    if L.dispatcher == "allgather":
        return [Comm("moe.combine_bwd", "ep", "all_gather", tokens * L.hx * L.dtype * L.ep, 0, BWD)]
    nbytes = tokens * L.hx * L.dtype if L.dispatcher == "flex" else a2a
    return [Comm("moe.combine_bwd", "ep", _a2a_name(L, "in", tokens), nbytes, 0, BWD)]


def dispatch_backward(L: LayerShape, tokens: int, a2a: float) -> list[Step]:
    """The dispatch's gradient back to the tokens' ranks (alltoall: the probabilities' first)."""
    if L.ep <= 1:
        return []
    if L.dispatcher == "allgather":
        return [Comm("moe.dispatch_bwd", "ep", "reduce_scatter", tokens * L.hx * L.dtype * L.ep, 0, BWD)]
    if L.dispatcher == "flex":
        return [Comm("moe.dispatch_bwd", "ep", _a2a_name(L, "out", tokens, True), tokens * L.hx * L.dtype, 0,
                     BWD)]
    probs = tokens * L.top_k * _probs_bytes(L) * L.a2a_scale
    return [Comm("moe.dispatch_bwd", "ep", _a2a_name(L, "out"), a2a + probs, 0, BWD)]

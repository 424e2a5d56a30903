"""DeepSeek Sparse Attention (DSA): the lightning indexer, its top-k and the sparse multi-latent attention core.

Megatron-Core @ d98e8a64dd builds a layer with ``experimental_attention_variant: dsa`` (DeepSeek-V3.2, GLM-5) as
AbsorbedMLASelfAttention (megatron/core/transformer/experimental_attention_variant/absorbed_mla.py) around
DSAttention (dsa.py), and trains it through the fused kernels of its cuDNN backend (dsa_cudnn_kernels.py:
cudnn-frontend's indexer and FlashMLA's sparse attention). Per GPU and micro-batch, with T = b·s tokens of this CP
rank, S the whole sequence, a_l = a/t heads, r = kv_lora_rank, d_r the rope dims, d_n = d_qk − d_r, and the
indexer's H heads of D dims:

- absorbed MLA: no kv_up GEMM. The query's non-rope part takes the key up-projection's weight, a batched GEMM per
  head (``q_absorb``: T × r × d_n, a_l of them), so the core attends one shared key of r + d_r dims, the compressed
  key/value and its rope key, and returns a_l latent outputs of r dims, which the value up-projection's weight
  takes to d_v (``v_up``: T × d_v × r, a_l of them); both are torch.einsum in BF16;
- the indexer (DSAIndexer), on inputs it detaches from the model: linear_wq_b (q latent → H·D), linear_wk
  (h → D) with its LayerNorm, linear_weights_proj (h → H), rope and a Hadamard rotation of q and k; replicated over
  TP, so with sequence parallelism it all-gathers the layer input and the q latent first;
- its scores, Σ_heads w·ReLU(q·k) of every query and the keys it may attend (S/2 a query on average, causal),
  written in fp32 and read by a top-k that keeps dsa_indexer_topk = k keys a query (int32 indices);
- the sparse core (FlashMLA's sparse prefill): each query attends its top-k keys, K̄ = k − k²/(2S) a query on
  average (query i attends min(i + 1, k)), or S/2 when S ≤ k; 2·(r + d_r) + 2·r FLOPs a (query, key, head).
  FlashMLA runs a multiple of 64 local heads: fewer are padded to 64 (_flash_mla_head_padding), so TP past a/64
  costs FLOPs it does not save;
- context parallelism: only cp_comm_type all_gather (DSAttention asserts it): the compressed key and the indexer's
  key are all-gathered over the CP group, and backward the key's gradient reduce-scattered;
- the indexer's KL loss (dsa_indexer_loss_coeff > 0): the attention's head-summed distribution is recomputed as its
  target, over the top-k keys (dsa_indexer_use_sparse_loss) or over every key a query may attend, all-reduced over
  TP (each rank holds a_l heads), and the indexer has a backward: its scores' gradient, the key's gradient
  reduce-scattered over CP, and its three weights' gradients (its inputs are detached: no input gradients).
  Without the loss the indexer runs under no_grad: no backward at all.

The indexer's kernels, the sparse core and the loss are costed on the roofline by their FLOPs and bytes (kind
``sparse``: FLOPs at a large GEMM's efficiency), an ASSUMPTION: no DSA kernel timing is in ../shared/calibration.
Cross-layer top-k sharing (``dsa_indexer_topk_freq`` N > 1; dsa.py is_dsa_skip_topk_layer): only every N-th layer
past the offset builds an indexer; the layers between (LayerShape.dsa_skip, layer.attention_shape) reuse its top-k
indices and run only the latent key's CP gather and the sparse core: no indexer, no loss, no indexer backward. An
MTP module numbers its layers from 1 anew, so its first computes.

Left out: the indexer loss's fp32 target kept between its forward and backward, and the dense loss's reference
path that Megatron-Core takes under CP (the fused kernel declines a dense loss with varlen bounds).
"""
from __future__ import annotations

import math

from emulator.scenario.sparse_attention_rules import FLASH_MLA_HEADS
from emulator.workload.steps import BWD, Comm, Kernel, LayerShape, Step, elementwise, gemm

INDEX_BYTES = 4  # the top-k indices are int32 (dsa_cudnn_kernels.py _indexer_topk_bshd)
SCORE_BYTES = 4  # the indexer's scores and the loss's target are fp32


def mean_keys(S: int) -> float:
    """Keys a query may attend under the causal mask, on average over a sequence of S: S/2."""
    return S / 2


def mean_topk(S: int, k: int) -> float:
    """Keys a query attends through a top-k of k, on average: k − k²/(2S) (query i attends min(i + 1, k)), or
    the causal S/2 when S ≤ k."""
    return mean_keys(S) if S <= k else k - k * k / (2 * S)


def padded_heads(a_l: int) -> int:
    """The heads FlashMLA's sparse kernel runs for a_l local ones: at least FLASH_MLA_HEADS (fewer are padded)."""
    return max(a_l, FLASH_MLA_HEADS)


def _key_dims(L: LayerShape) -> int:
    """The shared key's dims: the compressed key/value and its rope key, r + d_r."""
    return L.kv_rank + L.rope_dim


def _q_in(L: LayerShape) -> int:
    """linear_wq_b's input: the q latent, or h without a query rank."""
    return L.q_rank or L.h


def _indexer_keys(L: LayerShape) -> float:
    """The keys the indexer's loss works over: the top-k (sparse loss) or every key a query may attend."""
    return mean_topk(L.s_kv, L.dsa_topk) if L.dsa_loss == 1 else mean_keys(L.s_kv)


def q_absorb(L: LayerShape, cat: str) -> Kernel:
    """The query's non-rope part times the key up-projection's weight, per head: T × r × d_n, a_l of them."""
    return gemm("q_absorb", L.T, L.kv_rank, L.d_qk - L.rope_dim, L, L.a_l, cat)


def v_up(L: LayerShape, cat: str) -> Kernel:
    """The latent outputs times the value up-projection's weight, per head: T × d_v × r, a_l of them."""
    return gemm("v_up", L.T, L.d_v, L.kv_rank, L, L.a_l, cat)


def _indexer_projections(L: LayerShape, cat: str) -> list[Step]:
    """The indexer's SP gathers, its three linears on all T tokens, k's norm, the rope and rotation of q and k."""
    H, D, T = L.dsa_heads, L.dsa_dim, L.T
    steps: list[Step] = []
    if L.t > 1 and L.sp:
        steps += [Comm("attn.indexer.ag_x", "tp", "all_gather", T * L.h * L.dtype, 0, cat),
                  Comm("attn.indexer.ag_qr", "tp", "all_gather", T * _q_in(L) * L.dtype, 0, cat)]
    steps += [gemm("attn.indexer.wq_b", T, H * D, _q_in(L), L, 1, cat),
              gemm("attn.indexer.wk", T, D, L.h, L, 1, cat),
              elementwise("attn.indexer.k_norm", T * D, 2.0, L, 8.0, cat),
              gemm("attn.indexer.weights_proj", T, H, L.h, L, 1, cat),
              elementwise("attn.indexer.rotate", T * (H + 1) * D, 4.0, L, math.log2(D) + 3.0, cat)]
    return steps


def _scores(L: LayerShape, cat: str) -> list[Step]:
    """The indexer's scores over the keys a query may attend (written in fp32) and their top-k."""
    H, D, T, S = L.dsa_heads, L.dsa_dim, L.T, L.s_kv
    pairs = T * mean_keys(S)
    written = float(T * S * SCORE_BYTES)
    return [Kernel("attn.indexer.scores", "sparse", 2.0 * pairs * H * D + 3.0 * pairs * H,
                   float((T * H * D + S * D) * L.dtype) + written, cat),
            Kernel("attn.indexer.topk", "elementwise", float(T * S), written + T * L.dsa_topk * INDEX_BYTES, cat)]


def _cp_gathers(L: LayerShape, cat: str) -> list[Step]:
    """Under CP (all_gather): the compressed key and (where the layer computes its top-k) the indexer's key of the
    whole sequence."""
    if L.cp <= 1:
        return []
    steps: list[Step] = [Comm("attn.kv_ag", "cp", "all_gather", L.cp * L.T * _key_dims(L) * L.dtype, 0, cat)]
    if not L.dsa_skip:
        steps.append(Comm("attn.indexer.k_ag", "cp", "all_gather", L.cp * L.T * L.dsa_dim * L.dtype, 0, cat))
    return steps


def _sparse_core(L: LayerShape, cat: str) -> Kernel:
    """FlashMLA's sparse forward: each query's top-k keys gathered, its padded heads attending them."""
    T, dq, dv, a = L.T, _key_dims(L), L.kv_rank, padded_heads(L.a_l)
    kbar = mean_topk(L.s_kv, L.dsa_topk)
    flops = 2.0 * T * a * kbar * (dq + dv)
    nbytes = float((T * a * (dq + dv) + T * kbar * dq) * L.dtype + T * L.dsa_topk * INDEX_BYTES + T * a * 4)
    return Kernel("attn.sparse", "sparse", flops, nbytes, cat)


def _loss_forward(L: LayerShape, cat: str) -> list[Step]:
    """The loss's target: the attention's scores recomputed over its keys, summed over the heads, all-reduced over
    TP."""
    if not L.dsa_loss:
        return []
    T, dq, a = L.T, _key_dims(L), padded_heads(L.a_l)
    keys = _indexer_keys(L)
    flops = 2.0 * T * a * keys * dq
    read = T * keys if L.dsa_loss == 1 else L.s_kv  # each query's own keys gathered, or the keys streamed once
    nbytes = float((T * a * dq + read * dq) * L.dtype + 2 * T * keys * SCORE_BYTES)
    steps: list[Step] = [Kernel("attn.indexer_loss", "sparse", flops, nbytes, cat)]
    if L.t > 1:
        steps.append(Comm("attn.indexer_loss.ar", "tp", "all_reduce", T * keys * SCORE_BYTES, 0, cat))
    return steps


def core_forward(L: LayerShape, cat: str) -> list[Step]:
    """DSAttention's forward: the indexer, the CP gathers, the scores and top-k, the sparse core, the loss; a layer
    that reuses an earlier one's top-k (``dsa_skip``) only the gathers and the core."""
    if L.dsa_skip:
        return [*_cp_gathers(L, cat), _sparse_core(L, cat)]
    return [*_indexer_projections(L, cat), *_cp_gathers(L, cat), *_scores(L, cat), _sparse_core(L, cat),
            *_loss_forward(L, cat)]


def _indexer_backward(L: LayerShape) -> list[Step]:
    """With the loss: the scores' gradient to the indexer's q, k and weights over the loss's keys, k's gradient
    reduce-scattered over CP, the rotation's and k norm's backward and the three weight gradients."""
    if not L.dsa_loss:
        return []
    H, D, T, S = L.dsa_heads, L.dsa_dim, L.T, L.s_kv
    keys = _indexer_keys(L)
    steps: list[Step] = [Kernel("attn.indexer_bwd", "sparse", 3 * 2.0 * T * keys * H * D,
                                float(2 * (T * H * D + S * D) * L.dtype + 2 * T * keys * SCORE_BYTES), BWD)]
    if L.cp > 1:
        steps.append(Comm("attn.indexer.dk_rs", "cp", "reduce_scatter", L.cp * T * D * L.dtype, 0, BWD))
    steps += [elementwise("attn.indexer.rotate_bwd", T * (H + 1) * D, 4.0, L, math.log2(D) + 3.0, BWD),
              gemm("attn.indexer.weights_proj.wgrad", L.h, H, T, L, 1, BWD),
              elementwise("attn.indexer.k_norm_bwd", T * D, 3.0, L, 10.0, BWD),
              gemm("attn.indexer.wk.wgrad", L.h, D, T, L, 1, BWD),
              gemm("attn.indexer.wq_b.wgrad", _q_in(L), H * D, T, L, 1, BWD)]
    return steps


def _sparse_core_backward(L: LayerShape) -> Kernel:
    """FlashMLA's sparse backward: the scores recomputed, dP and dV, dQ and the keys' gradient (S, dQ and dK of
    r + d_r dims, dP and dV of r: 2.53 times the forward's FLOPs), the gathered keys read and their gradient added
    into an fp32 buffer (an ASSUMPTION of its bytes)."""
    T, dq, dv, a = L.T, _key_dims(L), L.kv_rank, padded_heads(L.a_l)
    kbar = mean_topk(L.s_kv, L.dsa_topk)
    flops = 2.0 * T * a * kbar * (3 * dq + 2 * dv)
    nbytes = float(2 * T * a * (dq + dv) * L.dtype + T * kbar * dq * (L.dtype + 4) + T * L.dsa_topk * INDEX_BYTES)
    return Kernel("attn.sparse_bwd", "sparse", flops, nbytes, BWD)


def core_backward(L: LayerShape) -> list[Step]:
    """DSAttention's backward: the indexer's (with the loss), the sparse core's, and under CP the reduce-scatter of
    the gathered key's gradient."""
    steps: list[Step] = [*([] if L.dsa_skip else _indexer_backward(L)), _sparse_core_backward(L)]
    if L.cp > 1:
        steps.append(Comm("attn.dkv_rs", "cp", "reduce_scatter", L.cp * L.T * _key_dims(L) * L.dtype, 0, BWD))
    return steps


def absorb_backward(L: LayerShape, name: str, m: int, n_out: int, k_in: int) -> list[Step]:
    """A per-head einsum's backward: the input's gradient (m × k_in) then the weight's (k_in × n_out), a_l each."""
    return [gemm(f"{name}.dgrad", m, k_in, n_out, L, L.a_l, BWD), gemm(f"{name}.wgrad", k_in, n_out, m, L, L.a_l, BWD)]


def kv_grad_comm(L: LayerShape) -> list[Step]:
    """The compressed key's gradient summed over TP (each rank's heads give a part): reduce-scattered with SP
    (the backward of its gather), else all-reduced; under the next two kernels."""
    if L.t <= 1:
        return []
    op = "reduce_scatter" if L.sp else "all_reduce"
    return [Comm(f"kv.{'rs' if L.sp else 'ar'}_dgrad", "tp", op, L.T * _key_dims(L) * L.dtype, 2, BWD)]

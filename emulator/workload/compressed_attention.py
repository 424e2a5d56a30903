"""DeepSeek-V4's hybrid attention (``model.experimental_attention_variant: dsv4_hybrid``): the compressors, the
indexer and the sparse core of a layer at its compression ratio.

DeepSeek-V4 (HF transformers 5.25 modeling_deepseek_v4.py, DeepseekV4Attention; Megatron-Bridge 067f987df builds it
as Megatron-Core's dev-branch DSv4HybridSelfAttention and counts its FLOPs in training/utils/flop_utils.py) gives
each layer one shared key/value head of D = head_dim dims (multi-query: the same tensor is the key and the value)
and a per-layer compression ratio m (``csa_compress_ratios``):

- m = 0, sliding attention: each query attends its last w = csa_window_size keys;
- m = 4, compressed sparse attention (CSA): a compressor pools every 4 tokens (in overlapping windows of 8: its
  kv_proj and gate_proj are 2D wide) into one key; the lightning indexer (its own compressor of 2·D_I, q_b from
  the query latent, weights_proj) scores every earlier compressed key, Σ_heads w·ReLU(q·k), and keeps
  dsa_indexer_topk = k of them; each query attends its window and its top-k;
- m = 128, heavily compressed attention (HCA): a compressor of D pools every 128 tokens; each query attends its
  window and every earlier compressed key.

Per GPU and micro-batch (T = b·s tokens, S the sequence, a_l = a/t heads; context parallelism is refused, as the
rule book says), this module gives the steps between the projections and the output projection, which layer.py
builds as it builds multi-latent attention's (q_a and kv_proj replicated over TP, q_b column-parallel, o_b
row-parallel; the TP split is an ASSUMPTION: Megatron-Bridge's DeepSeek-V4 recipes run tp 1):

- the compressor: kv_proj and gate_proj as one GEMM on Te tokens (2w columns: w = 2D at 4, D at 128), the softmax-
  gated pooling (reads the 2w columns, writes T/m keys), the keys' norm and rope, gathered over TP with sequence
  parallelism;
- the indexer (m = 4), replicated over TP as DSA's: its compressor (4·D_I columns), q_b on the T gathered query
  latents, weights_proj on the gathered layer input, its rope, the scores of each query over the S/(2m) compressed
  keys it may see (fp32) and their top-k (int32);
- the core (kind ``sparse``, FLOPs at a large GEMM's efficiency: an ASSUMPTION, no DeepSeek-V4 kernel is in
  ../shared/calibration): 4·D FLOPs a (query, key, head) over the window's w − w²/(2S) keys a query on average
  and the compressed ones, k − k²/(2·S/4) at 4 (sparse_attention.mean_topk over S/4) and S/256 at 128, its heads
  padded to 64 as FlashMLA's sparse kernel pads them (D = 512 is FlashMLA's value width); the sinks' extra logit
  a head is in its softmax. Its memory traffic reads each distinct key once (:func:`unique_keys`): the keys a
  query shares with its neighbours stay in the cache;
- the indexer's KL loss at 4 (dsa_indexer_loss_coeff > 0) as DSA's (sparse_attention.py), over the compressed
  keys; without it the indexer runs without gradients.

Backward: the core's (2.5 times its forward's FLOPs, as FlashMLA's sparse backward), the compressor's pooling and
GEMM, and with the loss the indexer's. Hash-routed MoE layers (DeepSeek-V4's first three) are costed as routed
ones: the same GEMMs, the router's scores from the same weight.
"""
from __future__ import annotations

from emulator.workload.sparse_attention import INDEX_BYTES, SCORE_BYTES, mean_topk, padded_heads
from emulator.workload.steps import BWD, Comm, Kernel, LayerShape, Step, elementwise, gemm, linear_backward

CSA, HCA = 4, 128  # the compression ratios Megatron-Bridge's flop_utils.py supports, with 0


def window_keys(S: int, w: int) -> float:
    """Keys a query attends in its window, on average: w − w²/(2S) (query i attends min(i + 1, w)), or S/2."""
    return S / 2 if S <= w else w - w * w / (2 * S)


def compressed_keys(S: int, ratio: int, k: int) -> float:
    """Compressed keys a query attends, on average: its top-k of the S/4 (CSA), every one of the S/128 (HCA: S/256
    on average), none at 0."""
    if ratio == CSA:
        return mean_topk(S // CSA, k)
    return S / (2 * HCA) if ratio == HCA else 0.0


def width(L: LayerShape) -> int:
    """The compressor's kv_proj (and gate_proj) width: 2D at 4 (overlapping windows), D at 128."""
    return 2 * L.d if L.csa == CSA else L.d


def _gather(L: LayerShape, name: str, tokens: float, dims: int, cat: str) -> list[Step]:
    """Under sequence parallelism, ``tokens`` rows of ``dims`` gathered over TP (the compressed keys)."""
    if L.t > 1 and L.sp:
        return [Comm(name, "tp", "all_gather", tokens * dims * L.dtype, 0, cat)]
    return []


def compressor(L: LayerShape, cat: str) -> list[Step]:
    """The layer's compressor: its GEMM on Te tokens, the pooling, the keys' norm and rope, the SP gather."""
    if not L.csa:
        return []
    w, m = width(L), L.csa
    return [gemm("compress.proj", L.Te, 2 * w, L.h, L, 1, cat),
            elementwise("compress.pool", L.Te * 2 * w, 1.0 + 1.0 / (2 * m), L, 6.0, cat),
            elementwise("compress.norm_rope", L.Te / m * L.d, 3.0, L, 10.0, cat),
            *_gather(L, "compress.ag", L.T / m, L.d, cat)]


def _indexer(L: LayerShape, cat: str) -> list[Step]:
    """The indexer of a CSA layer: the SP gather of the layer input, its compressor, q_b, weights_proj, the rope,
    the scores over the compressed keys a query may see and their top-k."""
    H, DI, T, S = L.dsa_heads, L.dsa_dim, L.T, L.s_kv
    steps: list[Step] = []
    if L.t > 1 and L.sp:
        steps.append(Comm("attn.indexer.ag_x", "tp", "all_gather", T * L.h * L.dtype, 0, cat))
    keys = S / CSA
    pairs = T * keys / 2
    written = float(T * keys * SCORE_BYTES)
    steps += [gemm("attn.indexer.compress", L.Te, 4 * DI, L.h, L, 1, cat),
              elementwise("attn.indexer.pool", L.Te * 4 * DI, 1.0 + 1.0 / (2 * CSA), L, 6.0, cat),
              *_gather(L, "attn.indexer.k_ag", T / CSA, DI, cat),
              gemm("attn.indexer.q_b", T, H * DI, L.q_rank, L, 1, cat),
              gemm("attn.indexer.weights_proj", T, H, L.h, L, 1, cat),
              elementwise("attn.indexer.rope", T * H * L.rope_dim, 2.0, L, 3.0, cat),
              Kernel("attn.indexer.scores", "sparse", 2.0 * pairs * H * DI + 3.0 * pairs * H,
                     float((T * H * DI + keys * DI) * L.dtype) + written, cat),
              Kernel("attn.indexer.topk", "elementwise", T * keys, written + T * L.dsa_topk * INDEX_BYTES, cat)]
    return steps


def _keys(L: LayerShape) -> float:
    """Keys a query attends: its window's and the compressed ones."""
    return window_keys(L.s_kv, L.csa_window) + compressed_keys(L.s_kv, L.csa, L.dsa_topk)


def unique_keys(L: LayerShape) -> float:
    """The distinct keys the core reads from memory, once each: the sequence's keys, which the windows slide over,
    and its compressed ones (an ASSUMPTION: the cache keeps what neighbouring queries share, a window's 128 keys and
    the S/4 or S/128 compressed keys of D dims, 1 MB at 4,096 tokens and ratio 4; DSA's top-k over a 576-dim
    latent of the whole sequence, 151 MB at 131,072 tokens, is read per query: sparse_attention.py)."""
    return L.s_kv + (L.s_kv / L.csa if L.csa else 0.0)


def _core(L: LayerShape, cat: str) -> Kernel:
    """The sparse core: each query's window and compressed keys, its padded heads attending them (QK and PV over D
    each); it reads the query, writes the output and its log-sum-exp, reads the top-k indices and the keys
    (:func:`unique_keys`)."""
    T, D, a, keys = L.T, L.d, padded_heads(L.a_l), _keys(L)
    index = T * L.dsa_topk * INDEX_BYTES if L.csa == CSA else 0
    nbytes = float((2 * T * a * D + unique_keys(L) * D) * L.dtype + index + T * a * 4)
    return Kernel("attn.core", "sparse", 2.0 * T * a * keys * 2 * D, nbytes, cat)


def _loss_keys(L: LayerShape) -> float:
    """The compressed keys the indexer's loss works over: the top-k (sparse loss) or every one a query may see."""
    S = L.s_kv // CSA
    return mean_topk(S, L.dsa_topk) if L.dsa_loss == 1 else S / 2


def _loss(L: LayerShape, cat: str) -> list[Step]:
    """The indexer's loss target at a CSA layer: the core's scores over its compressed keys, summed over the heads,
    all-reduced over TP."""
    if L.csa != CSA or not L.dsa_loss:
        return []
    T, D, a, keys = L.T, L.d, padded_heads(L.a_l), _loss_keys(L)
    read = L.s_kv / CSA  # the compressed keys, once each (unique_keys)
    steps: list[Step] = [Kernel("attn.indexer_loss", "sparse", 2.0 * T * a * keys * D,
                                float((T * a * D + read * D) * L.dtype + 2 * T * keys * SCORE_BYTES), cat)]
    if L.t > 1:
        steps.append(Comm("attn.indexer_loss.ar", "tp", "all_reduce", T * keys * SCORE_BYTES, 0, cat))
    return steps


def core_forward(L: LayerShape, cat: str) -> list[Step]:
    """Between the projections and o_a: the compressor, the indexer (CSA), the core, the loss, the output's
    inverse rope."""
    steps = compressor(L, cat) + (_indexer(L, cat) if L.csa == CSA else [])
    return [*steps, _core(L, cat), *_loss(L, cat),
            elementwise("attn.inv_rope", L.T * L.a_l * L.rope_dim, 2.0, L, 3.0, cat)]


def _indexer_backward(L: LayerShape) -> list[Step]:
    """With the loss, at a CSA layer: the scores' gradient to q, k and the weights over the loss's keys, the keys'
    gradient reduce-scattered over TP with SP, the pooling's backward and the weight gradients."""
    if L.csa != CSA or not L.dsa_loss:
        return []
    H, DI, T = L.dsa_heads, L.dsa_dim, L.T
    keys, S = _loss_keys(L), L.s_kv / CSA
    steps: list[Step] = [Kernel("attn.indexer_bwd", "sparse", 3 * 2.0 * T * keys * H * DI,
                                float(2 * (T * H * DI + S * DI) * L.dtype + 2 * T * keys * SCORE_BYTES), BWD)]
    if L.t > 1 and L.sp:
        steps.append(Comm("attn.indexer.dk_rs", "tp", "reduce_scatter", S * DI * L.dtype, 0, BWD))
    steps += [elementwise("attn.indexer.rope_bwd", T * H * L.rope_dim, 2.0, L, 3.0, BWD),
              gemm("attn.indexer.weights_proj.wgrad", L.h, H, T, L, 1, BWD),
              gemm("attn.indexer.q_b.wgrad", L.q_rank, H * DI, T, L, 1, BWD),
              elementwise("attn.indexer.pool_bwd", L.Te * 4 * DI, 2.5, L, 8.0, BWD),
              gemm("attn.indexer.compress.wgrad", L.h, 4 * DI, L.Te, L, 1, BWD)]
    return steps


def _core_backward(L: LayerShape) -> Kernel:
    """The sparse core's backward: the scores recomputed, dP and dV, dQ and dK (5·D FLOPs a pair and head against the
    forward's 2·D: 2.5 times); it reads the query, the output, their gradients and the log-sum-exp, writes dQ, reads
    the keys and adds their gradient into an fp32 buffer (:func:`unique_keys` each, an ASSUMPTION)."""
    T, D, a, keys = L.T, L.d, padded_heads(L.a_l), _keys(L)
    nbytes = float(5 * T * a * D * L.dtype + unique_keys(L) * D * (L.dtype + 4) + T * a * 4)
    return Kernel("attn.core_bwd", "sparse", 2.0 * T * a * keys * 5 * D, nbytes, BWD)


def compressor_backward(L: LayerShape) -> list[Step]:
    """The compressor's backward: the keys' gradient reduce-scattered over TP with SP, the norm's and the pooling's
    backward, its GEMM's dgrad and wgrad."""
    if not L.csa:
        return []
    w, m = width(L), L.csa
    steps: list[Step] = []
    if L.t > 1 and L.sp:
        steps.append(Comm("compress.rs_grad", "tp", "reduce_scatter", L.T / m * L.d * L.dtype, 0, BWD))
    return steps + [elementwise("compress.norm_rope_bwd", L.Te / m * L.d, 4.0, L, 12.0, BWD),
                    elementwise("compress.pool_bwd", L.Te * 2 * w, 2.5, L, 8.0, BWD),
                    *linear_backward(L, "compress.proj", L.Te, 2 * w, L.h)]


def core_backward(L: LayerShape) -> list[Step]:
    """The inverse rope's, the indexer's (with the loss), the core's and the compressor's backward."""
    return [elementwise("attn.inv_rope_bwd", L.T * L.a_l * L.rope_dim, 2.0, L, 3.0, BWD), *_indexer_backward(L),
            _core_backward(L), *compressor_backward(L)]

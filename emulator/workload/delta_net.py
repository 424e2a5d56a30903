"""A gated delta net's kernels on one GPU, between its tensor-parallel communications (a hybrid model's G layer).

Megatron-Core's training path (megatron/core/ssm/gated_delta_net/gdn.py and common.py @ d98e8a64dd,
``GatedDeltaNet.forward``, ``_prepare_input_for_gated_delta_rule``) runs, per micro-batch of T tokens, with
K_l = K/t key heads of d_k, V_l = V/t value heads of d_v (workload/hybrid.py, DeltaDims):

    forward:  in_proj GEMM T×h → T×(2·K_l·d_k + 2·V_l·d_v + 2·V_l) · the causal conv1d over q, k, v (SiLU) ·
              the L2 norm of q and k · q and k repeated to the V_l value heads (repeat_interleave, where V > K) ·
              the gates (beta, the decay g, in fp32) · flash-linear-attention's chunk_gated_delta_rule ·
              the gated RMSNorm (the output times SiLU(z)) · out_proj GEMM T×V_l·d_v → T×h
    backward: the reverse, the rule's backward recomputing its chunk states

The layer (layer.py) wraps it as a Mamba layer: pre-norm, the SP all-gather into in_proj, the reduce-scatter (or
all-reduce) out of out_proj, the residual add.

The chunked rule (FLA's WY representation, chunks of C = 64; Yang et al. 2024, arXiv 2412.06464, section 3) is
costed as one kernel by its FLOPs and bytes on the roofline (kind ``scan``), an ASSUMPTION as the Mamba-2 scan: no
timing of it is in ../shared/calibration. Per token and value head:

    FLOPs  2·C·d_k (β·K·Kᵀ in the chunk) + 2/3·C² (its triangular inverse) + 2·C·(d_k + d_v) (W and U)
           + 4·d_k·d_v (the chunk state's update, Kᵀ·(U − W·S)) + 2·d_k·d_v (Q·S) + 2·C·(d_k + d_v) (Q·Kᵀ masked,
           times U − W·S)
    bytes  q, k, v and the output in the activations' type, 2·d_k + 2·d_v; g and beta in fp32, 8; W and U
           written and read, 2·(d_k + d_v) of the activations' type; the chunk's C×C inverse in fp32 written and
           read, 8·C; the chunk states (d_k·d_v per C tokens) written and read in fp32, 8·d_k·d_v/C.

Its backward takes each product's two gradient products and recomputes the chunk states: 2·forward FLOPs +
4·d_k·d_v a token and head, and twice the forward's bytes (an ASSUMPTION of the same kind). Left out: the
transposes of in_proj's output (copies of a few MB), context parallelism (refused: scenario/hybrid_rules.py).
"""
from __future__ import annotations

from emulator.workload.steps import BWD, Kernel, LayerShape, Step, elementwise, gemm, linear_backward

CHUNK = 64  # GatedDeltaNet.chunk_size; FLA's chunk_gated_delta_rule's BT


def local_dims(L: LayerShape) -> tuple[int, int, int, int]:
    """(K_l·d_k, V_l·d_v, V_l, in_proj's outputs) on one TP rank."""
    qk = L.g_key_heads // L.t * L.g_key_dim
    heads = L.g_value_heads // L.t
    v = heads * L.g_value_dim
    return qk, v, heads, 2 * qk + 2 * v + 2 * heads


def rule_flops(L: LayerShape) -> float:
    """The chunked rule's forward FLOPs (module docstring)."""
    dk, dv, c = L.g_key_dim, L.g_value_dim, CHUNK
    heads = local_dims(L)[2]
    return float(L.T * heads) * (2 * c * dk + 2 * c * c / 3 + 4 * c * (dk + dv) + 6 * dk * dv)


def rule_bytes(L: LayerShape) -> float:
    """The chunked rule's forward bytes (module docstring)."""
    dk, dv, c = L.g_key_dim, L.g_value_dim, CHUNK
    heads = local_dims(L)[2]
    per = L.dtype * (2 * dk + 2 * dv) + 8 + 2 * L.dtype * (dk + dv) + 8 * c + 8 * dk * dv / c
    return float(L.T * heads) * per


def _repeat(L: LayerShape, name: str, cat: str) -> list[Step]:
    """q and k repeated from K_l to V_l heads (a copy), where there are fewer key heads than value heads."""
    qk, _, heads, _ = local_dims(L)
    if L.g_value_heads == L.g_key_heads:
        return []
    return [Kernel(name, "copy", 0.0, float(L.T * (2 * qk + 2 * heads * L.g_key_dim) * L.dtype), cat)]


def _conv(L: LayerShape, name: str, passes: float, cat: str) -> Kernel:
    qk, v, _, _ = local_dims(L)
    return elementwise(name, L.T * (2 * qk + v), passes, L, 2 * L.g_conv + 4, cat)


def delta_forward(L: LayerShape, cat: str) -> list[Step]:
    """in_proj to out_proj (module docstring)."""
    qk, v, heads, width = local_dims(L)
    T = L.T
    return [gemm("gdn.in_proj", T, width, L.h, L, 1, cat), _conv(L, "gdn.conv1d", 2.0, cat),
            elementwise("gdn.l2norm", T * 2 * qk, 2.0, L, 4.0, cat), *_repeat(L, "gdn.repeat", cat),
            Kernel("gdn.gates", "elementwise", 8.0 * T * heads, 16.0 * T * heads, cat),
            Kernel("gdn.rule", "scan", rule_flops(L), rule_bytes(L), cat),
            elementwise("gdn.norm", T * v, 3.0, L, 10.0, cat),
            gemm("gdn.out_proj", T, L.h, v, L, 1, cat)]


def delta_backward(L: LayerShape) -> list[Step]:
    """out_proj's backward to in_proj's output gradient (in_proj's own backward is the layer's)."""
    qk, v, heads, _ = local_dims(L)
    T = L.T
    states = 4.0 * T * heads * L.g_key_dim * L.g_value_dim  # the chunk states recomputed
    return [*linear_backward(L, "gdn.out_proj", T, L.h, v),
            elementwise("gdn.norm_bwd", T * v, 5.0, L, 14.0, BWD),
            Kernel("gdn.rule_bwd", "scan", 2 * rule_flops(L) + states, 2 * rule_bytes(L), BWD),
            Kernel("gdn.gates_bwd", "elementwise", 8.0 * T * heads, 24.0 * T * heads, BWD),
            *_repeat(L, "gdn.repeat_bwd", BWD),
            elementwise("gdn.l2norm_bwd", T * 2 * qk, 3.0, L, 8.0, BWD),
            _conv(L, "gdn.conv1d_bwd", 3.0, BWD)]

"""A Mamba-2 mixer's kernels on one GPU, between its tensor-parallel communications (a hybrid model's M layer).

Megatron-Core's training path (megatron/core/ssm/mamba_mixer.py @ d98e8a64dd, ``MambaMixer.forward`` and
``_ssm_training``) runs, per micro-batch of T tokens, with H_l = H/t heads of P dims, G_l = G/t groups of state N,
d_l = H_l·P and chunk Q (workload/hybrid.py):

    forward:  in_proj GEMM T×h → T×(2·d_l + 2·G_l·N + H_l) · transpose (l b d → b l d, contiguous) ·
              mamba_split_conv1d_scan_combined: the causal conv1d over x, B, C, then the chunked scan (SSD) ·
              transpose back · the grouped RMSNorm · out_proj GEMM T×d_l → T×h
    backward: out_proj dgrad, wgrad · norm backward · transpose · the combined function's backward: the conv1d
              rerun (it is not saved), the scan's backward, the conv1d's backward · transpose · in_proj dgrad, wgrad

The layer (layer.py) wraps it with its pre-norm, the sequence-parallel all-gather into in_proj, the
reduce-scatter (or all-reduce) out of out_proj and the residual add, as an attention block. The transposes are
copies only where a micro-batch holds more than one sequence: with one, both layouts are the same memory.

The scan is mamba_ssm's chunked SSD (ssd_combined.py @ e9594ce, ``_mamba_chunk_scan_combined_fwd``: five Triton
kernels, chunk_cumsum, chunk_state, state_passing, bmm_chunk, chunk_scan), costed as one kernel by its FLOPs and
bytes on the roofline (compute.roofline_time: FLOPs at a large GEMM's efficiency, bytes at the streaming one), an
ASSUMPTION: no measured SSD timing is in ../shared/calibration. Per token (Dao & Gu 2024, section 6, the SSD
algorithm's four steps):

    FLOPs  2·H_l·P·N (chunk states, Bᵀx) + 2·Q·G_l·N (C·Bᵀ in the chunk) + 2·Q·H_l·P (the diagonal blocks)
           + 2·H_l·P·N (the off-diagonal blocks, C·states)
    bytes  x, z and the output twice (out and out_x) in the activations' type, 4·d_l of them; B and C read twice
           (chunk_state and bmm_chunk, bmm_chunk and chunk_scan), 4·G_l·N; dt and its cumulative sum in fp32, read
           and written, 4·2·H_l; C·Bᵀ in fp32 (``output_dtype=torch.float32``) written and read, 8·G_l·Q; the chunk
           states (H_l·P·N per Q tokens) written by chunk_state in fp32 (``states_in_fp32=True``), read by
           state_passing, which writes them in C's type (Megatron-Core's ``mamba_training_ssm_states_dtype`` left
           unset), read by chunk_scan: (4 + 4 + 2 + 2)·d_l·N/Q with 2-byte activations.

Its backward (``_mamba_chunk_scan_combined_bwd``) recomputes the chunk states and takes each forward product's two
gradient products: 2·forward FLOPs + 2·H_l·P·N, and twice the forward's bytes (it reads the forward's operands and
the output gradient and writes their gradients), an ASSUMPTION of the same kind. The causal conv1d
(causal_conv1d_fwd, D_CONV taps with SiLU) reads and writes its d_l + 2·G_l·N channels, 2 passes; its backward
reads the gradient and the input and writes the input gradient, 3 passes. The grouped RMSNorm is a norm over d_l,
2 passes forward and 3 backward; each transpose is a copy, 2 passes.
"""
from __future__ import annotations

from emulator.workload import hybrid
from emulator.workload.steps import BWD, Kernel, LayerShape, Step, elementwise, gemm, linear_backward


def local_dims(L: LayerShape) -> tuple[int, int, int, int]:
    """(H_l heads, G_l groups, d_l = H_l·P, in_proj's outputs) on one TP rank."""
    heads, groups = L.m_heads // L.t, L.m_groups // L.t
    d_l = heads * L.m_head_dim
    return heads, groups, d_l, 2 * d_l + 2 * groups * L.m_state + heads


def scan_flops(L: LayerShape) -> float:
    """The chunked scan's forward FLOPs for T tokens (module docstring)."""
    heads, groups, d_l, _ = local_dims(L)
    n, q = L.m_state, hybrid.CHUNK
    return float(L.T) * (4 * d_l * n + 2 * q * groups * n + 2 * q * d_l)


def scan_bytes(L: LayerShape) -> float:
    """The chunked scan's forward bytes for T tokens (module docstring)."""
    heads, groups, d_l, _ = local_dims(L)
    n, q = L.m_state, hybrid.CHUNK
    per_token = L.dtype * (4 * d_l + 4 * groups * n) + 8 * heads + 8 * groups * q + (8 + 2 * L.dtype) * d_l * n / q
    return float(L.T) * per_token


def _conv(L: LayerShape, name: str, passes: float, cat: str) -> Kernel:
    """The causal conv1d over x, B and C: D_CONV multiply-adds and a SiLU per element."""
    _, groups, d_l, _ = local_dims(L)
    return elementwise(name, L.T * (d_l + 2 * groups * L.m_state), passes, L, 2 * hybrid.D_CONV + 4, cat)


def _transpose(L: LayerShape, name: str, width: int, cat: str) -> list[Step]:
    """A transpose between the sequence-first and the batch-first layout of T × ``width``: a copy, but for one
    sequence a micro-batch, whose two layouts are the same memory (``contiguous()`` returns the tensor itself)."""
    return [Kernel(name, "copy", 0.0, 2.0 * L.T * width * L.dtype, cat)] if L.b > 1 else []


def mixer_forward(L: LayerShape, cat: str) -> list[Step]:
    """in_proj to out_proj (module docstring)."""
    _, _, d_l, width = local_dims(L)
    T = L.T
    return [gemm("mamba.in_proj", T, width, L.h, L, 1, cat), *_transpose(L, "mamba.transpose_in", width, cat),
            _conv(L, "mamba.conv1d", 2.0, cat),
            Kernel("mamba.ssd", "scan", scan_flops(L), scan_bytes(L), cat),
            *_transpose(L, "mamba.transpose_out", d_l, cat),
            elementwise("mamba.norm", T * d_l, 2.0, L, 8.0, cat),
            gemm("mamba.out_proj", T, L.h, d_l, L, 1, cat)]


def mixer_backward(L: LayerShape) -> list[Step]:
    """out_proj's backward to in_proj's output gradient (in_proj's own backward, with its TP communication, is the
    layer's): the reverse of :func:`mixer_forward`, the conv1d rerun first."""
    heads, _, d_l, width = local_dims(L)
    T = L.T
    state = 2.0 * T * heads * L.m_head_dim * L.m_state  # the chunk states recomputed
    return [*linear_backward(L, "mamba.out_proj", T, L.h, d_l),
            elementwise("mamba.norm_bwd", T * d_l, 3.0, L, 10.0, BWD),
            *_transpose(L, "mamba.transpose_out_bwd", d_l, BWD),
            _conv(L, "mamba.conv1d_rerun", 2.0, BWD),
            Kernel("mamba.ssd_bwd", "scan", 2 * scan_flops(L) + state, 2 * scan_bytes(L), BWD),
            _conv(L, "mamba.conv1d_bwd", 3.0, BWD),
            *_transpose(L, "mamba.transpose_in_bwd", width, BWD)]

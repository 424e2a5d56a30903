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
from emulator.workload.steps import BWD, Comm, Kernel, LayerShape, Step, elementwise, gemm, linear_backward


def local_dims(L: LayerShape) -> tuple[int, int, int, int]:
    """(H_l heads, G_l groups, d_l = H_l·P, in_proj's outputs) on one TP rank."""
    heads, groups = L.m_heads // L.t, L.m_groups // L.t
    d_l = heads * L.m_head_dim
    return heads, groups, d_l, 2 * d_l + 2 * groups * L.m_state + heads


def scan_dims(L: LayerShape) -> tuple[int, int, int, int]:
    """(tokens, heads, groups, d) the conv1d and the scan run on: this rank's T tokens of H_l heads, or with
    context parallelism (Megatron-Core's MambaContextParallel, megatron/core/ssm/mamba_context_parallel.py @
    d98e8a64dd) the whole sequence, cp·T tokens, of H_l/cp heads and G_l·r/cp groups, r = cp/G_l where G_l < cp
    (each group's state repeated on the ranks that share it)."""
    heads, groups, d_l, _ = local_dims(L)
    cp = L.cp
    if cp <= 1:
        return L.T, heads, groups, d_l
    r = cp // groups if groups < cp else 1
    return L.T * cp, heads // cp, groups * r // cp, d_l // cp


def scan_flops(L: LayerShape) -> float:
    """The chunked scan's forward FLOPs (module docstring)."""
    tokens, _, groups, d = scan_dims(L)
    n, q = L.m_state, hybrid.CHUNK
    return float(tokens) * (4 * d * n + 2 * q * groups * n + 2 * q * d)


def scan_bytes(L: LayerShape) -> float:
    """The chunked scan's forward bytes (module docstring)."""
    tokens, heads, groups, d = scan_dims(L)
    n, q = L.m_state, hybrid.CHUNK
    per_token = L.dtype * (4 * d + 4 * groups * n) + 8 * heads + 8 * groups * q + (8 + 2 * L.dtype) * d * n / q
    return float(tokens) * per_token


def _conv(L: LayerShape, name: str, passes: float, cat: str) -> Kernel:
    """The causal conv1d over x, B and C: D_CONV multiply-adds and a SiLU per element."""
    tokens, _, groups, d = scan_dims(L)
    return elementwise(name, tokens * (d + 2 * groups * L.m_state), passes, L, 2 * hybrid.D_CONV + 4, cat)


# Context parallelism (Megatron-Core's MambaContextParallel): ``pre_conv_ssm`` splits in_proj's output and turns each
# of z, x, B, C (their group states repeated r times) and dt from this rank's T tokens of all its heads into the whole
# sequence of 1/cp of them (all_to_all_cp2hp, five all-to-alls of this rank's tensor each), concatenates them and
# undoes the attention's load balancing (a reordering torch.cat): two copies of the result; ``post_conv_ssm`` redoes
# the balancing (a copy) and turns the scan's output back (all_to_all_hp2cp, one all-to-all). The backward runs the
# same in reverse.

def _cp_pieces(L: LayerShape) -> list[tuple[str, int]]:
    """(name, width) of the tensors pre_conv_ssm exchanges, per token of this rank."""
    heads, groups, d_l, _ = local_dims(L)
    r = L.cp // groups if groups < L.cp else 1
    return [("z", d_l), ("x", d_l), ("B", groups * r * L.m_state), ("C", groups * r * L.m_state), ("dt", heads)]


def _cp_in(L: LayerShape, cat: str) -> list[Step]:
    if L.cp <= 1:
        return []
    pieces = _cp_pieces(L)
    grad = "_bwd" if cat == BWD else ""
    a2a: list[Step] = [Comm(f"mamba.cp_a2a.{name}{grad}", "cp", "all_to_all", L.T * w * L.dtype, 0, cat)
                       for name, w in pieces]
    nbytes = 2.0 * L.T * sum(w for _, w in pieces) * L.dtype
    copies: list[Step] = [Kernel(f"mamba.cp_cat{grad}", "copy", 0.0, nbytes, cat),
                          Kernel(f"mamba.cp_reorder{grad}", "copy", 0.0, nbytes, cat)]
    return a2a + copies if cat != BWD else copies + a2a


def _cp_out(L: LayerShape, cat: str) -> list[Step]:
    if L.cp <= 1:
        return []
    d_l = local_dims(L)[2]
    grad = "_bwd" if cat == BWD else ""
    steps: list[Step] = [Kernel(f"mamba.cp_reorder_out{grad}", "copy", 0.0, 2.0 * L.T * d_l * L.dtype, cat),
                         Comm(f"mamba.cp_a2a.y{grad}", "cp", "all_to_all", L.T * d_l * L.dtype, 0, cat)]
    return steps if cat != BWD else steps[::-1]


def _transpose(L: LayerShape, name: str, width: int, cat: str) -> list[Step]:
    """A transpose between the sequence-first and the batch-first layout of T × ``width``: a copy, but for one
    sequence a micro-batch, whose two layouts are the same memory (``contiguous()`` returns the tensor itself)."""
    return [Kernel(name, "copy", 0.0, 2.0 * L.T * width * L.dtype, cat)] if L.b > 1 else []


def mixer_forward(L: LayerShape, cat: str) -> list[Step]:
    """in_proj to out_proj (module docstring)."""
    _, _, d_l, width = local_dims(L)
    T = L.T
    return [gemm("mamba.in_proj", T, width, L.h, L, 1, cat), *_cp_in(L, cat),
            *_transpose(L, "mamba.transpose_in", width, cat), _conv(L, "mamba.conv1d", 2.0, cat),
            Kernel("mamba.ssd", "scan", scan_flops(L), scan_bytes(L), cat),
            *_transpose(L, "mamba.transpose_out", d_l, cat), *_cp_out(L, cat),
            elementwise("mamba.norm", T * d_l, 2.0, L, 8.0, cat),
            gemm("mamba.out_proj", T, L.h, d_l, L, 1, cat)]


def mixer_backward(L: LayerShape) -> list[Step]:
    """out_proj's backward to in_proj's output gradient (in_proj's own backward, with its TP communication, is the
    layer's): the reverse of :func:`mixer_forward`, the conv1d rerun first."""
    _, _, d_l, width = local_dims(L)
    T = L.T
    tokens, _, _, d = scan_dims(L)
    state = 2.0 * tokens * d * L.m_state  # the chunk states recomputed
    return [*linear_backward(L, "mamba.out_proj", T, L.h, d_l),
            elementwise("mamba.norm_bwd", T * d_l, 3.0, L, 10.0, BWD), *_cp_out(L, BWD),
            *_transpose(L, "mamba.transpose_out_bwd", d_l, BWD),
            _conv(L, "mamba.conv1d_rerun", 2.0, BWD),
            Kernel("mamba.ssd_bwd", "scan", 2 * scan_flops(L) + state, 2 * scan_bytes(L), BWD),
            _conv(L, "mamba.conv1d_bwd", 3.0, BWD),
            *_transpose(L, "mamba.transpose_in_bwd", width, BWD), *_cp_in(L, BWD)]

"""Hybrid models (Nemotron-H, Nemotron 3, Qwen3-Next): the layer pattern, the Mamba-2 mixer's and the gated delta
net's sizes.

Megatron-Core builds a hybrid model from ``hybrid_layer_pattern``, one symbol per layer
(megatron/core/models/hybrid/hybrid_layer_allocation.py @ d98e8a64dd, ``Symbols``): M a Mamba-2
mixer, G a gated delta net, * self-attention, - a dense MLP, E an MoE MLP. Each such layer is one sub-layer with its
own pre-norm and residual (megatron/core/ssm/mamba_layer.py, mlp_layer.py; the attention and
MLP layers are a TransformerLayer's halves), so the emulator runs a hybrid model's layer i as
the part ``pattern[i]`` of a transformer layer, and a transformer's layer as the parts "*-"
(attention, dense MLP) or "*E" (attention, MoE).

The Mamba-2 mixer (megatron/core/ssm/mamba_mixer.py @ d98e8a64dd, ``MambaMixer``; Dao & Gu 2024,
arXiv 2405.21060) with H heads of P dims (d_inner = H·P; H = 2·hidden/P by default, expand 2),
G groups of state size N, a causal convolution of D_CONV taps:

    in_proj   h → 2·d_inner + 2·G·N + H      (z, x, B, C, dt; column-parallel)
    conv1d    over x, B, C: d_inner + 2·G·N channels, D_CONV taps and a bias
    SSD       the chunked scan (chunk Q = 128), with dt_bias, A_log and D (H each)
    norm      a grouped RMSNorm of d_inner (ExtendedRMSNorm, gain only)
    out_proj  d_inner → h                    (row-parallel)

Tensor parallelism splits the heads and the groups (``nheads % tp == 0``, ``ngroups % tp == 0``).
The gated delta net (G; megatron/core/ssm/gated_delta_net/gdn.py @ d98e8a64dd, ``GatedDeltaNet``; Yang et al.
2024, arXiv 2412.06464; Qwen3-Next) with K key heads of d_k and V value heads of d_v (Megatron-Core's linear_*
keys):

    in_proj   h → 2·K·d_k + 2·V·d_v + 2·V    (q, k, v, the output gate z, beta, alpha; column-parallel)
    conv1d    over q, k, v: 2·K·d_k + V·d_v channels, linear_conv_kernel_dim taps, no bias
    the chunked gated delta rule (flash-linear-attention's chunk_gated_delta_rule), with A_log and dt_bias (V each)
    norm      a gated RMSNorm of d_v (one gain, shared by the heads)
    out_proj  V·d_v → h                      (row-parallel)

An MTP depth (the pattern after "/", Megatron-Core's ``parse_hybrid_pattern``) is a module of the emulator's MTP
(workload/mtp.py) around a layer of its symbols: "*E" is a transformer MoE layer. The pattern's other symbols (D, +
and |) are refused by name (scenario/hybrid_rules.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from emulator.scenario.hybrid_rules import mixer_heads, split_pattern
from emulator.scenario.spec import ModelSpec

MAMBA, ATTENTION, MLP, MOE, GDN = "M", "*", "-", "E", "G"
DENSE_LAYER, MOE_LAYER = ATTENTION + MLP, ATTENTION + MOE  # a transformer's layers

D_CONV = 4  # MambaMixer(d_conv=4)
CHUNK = 128  # MambaMixer(chunk_size=128): the SSD kernels' chunk length Q


def is_hybrid(spec: ModelSpec) -> bool:
    """Whether ``spec`` is a hybrid model (a ``hybrid_layer_pattern`` is given)."""
    return bool(spec.hybrid_layer_pattern)


def main_pattern(spec: ModelSpec) -> str:
    """The decoder's symbols, one per layer (the pattern before any "/")."""
    return split_pattern(spec.hybrid_layer_pattern)[0]


def mtp_pattern(spec: ModelSpec) -> str:
    """The symbols of one MTP depth (Megatron-Core's "<main>/<mtp>/<mtp>": each depth runs them, e.g. "*E"); ""
    without MTP in the pattern."""
    mtp = split_pattern(spec.hybrid_layer_pattern)[1]
    return mtp[0] if mtp else ""


@dataclass(frozen=True)
class MambaDims:
    """A Mamba-2 mixer's sizes (whole, before tensor parallelism)."""

    heads: int  # H
    head_dim: int  # P
    groups: int  # G
    state: int  # N

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: x, B and C."""
        return self.d_inner + 2 * self.groups * self.state

    @property
    def in_proj(self) -> int:
        """in_proj's outputs: z, x, B, C and dt."""
        return 2 * self.d_inner + 2 * self.groups * self.state + self.heads


def mamba_dims(spec: ModelSpec) -> MambaDims:
    """The mixer's sizes: mamba_num_heads, else EXPAND·hidden / mamba_head_dim heads."""
    return MambaDims(mixer_heads(spec), spec.mamba_head_dim, spec.mamba_num_groups, spec.mamba_state_dim)


def mixer_params(spec: ModelSpec) -> int:
    """One Mamba-2 mixer's weights, its pre-norm apart: in_proj, conv1d (D_CONV taps and a bias per channel),
    dt_bias, A_log and D (one per head), the grouped norm's gain and out_proj (no linear biases: bias=False)."""
    md = mamba_dims(spec)
    h = spec.hidden
    return (h * md.in_proj + md.conv_dim * (D_CONV + 1) + 3 * md.heads + md.d_inner + md.d_inner * h)


def mixer_linear(spec: ModelSpec) -> int:
    """The mixer's GEMM weights (in_proj and out_proj): what Transformer Engine's linear modules hold."""
    md = mamba_dims(spec)
    return spec.hidden * (md.in_proj + md.d_inner)


def mixer_forward_flops(spec: ModelSpec) -> float:
    """Model FLOPs of one mixer's forward for one sequence of s tokens, as Megatron-LM counts them
    (megatron/training/training.py @ d98e8a64dd, ``mamba_layer_flops``): in_proj 2·s·h·(2·d_in + 2·G·N + H), the
    scan 7·s·d_in·N, out_proj 2·s·d_in·h, with d_in the mixer's d_inner (Megatron's formula takes 2·h, the same
    unless mamba_num_heads sets another width)."""
    md = mamba_dims(spec)
    s, h = spec.seq_len, spec.hidden
    return 2.0 * s * h * md.in_proj + 7.0 * s * md.d_inner * md.state + 2.0 * s * md.d_inner * h


@dataclass(frozen=True)
class DeltaDims:
    """A gated delta net's sizes (whole, before tensor parallelism)."""

    key_heads: int  # K
    value_heads: int  # V
    key_dim: int  # d_k
    value_dim: int  # d_v
    conv: int  # the convolution's taps

    @property
    def qk(self) -> int:
        """The query's (and the key's) width, K·d_k."""
        return self.key_heads * self.key_dim

    @property
    def v(self) -> int:
        """The value's (and the output's) width, V·d_v."""
        return self.value_heads * self.value_dim

    @property
    def in_proj(self) -> int:
        """in_proj's outputs: q, k, v, z, beta and alpha."""
        return 2 * self.qk + 2 * self.v + 2 * self.value_heads

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v."""
        return 2 * self.qk + self.v


def delta_dims(spec: ModelSpec) -> DeltaDims:
    """The gated delta net's sizes from Megatron-Core's linear_* keys."""
    return DeltaDims(spec.linear_num_key_heads, spec.linear_num_value_heads, spec.linear_key_head_dim,
                     spec.linear_value_head_dim, spec.linear_conv_kernel_dim)


def delta_params(spec: ModelSpec) -> int:
    """One gated delta net's weights, its pre-norm apart: in_proj, conv1d (no bias: conv_bias=False), A_log and
    dt_bias (one per value head), the gated norm's gain (d_v) and out_proj (no linear biases)."""
    dd = delta_dims(spec)
    h = spec.hidden
    return h * dd.in_proj + dd.conv_dim * dd.conv + 2 * dd.value_heads + dd.value_dim + dd.v * h


def delta_linear(spec: ModelSpec) -> int:
    """The gated delta net's GEMM weights (in_proj and out_proj)."""
    dd = delta_dims(spec)
    return spec.hidden * (dd.in_proj + dd.v)


def delta_forward_flops(spec: ModelSpec) -> float:
    """Model FLOPs of one gated delta net's forward for one sequence of s tokens, as Megatron-LM counts them
    (megatron/training/training.py @ d98e8a64dd, ``gdn_layer_flops``): 2·s·(h·in_proj + taps·(2·K·d_k + V·d_v)
    + 4·V·d_v² + h·V·d_v)."""
    dd = delta_dims(spec)
    s, h = spec.seq_len, spec.hidden
    return 2.0 * s * (h * dd.in_proj + dd.conv * dd.conv_dim + 4 * dd.value_heads * dd.value_dim ** 2 + h * dd.v)

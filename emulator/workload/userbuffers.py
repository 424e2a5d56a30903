"""Transformer Engine's Userbuffers (``parallel.tp_comm_overlap``): a layer pass's steps rewritten so that the
attention's and the dense MLP's sequence-parallel collectives run under chunks of their GEMMs (pure).
"""
from __future__ import annotations

from dataclasses import replace

from emulator.workload.steps import Comm, Kernel, LayerShape, Step, gemm

# Megatron-Core gives the buffer names qkv, proj, fc1 and fc2 to the attention's and the dense MLP's TE linear
# layers (attention.py, mlp.py @ d98e8a64dd; the experts get no overlap: extensions/transformer_engine.py,
# "Disable ub overlap for experts"), and TE runs each by its default method (TransformerEngine d0067d0da,
# transformer_engine/pytorch/module/base.py initialize_ub, lines 349-392; comm_gemm_overlap.cpp):
# - ring_exchange (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad): the all-gather goes round the TP ring by copy
#   engine in t − 1 steps while the GEMM runs t chunks of T/t tokens, each on the chunk that has arrived:
#   max(C, G·(t − 1)/t) + G/t. Written as the all-gather overlapping t − 1 chunk GEMMs, then the last chunk.
#   All SMs stay with the GEMM (set_sm_margin False).
# - pipeline (proj_fprop, fc2_fprop): the GEMM in UB_RS_SPLITS chunks, each chunk's reduce-scatter under the next
#   chunk's GEMM (split_overlap_rs): G/4 + max(3C/4, 3G/4) + C/4. Written as the first chunk, the
#   reduce-scatter of three quarters overlapping the other three chunks, then the last quarter's.
# - bulk (qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad): the saved input's all-gather under the dgrad GEMM and
#   dgrad's reduce-scatter under the wgrad GEMM, which the steps overlap already (Megatron's asynchronous
#   collectives do the same without Userbuffers).
# Pipeline and bulk GEMMs run on sm_count − UB_COMM_SMS SMs (num_sm 16, set_sm_margin True: _math_sms,
# comm_gemm_overlap.cpp line 143), ``L.ub_slow`` times longer. The all-gathers keep the bytes they have without
# Userbuffers. MLA layers get none: Megatron-Core's TELinear turns config.tp_comm_overlap off, for the whole
# model, when one is built with a buffer name other than those four (transformer_engine.py lines 1176-1186), as
# MLA's down-projections are (q_down_proj, kv_down_proj).
# A NeMo configuration (parallel.tp_comm_overlap_cfg: scenario/ub_configs.py) sets each GEMM's method, SMs and
# margin instead: its GEMMs run sm_count/(sm_count − num_sm) longer where set_sm_margin holds, else at full speed
# (LayerShape.ub_cfg); a reduce-scatter by ring_exchange (its FP8 configurations' proj_fprop and fc2_fprop) is
# costed as the pipeline in t chunks, the form of TE's split_overlap_rs_p2p. The method of the four bulk GEMMs is
# not read (they overlap as bulk); nor are cga_size, aggregate, atomic_gemm or fp8_buf.
UB_COMM_SMS = 16  # base.py get_default_config: num_sm of the pipeline and bulk methods
UB_RS_SPLITS = 4  # base.py get_default_config: num_splits of the pipeline method
# A hybrid model's Mamba-2 mixer gives its in_proj the buffer fc1 and its out_proj fc2 (megatron/core/ssm/
# mamba_mixer.py @ d98e8a64dd, tp_comm_buffer_name), so they run as the dense MLP's up and down GEMMs.
_UB_RING = {"ln1.ag": "qkv", "ln2.ag": "mlp.up", "proj.ag_grad": "proj.dgrad", "mlp.down.ag_grad": "mlp.down.dgrad",
            "mamba.ln.ag": "mamba.in_proj", "mamba.out_proj.ag_grad": "mamba.out_proj.dgrad"}
_UB_PIPELINE = {"proj.rs": "proj", "mlp.rs": "mlp.down", "mamba.out_proj.rs": "mamba.out_proj"}
_UB_BULK = ("qkv.dgrad", "qkv.wgrad", "mlp.up.dgrad", "mlp.up.wgrad", "mamba.in_proj.dgrad", "mamba.in_proj.wgrad")
# the GEMMs by Transformer Engine's buffer names (base.py initialize_ub)
TE_NAMES = {"qkv": "qkv_fprop", "mlp.up": "fc1_fprop", "proj.dgrad": "proj_dgrad", "mlp.down.dgrad": "fc2_dgrad",
            "proj": "proj_fprop", "mlp.down": "fc2_fprop", "qkv.dgrad": "qkv_dgrad", "qkv.wgrad": "qkv_wgrad",
            "mlp.up.dgrad": "fc1_dgrad", "mlp.up.wgrad": "fc1_wgrad",
            "mamba.in_proj": "fc1_fprop", "mamba.out_proj.dgrad": "fc2_dgrad", "mamba.out_proj": "fc2_fprop",
            "mamba.in_proj.dgrad": "fc1_dgrad", "mamba.in_proj.wgrad": "fc1_wgrad"}


def ub_setting(L: LayerShape, gemm_name: str) -> tuple[str, float, int]:
    """(method, how much longer the GEMM runs, chunks) of GEMM ``gemm_name`` (the step's name): the scenario's
    NeMo configuration where it names the GEMM, else Transformer Engine's default (above)."""
    te = TE_NAMES[gemm_name]
    for name, method, slow, splits in L.ub_cfg:
        if name == te:
            return method, slow, splits or (L.t if method == "ring_exchange" else UB_RS_SPLITS)
    if gemm_name in _UB_RING.values():
        return "ring_exchange", 1.0, L.t
    return ("pipeline" if gemm_name in _UB_PIPELINE.values() else "bulk"), L.ub_slow, UB_RS_SPLITS


def _chunk(k: Kernel, L: LayerShape, parts: int, slow: float) -> Kernel:
    """One of ``parts`` chunks of GEMM ``k`` along its tokens (m), ``slow`` times longer."""
    c = gemm(k.name, k.m // parts, k.n, k.k, L, k.batch, k.category)
    return replace(k, m=c.m, flops=c.flops, bytes=c.bytes, slow=k.slow * slow)


def _ub_ring(ag: Comm, between: list[Step], k: Kernel, L: LayerShape) -> list[Step]:
    """The ring exchange: what stood between the all-gather and its GEMM ``k`` (the input's casts), then the
    all-gather under the t − 1 chunk GEMMs, then the last chunk."""
    _method, slow, _splits = ub_setting(L, k.name)
    return [*between, replace(ag, overlap=L.t - 1), *[_chunk(k, L, L.t, slow)] * L.t]


def _ub_pipeline(k: Kernel, rs: Comm, L: LayerShape) -> list[Step]:
    """The pipeline: GEMM ``k``'s first chunk, the reduce-scatter of the first n − 1 chunks under the other
    chunks, then the last chunk's (a ring-exchange reduce-scatter: n = t)."""
    method, slow, n = ub_setting(L, k.name)
    if method == "ring_exchange":
        n = L.t
    chunk = _chunk(k, L, n, slow)
    early = replace(rs, bytes=rs.bytes * (n - 1) / n, overlap=n - 1)
    return [chunk, early, *[chunk] * (n - 1), replace(rs, bytes=rs.bytes / n)]


def _ub_gemm(steps: list[Step], i: int) -> int | None:
    """The index of the GEMM the ring all-gather at ``i`` feeds (the first kernel named for it), if any."""
    want = _UB_RING[steps[i].name]
    return next((j for j in range(i + 1, len(steps)) if steps[j].name == want and isinstance(steps[j], Kernel)),
                None)


def userbuffers(steps: list[Step], L: LayerShape) -> list[Step]:
    """A layer pass's steps as TE's Userbuffers run them (see above): each blocking all-gather of _UB_RING by
    ring exchange under its GEMM, each blocking reduce-scatter of _UB_PIPELINE pipelined under the GEMM just
    before it, the bulk GEMMs slowed; ``steps`` itself when they are off."""
    if not L.ub_slow:
        return steps
    out: list[Step] = []
    i = 0
    while i < len(steps):
        st = steps[i]
        i += 1
        if isinstance(st, Comm) and st.overlap == 0 and st.name in _UB_RING:
            j = _ub_gemm(steps, i - 1)
            if j is not None:
                k = steps[j]
                assert isinstance(k, Kernel)
                out += _ub_ring(st, steps[i:j], k, L)
                i = j + 1
                continue
        last = out[-1] if out else None
        if (isinstance(st, Comm) and st.overlap == 0 and st.name in _UB_PIPELINE and isinstance(last, Kernel)
                and last.name == _UB_PIPELINE[st.name]):
            out[-1:] = _ub_pipeline(last, st, L)
        elif isinstance(st, Kernel) and st.name in _UB_BULK:
            out.append(replace(st, slow=st.slow * ub_setting(L, st.name)[1]))
        else:
            out.append(st)
    return out


def ub_comm(st: Step, L: LayerShape) -> bool:
    """Whether ``st`` is a communication Userbuffers runs under its own GEMM (its overlap covers that GEMM's
    chunks alone)."""
    return bool(L.ub_slow) and isinstance(st, Comm) and (st.name in _UB_RING or st.name in _UB_PIPELINE)

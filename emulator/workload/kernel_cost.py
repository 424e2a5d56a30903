"""Kernel costs: the seconds one of a layer's kernels takes on a GPU, and a pass's critical path.

A GEMM or fused-attention kernel is looked up in the GPU's measured kernels first
(:func:`emulator.devices.compute.measured_first`: exact shape, else log-shape interpolation,
else the roofline); an MoE grouped GEMM falls back to the batched GEMM's roofline scaled by
``grouped_gemm_efficiency``; element-wise kernels always take the roofline (an FP8 cast and an MoE
token copy at the bandwidth measured for a cast and a copy). Every cost says
which of the three it came from (``measured | interpolated | roofline``).

FP8, MXFP8 and NVFP4 (``training.precision``) are Transformer Engine's recipes: a quantised GEMM
kernel (the linear layers', layer.py) runs in its recipe's precision (the fp8 table rows for fp8
and mxfp8, else the roofline at the FP8 or FP4 peak: compute.quant_gpu); every other kernel
(attention, the unfused attention's batched GEMMs, the router and output layer, element-wise work)
in BF16.

The same costs for a single kernel, for callers outside the layer model (a profiled workload):
:func:`emulator.devices.compute.gemm_cost` and :func:`emulator.devices.compute.attention_cost`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable

from emulator.devices import compute
from emulator.scenario.spec import QUANTISED, GpuSpec
from emulator.workload.layer import Comm, Kernel, Step

# Grouped GEMM against the plain GEMM of one group's shape, measured by DeepSeek's DeepGEMM on
# H800 (FP8; deepseek-ai/DeepGEMM @ a6d97a1, README.md "Performance", tables "Normal GEMMs for
# dense models" and "Grouped GEMMs for MoE models (contiguous layout)"): 8 groups of M 4096,
# N 4096, K 7168: 1288 against 1304 TFLOPS (0.988); N 7168, K 2048: 1093 against 1025 (1.066);
# 4 groups of M 8192: 1297/1304 (0.995) and 1099/1025 (1.072). A grouped GEMM loses nothing
# measurable to the batched GEMM of its groups, so the default is 1: expert GEMMs are costed as
# batched GEMMs; a GPU entry's measured ``grouped_gemm_efficiency`` scales their FLOP rate.
GROUPED_GEMM_EFFICIENCY = 1.0

# A grouped GEMM with few rows per group loses more than the batched roofline says: DeepGEMM's masked
# grouped GEMMs on H800 (FP8; ../shared/calibration/blackwell/grouped_gemm.csv, S4 DeepGEMM README @ 327ec92)
# against the emulator's roofline of the same shapes (kernel_cost on H800-SXM): M 256 per group, N 4096,
# K 7168: 932 against 1130 TFLOP/s (0.825); N 7168, K 2048: 815 against 918 (0.888), mean 0.856; M 512: 1040
# against 1130 (0.920) and 916 against 918 (0.998), mean 0.959; M 1024 and more: at or above the roofline
# (1233/1130, 1346/1238, 1214/1222), 1. Between the rows the factor is interpolated in log M; below 256 it
# stays at 256's (ASSUMPTION: no row; the memory-bound roofline takes over at small M anyway). ASSUMPTION:
# the FP8 kernels' small-M loss carries over to BF16 grouped GEMMs (the tiles and waves are the same).
SMALL_M_EFFICIENCY = ((256, (932 / 1130 + 815 / 918) / 2), (512, (1040 / 1130 + 916 / 918) / 2), (1024, 1.0))


def small_m_efficiency(m: int) -> float:
    """The grouped GEMM's FLOP-rate factor at ``m`` rows per group (SMALL_M_EFFICIENCY)."""
    rows = SMALL_M_EFFICIENCY
    if m <= rows[0][0]:
        return rows[0][1]
    for (m0, e0), (m1, e1) in zip(rows, rows[1:]):
        if m <= m1:
            return e0 + (e1 - e0) * math.log(m / m0) / math.log(m1 / m0)
    return 1.0


@dataclass(frozen=True)
class Timed(Kernel):
    """A kernel whose time is already known (a profiled kernel, kept or reshaped:
    emulator/workload/profiled.py), with the source that time counts under."""

    seconds: float = 0.0
    source: str = "measured"  # measured | interpolated | roofline


def grouped_gemm_time(kern: Kernel, gpu: GpuSpec) -> float:
    """A grouped GEMM: the batched GEMM's roofline with its FLOP rate × ``grouped_gemm_efficiency`` × the
    small-M factor of its rows per group (``small_m_efficiency``)."""
    tokens = kern.k if gemm_rows(kern) == 3 else kern.m  # a weight gradient's tokens are its k
    eff = (gpu.grouped_gemm_efficiency or GROUPED_GEMM_EFFICIENCY) * small_m_efficiency(tokens)
    if eff == 1.0 or min(kern.m, kern.n, kern.k, kern.batch) <= 0:
        return compute.gemm_time(kern.m, kern.n, kern.k, gpu, kern.dtype, kern.batch, gemm_rows(kern))
    e = compute.gemm_efficiency(kern.m, kern.n, kern.k, gpu, kern.batch, kern.dtype, gemm_rows(kern)) * eff
    t_flops = kern.flops / (gpu.peak_flops * e)
    nbytes = compute.gemm_bytes(kern.m, kern.n, kern.k, kern.dtype, kern.batch)
    t_mem = nbytes / (gpu.hbm_bandwidth * compute.mem_efficiency(gpu))
    return max(t_flops, t_mem) + gpu.launch_overhead


def gemm_rows(kern: Kernel) -> int:
    """The index of a layer GEMM's rows (tokens), no operand's leading dimension, so not subject to
    cuBLAS's 16-byte alignment (devices/kernels.gemm_aligned): k in a weight gradient, written
    (k_in, n_out, tokens) by layer.py, m otherwise. An MoE expert's token count is rarely a multiple
    of 8 and costs nothing for it."""
    return 3 if kern.name.endswith(".wgrad") else 1


def kernel_time(kern: Kernel, gpu: GpuSpec, dtype: str = "bf16") -> float:
    """Seconds for ``kern`` on ``gpu`` (:func:`kernel_cost`)."""
    return kernel_cost(kern, gpu, dtype)[0]


def kernel_precision(kern: Kernel, precision: str) -> str:
    """The dtype ``kern`` runs in under ``training.precision``: a quantised GEMM (dtype 1: layer.py's linear
    layers) its recipe's (fp8 | mxfp8 | nvfp4), the other kernels of a quantised run bf16; else the precision."""
    if kern.kind == "gemm" and kern.dtype == 1:
        return kern.quant or "fp8"
    return "bf16" if precision in QUANTISED else precision


def table_dtype(prec: str) -> str:
    """The kernel-table rows a GEMM of ``prec`` is looked up in: an MXFP8 GEMM runs at the FP8 tensor rate on
    sm_100 (tcgen05 block-scaled MMA: the FP8 rate, scale factors applied in the tensor core), so in the
    fp8 rows; the others in their own."""
    return "fp8" if prec == "mxfp8" else prec


def kernel_cost(kern: Kernel, gpu: GpuSpec, dtype: str = "bf16") -> tuple[float, str]:
    """(seconds, source) for ``kern`` on ``gpu``: a GEMM or fused-attention kernel is looked up
    in the GPU's measured kernels first (compute.measured_first; GEMM dims (batch, m, n, k),
    attention (head_dim, keys)), else costed by compute.py's roofline for its kind (an MoE grouped
    GEMM: :func:`grouped_gemm_time`); element-wise kernels always by the roofline. ``dtype``: the
    training precision (:func:`kernel_precision` picks each kernel's)."""
    if isinstance(kern, Timed):
        return kern.seconds, kern.source
    if kern.kind == "host":  # a host-side stall (the MoE dispatcher's host sync): its fixed seconds
        return kern.seconds, "roofline"
    t, source = _kernel_cost(kern, gpu, dtype)
    return (t * kern.slow if kern.slow != 1.0 else t), source


def _kernel_cost(kern: Kernel, gpu: GpuSpec, dtype: str) -> tuple[float, str]:
    if kern.kind == "gemm" and kern.dtype == 4 and dtype not in ("fp32", "tf32"):
        # a GEMM kept in fp32 in a bf16/fp8 run (the router with moe_router_dtype fp32): PyTorch's default
        # fp32 matmul, no TF32 (Megatron-Core does not turn it on), at the GPU's FP32 rate
        g32 = compute.at_precision(gpu, "fp32")
        return compute.gemm_time(kern.m, kern.n, kern.k, g32, 4, kern.batch, gemm_rows(kern)), "roofline"
    prec = kernel_precision(kern, dtype)
    if kern.kind == "gemm":
        g = compute.quant_gpu(gpu, prec) if prec in QUANTISED else gpu
        rows = gemm_rows(kern)

        def roofline() -> float:
            if kern.grouped:
                return grouped_gemm_time(kern, g)
            return compute.gemm_time(kern.m, kern.n, kern.k, g, kern.dtype, kern.batch, rows)
        return compute.measured_first(g, "gemm", table_dtype(prec), (kern.batch, kern.m, kern.n, kern.k), kern.flops,
                                      roofline, lambda d: compute.gemm_rate(d, g, kern.dtype, rows), rows)
    if kern.kind == "flash":
        kind = "fa2" if kern.fa2 else "attention"
        op = f"{kind}_{'bwd' if kern.backward else 'fwd'}{'_causal' if kern.causal else ''}"
        dims = (kern.head_dim, kern.n)
        if kern.quant:
            return _fp8_attention_cost(kern, gpu, op, dims, prec)
        return compute.measured_first(gpu, op, prec, dims, kern.flops,
                                      lambda: compute.flash_attention_time(kern.batch, kern.m, kern.n,
                                                                           kern.head_dim, gpu, kern.causal,
                                                                           kern.backward, kern.dtype))
    if kern.kind == "cast":  # a Transformer Engine FP8 cast: at the measured bandwidth of a cast
        return compute.elementwise_time(kern.bytes, gpu, compute.CAST_MEM_EFFICIENCY), "roofline"
    # a Mamba-2 chunked scan (mixer.py), a DSA indexer or sparse attention kernel (sparse_attention.py): by its FLOPs
    # and bytes on the roofline
    if kern.kind in ("scan", "sparse"):
        return compute.roofline_time(kern.flops, kern.bytes, gpu), "roofline"
    if kern.kind == "copy":  # an MoE token copy (permute, unpermute, chunk sort): at the measured bandwidth of a copy
        return compute.elementwise_time(kern.bytes, gpu, compute.COPY_MEM_EFFICIENCY), "roofline"
    return compute.elementwise_time(kern.bytes, gpu), "roofline"


# FP8 attention (training.fp8_dot_product_attention): a GPU's BF16 fused-attention time over the speed-up cuDNN's
# FP8 (or, under MXFP8, its MXFP8) kernel shows over its BF16 one at the same (direction, mask, head dim, keys), in
# one benchmark, cudnn-frontend's sdpa_benchmark_training, so that the ratio compares like with like:
# - Blackwell Ultra (a GPU whose NVFP4 rate is three times its FP8 one: B300, GB300): its GB300 rows, Blackwell
#   (B200, GB200) its GB200 rows (emulator/data/kernels/dpa_gb300.csv and dpa_gb200.csv, cudnn-frontend @ 3929da2,
#   cuDNN 9.22). Causal, 128 x 8192 on GB200: FP8 forward 2047 against 1574 TFLOP/s (1.30), backward 1454 against
#   1332 (1.09); MXFP8 1902 (1.21) and 1287 (0.97);
# - other GPUs (Hopper): the H200's rows, cuDNN 9.19.1 (../shared/calibration/h100/attention.csv rows 266-305, read
#   from the h100 table, whose attention rows begin with them for both types; the h200 table puts this repository's
#   own PyTorch SDPA timings of BF16 first): causal, 128 x 8192, forward 964 against 644 (1.50), backward 430
#   against 541 (0.79). An ASSUMPTION on every GPU but the H200 and the GB200 and GB300 themselves.
# 1 where the rows have no shape near it (kernels.py's neighbours: within an octave).


def fp8_attention_reference(gpu: GpuSpec) -> str:
    """The table whose BF16 and FP8 rows give ``gpu``'s FP8 attention speed-up (see above): dpa_gb300, dpa_gb200
    or h100."""
    if gpu.peak_flops_fp4 <= 0:
        return "h100"
    fp8 = gpu.peak_flops_fp8 or 2 * gpu.peak_flops
    return "dpa_gb300" if gpu.peak_flops_fp4 >= 3 * fp8 else "dpa_gb200"


def fp8_attention_speedup(op: str, dims: tuple[int, ...], dtype: str = "fp8", gpu: GpuSpec | None = None) -> float:
    """cuDNN's ``dtype`` (fp8 | mxfp8) attention rate over its BF16 one at ``dims`` (head dim, keys) in ``gpu``'s
    reference rows (:func:`fp8_attention_reference`; None: the H200's); 1 where not covered."""
    return _speedup(op, tuple(dims), dtype, fp8_attention_reference(gpu) if gpu is not None else "h100")


@functools.lru_cache(maxsize=4096)
def _speedup(op: str, dims: tuple[int, ...], dtype: str, reference: str) -> float:
    from emulator.devices import kernels

    ref = kernels.table(reference, ()) if reference == "h100" else kernels.reference(reference)
    low = ref.lookup(op, dtype, dims) if ref is not None else None
    bf16 = ref.lookup(op, "bf16", dims) if ref is not None else None
    return low.rate / bf16.rate if low is not None and bf16 is not None else 1.0


def _fp8_attention_cost(kern: Kernel, gpu: GpuSpec, op: str, dims: tuple[int, int], prec: str) -> tuple[float, str]:
    """cuDNN's fused attention in FP8: the GPU's BF16 kernel's time over :func:`fp8_attention_speedup` (a measured
    BF16 time so translated counts as interpolated)."""
    from emulator.devices import kernels

    t, source = kernel_cost(replace(kern, quant=""), gpu, prec)
    ratio = fp8_attention_speedup(op, dims, kern.quant, gpu)
    if ratio == 1.0:
        return t, source
    return gpu.launch_overhead + (t - gpu.launch_overhead) / ratio, \
        (kernels.INTERPOLATED if source == kernels.MEASURED else source)


def pass_time(steps: list[Step], gpu: GpuSpec, comm_time: Callable[[Comm], float]) -> float:
    """Uncontended critical path of ``steps`` with the builder's semantics.

    Kernels run in order on the compute stream. A Comm starts when the kernel before it
    has finished (and the previous comm of its group has); ``comm_time(comm)`` gives its
    duration. The kernel that follows a Comm's ``overlap`` window waits for it; a CP
    ring step is a send and a receive of ``bytes`` that run concurrently.
    """
    now = 0.0
    lane_free: dict[str, float] = {}
    pending: list[tuple[int, float]] = []  # (kernels still allowed to overlap, end time)
    for st in steps:
        if isinstance(st, Comm):
            start = max(now, lane_free.get(st.group, 0.0))
            end = start + comm_time(st)
            lane_free[st.group] = end
            pending.append((st.overlap, end))
            continue
        still = []
        for left, end in pending:
            if left == 0:
                now = max(now, end)
            else:
                still.append((left - 1, end))
        pending = still
        now += kernel_time(st, gpu)
    for _, end in pending:
        now = max(now, end)
    return now

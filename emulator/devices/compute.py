"""Compute cost model: how long one kernel takes on one GPU (pure functions, no SimPy).

Every kernel is costed by a roofline,

    time = max(flops / (peak · e_flops), bytes / (hbm · e_mem)) + launch_overhead,

where ``peak`` and ``hbm`` are the GPU's dense FLOP/s at the training precision and its
HBM bandwidth (GpuSpec; ``at_precision`` picks the peak, see "Precision" below), and the
efficiencies are:

- ``e_flops`` for a GEMM depends on its shape (m×k)·(k×n) (``batch`` independent ones):
      e_flops = E_GEMM_MAX · matmul_scale(gpu) · e_tile(m, n, batch) · k / (k + K_HALF) · e_align
  * e_tile is tile and wave quantisation: the GPU runs ceil(m/T)·ceil(n/T)·batch output
    tiles of T×T in waves of one tile per SM; the useful fraction is
        e_tile = m·n·batch / (waves · SMs · T²),   waves = ceil(tiles / SMs).
  * k / (k + K_HALF) is the fixed per-tile prologue/epilogue (loading the first
    operand stages, writing the output tile) amortised over the k-loop: a GEMM with a
    short k spends a larger share of its time outside the tensor-core main loop.
  * e_align is 1 for an aligned GEMM and UNALIGNED_FRACTION when a leading dimension (n or k of
    a Linear's forward; ``rows`` says which dim is none) is not a multiple of 16 bytes of its
    element (8 bf16 elements): cuBLAS then runs its align1 fallback kernels (kernels.gemm_aligned).
  * E_GEMM_MAX is what a large, square, well-quantised GEMM reaches on A100, and
    matmul_scale(gpu) carries it to another GPU by the ratio of their measured maximum
    achievable matmul FLOP/s (as a fraction of peak).
- ``e_mem`` (E_MEM) is the fraction of HBM bandwidth a streaming kernel reaches.

GEMM bytes are the operands and result read/written once: (m·k + k·n + m·n)·batch·dtype.
Batched GEMMs with a small k (attention QKᵀ, k = head dim) fall on the memory side of
the roofline, which is why attention scores are cheap in FLOPs but not in time.

Calibration (fitted against ../shared/calibration/layers.csv, all five GPT-22B rows,
forward and backward; tests/test_calibration.py repeats the fit): E_GEMM_MAX and E_MEM.
K_HALF is an assumption (the data cannot identify it). The tile size and SM counts are hardware facts. Other
GPUs use the same three efficiencies with their own peak, HBM bandwidth and SM count.

Precision (``training.precision``) chooses the peak a GEMM runs at (``precision_peak``):
bf16 and fp16 the dense tensor-core peak (``peak_flops``); ``fp32`` the FP32 (CUDA-core)
rate ``peak_flops_fp32``, because PyTorch runs float32 matmuls in full FP32 by default since
1.12 (``torch.backends.cuda.matmul.allow_tf32 = False``) and Megatron-LM does not enable TF32
(NVIDIA/Megatron-LM commit d98e8a64: ``allow_tf32`` is only ever set, to False, in its tests);
``tf32`` (fp32 storage, TF32 tensor-core matmuls: ``allow_tf32 = True``) the TF32 rate
``peak_flops_tf32``; ``fp8`` the FP8 tensor-core rate ``peak_flops_fp8``. A GPU whose catalog
entry gives no rate for the precision (an A100 or V100 has no FP8, a V100 no TF32) is refused
with a ScenarioError. The efficiencies above (fitted on bf16) apply unchanged to every
precision: an ASSUMPTION, no calibration row measures fp32, tf32 or fp8 GEMMs.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from emulator.devices.kernels import DTYPE_BYTES, gemm_aligned
from emulator.errors import ScenarioError
from emulator.scenario.spec import PRECISION_PEAK, QUANTISED, GpuSpec, precision_refusal

# Output tile edge of the tensor-core GEMM kernels (cuBLAS/CUTLASS 128×128 tiles are
# the common choice for large bf16 GEMMs on A100/H100; NVIDIA "Matrix Multiplication
# Background" user guide, section on tile and wave quantisation).
TILE = 128

# Streaming multiprocessors come from the GPU's catalog entry (GpuSpec.sm_count: A100 108,
# H100/H200/H800 SXM 132, B200 148, L40S 142, V100 80, from NVIDIA's whitepapers and datasheets).
DEFAULT_SMS = 108  # GPUs whose entry gives no sm_count: as A100

# Fitted to ../shared/calibration/layers.csv (GPT-22B, 8×A100, tp 8, micro-batch 4;
# all five rows, forward_ms and backward_ms, with the TP comm from nccl.csv's dgx-a100
# figures): least squares of the ten relative errors, every row within 3%.
# tests/test_calibration.py repeats the fit and checks that it lands on these values.
E_GEMM_MAX = 0.695  # fitted: fraction of dense peak reached by a large well-quantised GEMM
E_MEM = 0.90  # fitted, bounded above by 0.90 (ASSUMPTION: streaming kernels do not exceed
#               ~90% of HBM peak; the unbounded optimum, 0.96, is not physical)
K_HALF = 64.0  # ASSUMPTION (half a tile edge): not identifiable from layers.csv, whose GEMMs all
#                have k >= 768, where k/(k+K_HALF) >= 0.92; it matters for small-k GEMMs only


# Maximum achievable matmul FLOP/s as a fraction of the dense peak is the GPU's catalog field
# GpuSpec.matmul_fraction, from S. Bekman's "Maximum Achievable Matmul FLOPS" measurements
# (ml-engineering, compute/accelerator: mamf-finder results): A100 SXM 271.2 of 312 TFLOP/s
# (0.869), H100 SXM 794.5 of 989 (0.803). E_GEMM_MAX was fitted on A100, so another GPU's GEMMs
# reach E_GEMM_MAX · (its fraction / A100's): Hopper's tensor cores reach a smaller share of
# their (much higher) peak, under the same 700 W power envelope and clocks that drop below boost
# under sustained load. H200 and H800 share H100's die and carry H100's fraction. GPUs without a
# measurement (B200, L40S, V100: fraction 0) keep A100's: an ASSUMPTION.
REFERENCE_FRACTION = 0.869  # A100 SXM, the GPU E_GEMM_MAX was fitted on

# FP8 GEMMs (and MXFP8, NVFP4: the same law, an ASSUMPTION for FP4) on a GPU whose FP8 matmuls were
# measured (catalog ``matmul_fraction_fp8``): the H100's FP8 roofline at its bf16 fraction (0.803) agrees
# with its measured FP8 GEMMs (../shared/calibration/h200/fp8_gemm.csv row 18, 8192×57344×8192: 6267 us,
# 1200 TFLOP/s, carried to the H100 as emulator/tools/kernel_tables.py explains; the roofline gives 1223),
# while mamf-finder's best H100 FP8 shape reaches 1402.6 of 1978.9 TFLOP/s (h100/gemm.csv row 14: 0.709).
# So an FP8 GEMM is costed at the matmul fraction 0.803 · f8 / 0.709 for a GPU whose mamf-finder FP8
# fraction is f8: REFERENCE_FRACTION · f8 / FP8_REFERENCE_FRACTION, with FP8_REFERENCE_FRACTION =
# 0.709 · 0.869 / 0.803. Hopper entries give no matmul_fraction_fp8 and keep their bf16 fraction, which
# this law reproduces for them.
FP8_REFERENCE_FRACTION = (1402.6 / 1978.9) * REFERENCE_FRACTION / 0.803

# An unaligned GEMM's rate over the aligned rate, measured on one H200 (../shared/calibration/h200/
# gemm.csv; tests/test_kernel_model.py recomputes it): each of the six N = 50257 rows (rows 18, 19, 37,
# 38, 56, 57: 95.7 to 107.4 TFLOP/s) over the geometric mean of the aligned rows of the same M and K
# (above 60 us): 0.169, 0.165, 0.173, 0.186, 0.154, 0.153; their geometric mean is 0.1665. The align1
# kernels are an sm75 mma.sync design with scalar (one-element) loads, so another GPU's ratio is an
# ASSUMPTION (the H100 has the H200's SMs and clocks).
UNALIGNED_FRACTION = 0.1665


def precision_peak(gpu: GpuSpec, precision: str) -> float:
    """The GPU's dense FLOP/s for GEMMs at ``precision``; a ScenarioError (key
    ``training.precision``) when its catalog entry gives no such rate."""
    if precision not in PRECISION_PEAK:
        raise ScenarioError(f"expected one of {', '.join(PRECISION_PEAK)}, got {precision!r}",
                            key="training.precision")
    peak = gpu.peak_at(precision)
    if peak <= 0:
        raise ScenarioError(precision_refusal(gpu, precision), key="training.precision")
    return peak


def at_precision(gpu: GpuSpec, precision: str) -> GpuSpec:
    """``gpu`` with ``peak_flops`` set to its dense rate at ``precision`` (every cost function
    below reads ``peak_flops``). fp8, mxfp8 and nvfp4 check that the GPU has the rate and keep the bf16
    peak: only the quantised GEMMs (:func:`quant_gpu`) run at it (Transformer Engine's recipes)."""
    peak = precision_peak(gpu, precision)
    if precision in QUANTISED:
        return gpu
    return gpu if peak == gpu.peak_flops else replace(gpu, peak_flops=peak)


def fp8_gpu(gpu: GpuSpec) -> GpuSpec:
    """``gpu`` with ``peak_flops`` at its FP8 tensor-core rate (an FP8 GEMM's roofline)."""
    return quant_gpu(gpu, "fp8")


def quant_gpu(gpu: GpuSpec, precision: str) -> GpuSpec:
    """``gpu`` as a quantised GEMM (fp8 | mxfp8 | nvfp4) sees it: ``peak_flops`` at the precision's
    tensor-core rate and, where the GPU's FP8 matmuls were measured (``matmul_fraction_fp8``),
    the matmul fraction that carries the model's GEMM efficiency to them (:func:`fp8_fraction`)."""
    peak = gpu.peak_at(precision)
    frac = fp8_fraction(gpu)
    if peak == gpu.peak_flops and frac == gpu.matmul_fraction:
        return gpu
    return replace(gpu, peak_flops=peak, matmul_fraction=frac)


def fp8_fraction(gpu: GpuSpec) -> float:
    """The ``matmul_fraction`` a GPU's quantised GEMMs are costed with: REFERENCE_FRACTION ·
    matmul_fraction_fp8 / FP8_REFERENCE_FRACTION when its FP8 matmuls were measured, else its
    ``matmul_fraction`` (the bf16 one)."""
    if not gpu.matmul_fraction_fp8:
        return gpu.matmul_fraction
    return REFERENCE_FRACTION * gpu.matmul_fraction_fp8 / FP8_REFERENCE_FRACTION


def matmul_scale(gpu: GpuSpec) -> float:
    """The GPU's achievable matmul fraction relative to the A100 the model was fitted on (1 when unmeasured)."""
    return gpu.matmul_fraction / REFERENCE_FRACTION if gpu.matmul_fraction else 1.0


def sm_count(gpu: GpuSpec) -> int:
    """SMs of the GPU (its catalog field); an A100's when the entry does not say."""
    return gpu.sm_count or DEFAULT_SMS


def tile_efficiency(m: int, n: int, gpu: GpuSpec, batch: int = 1) -> float:
    """e_tile = m·n·batch / (waves · SMs · TILE²), waves = ceil(ceil(m/T)·ceil(n/T)·batch / SMs)."""
    sms = sm_count(gpu)
    tiles = math.ceil(m / TILE) * math.ceil(n / TILE) * batch
    waves = math.ceil(tiles / sms)
    return (m * n * batch) / (waves * sms * TILE * TILE)


def gemm_max(gpu: GpuSpec) -> float:
    """What a large, well-quantised GEMM reaches: the GPU's calibrated ``gemm_efficiency``
    (``emulator calibrate --kineto``) when it has one, else E_GEMM_MAX · matmul_scale(gpu)."""
    return gpu.gemm_efficiency or E_GEMM_MAX * matmul_scale(gpu)


def mem_efficiency(gpu: GpuSpec) -> float:
    """The GPU's calibrated ``memory_efficiency`` when it has one, else E_MEM."""
    return gpu.memory_efficiency or E_MEM


def gemm_efficiency(m: int, n: int, k: int, gpu: GpuSpec, batch: int = 1, dtype_bytes: int = 2,
                    rows: int = 1) -> float:
    """e_flops = gemm_max(gpu) · e_tile(m, n, batch) · k / (k + K_HALF) · e_align (UNALIGNED_FRACTION
    when a leading dimension is not a multiple of 16 bytes of a ``dtype_bytes`` element, else 1;
    ``rows``: kernels.gemm_aligned)."""
    align = 1.0 if gemm_aligned((batch, m, n, k), dtype_bytes, rows) else UNALIGNED_FRACTION
    return gemm_max(gpu) * tile_efficiency(m, n, gpu, batch) * k / (k + K_HALF) * align


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> float:
    """2·m·n·k·batch (one multiply and one add per term)."""
    return 2.0 * m * n * k * batch


def gemm_bytes(m: int, n: int, k: int, dtype_bytes: int = 2, batch: int = 1) -> float:
    """(m·k + k·n + m·n)·batch·dtype_bytes: both operands read and the result written once."""
    return float((m * k + k * n + m * n) * batch * dtype_bytes)


def gemm_time(m: int, n: int, k: int, gpu: GpuSpec, dtype_bytes: int = 2, batch: int = 1, rows: int = 1) -> float:
    """time = max(2mnk·batch / (peak·e_flops(m,n,k)), gemm_bytes / (hbm·E_MEM)) + launch."""
    if min(m, n, k, batch) <= 0:
        return 0.0
    t_flops = gemm_flops(m, n, k, batch) / (gpu.peak_flops * gemm_efficiency(m, n, k, gpu, batch, dtype_bytes, rows))
    t_mem = gemm_bytes(m, n, k, dtype_bytes, batch) / (gpu.hbm_bandwidth * mem_efficiency(gpu))
    return max(t_flops, t_mem) + gpu.launch_overhead


def gemm_rate(dims: tuple[int, ...], gpu: GpuSpec, dtype_bytes: int = 2, rows: int = 1) -> float:
    """The roofline's FLOP/s of GEMM dims (batch, m, n, k), launch left out: the prior that the
    kernel table's neighbour interpolation corrects (kernels.py)."""
    b, m, n, k = dims
    return gemm_flops(m, n, k, b) / (gemm_time(m, n, k, gpu, dtype_bytes, b, rows) - gpu.launch_overhead)


def measured_first(gpu: GpuSpec, op: str, dtype: str, dims: tuple[int, ...], flops: float,
                   roofline: Callable[[], float],
                   prior: Callable[[tuple[int, ...]], float] | None = None, rows: int = 1) -> tuple[float, str]:
    """The kernel database first (devices/kernels.py): flops / measured-or-interpolated rate + launch;
    else ``roofline()``. ``prior``: the model's rate of a shape, which the table's neighbour
    interpolation corrects; ``rows``: a GEMM's dim that is no leading dimension (kernels.gemm_aligned).
    Returns (seconds, source: measured | interpolated | roofline)."""
    from emulator.devices import kernels

    hit = kernels.lookup(gpu, op, dtype, dims, prior, rows)
    if hit is None:
        return roofline(), kernels.ROOFLINE
    return flops / hit.rate + gpu.launch_overhead, hit.source


def at_dtype(gpu: GpuSpec, dtype: str) -> GpuSpec:
    """``gpu`` at the tensor-core peak of one kernel's ``dtype`` (bf16/fp16: ``peak_flops`` as it is)."""
    if dtype in ("bf16", "fp16"):
        return gpu
    peak = precision_peak(gpu, dtype)
    return gpu if peak == gpu.peak_flops else replace(gpu, peak_flops=peak)


def gemm_cost(m: int, n: int, k: int, gpu: GpuSpec, dtype: str = "bf16", batch: int = 1,
              rows: int = 1) -> tuple[float, str]:
    """(seconds, source) of ``batch`` GEMMs (m×k)·(k×n) in ``dtype`` (bf16 | fp16 | fp8 | fp32 | tf32)
    on ``gpu`` (its catalog entry, bf16 peak): the GPU's kernel table (measured, else interpolated:
    kernels.py), else the roofline (:func:`gemm_time`: tile and wave quantisation, unaligned
    dimensions). ``rows``: the dim that is no operand's leading dimension (1: m, a Linear's tokens;
    3: k, the tokens of a weight gradient), so its alignment does not matter.
    source: measured | interpolated | roofline. Launch overhead included."""
    if min(m, n, k, batch) <= 0:
        return 0.0, "roofline"
    g = at_dtype(gpu, dtype)
    nbytes = DTYPE_BYTES[dtype]
    return measured_first(g, "gemm", dtype, (batch, m, n, k), gemm_flops(m, n, k, batch),
                          lambda: gemm_time(m, n, k, g, nbytes, batch, rows),
                          lambda d: gemm_rate(d, g, nbytes, rows), rows)


def attention_flops(batch: int, heads: int, seq: int, kv_seq: int, head_dim: float, causal: bool,
                    backward: bool) -> float:
    """FlashAttention's convention: 4·batch·heads·seq·kv_seq·d forward, ×2.5 backward, ½ when causal."""
    return 4.0 * batch * heads * seq * kv_seq * head_dim * (2.5 if backward else 1.0) * (0.5 if causal else 1.0)


def attention_cost(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, gpu: GpuSpec,
                   causal: bool = True, backward: bool = False, dtype: str = "bf16", kv_seq: int = 0,
                   kernel: str = "flash") -> tuple[float, str]:
    """(seconds, source) of one fused attention kernel (forward, or backward when ``backward``) of
    ``batch`` × ``heads`` query heads (``kv_heads`` key/value heads: GQA changes bytes, not FLOPs)
    over ``seq`` queries and ``kv_seq`` keys (0: seq) of ``head_dim`` on ``gpu``. ``kernel``: flash
    (cuDNN's fused flash attention, what Transformer Engine and PyTorch SDPA run on sm90) or fa2
    (FlashAttention-2). The table (kernels.py, dims head_dim × kv_seq) first, else
    :func:`flash_attention_time`. Launch overhead included."""
    kv_seq = kv_seq or seq
    if min(batch, heads, seq, head_dim) <= 0:
        return 0.0, "roofline"
    flops = attention_flops(batch, heads, seq, kv_seq, head_dim, causal, backward)
    op = f"{'attention' if kernel == 'flash' else 'fa2'}_{'bwd' if backward else 'fwd'}{'_causal' if causal else ''}"
    nbytes = DTYPE_BYTES.get(dtype, 2)
    return measured_first(gpu, op, dtype, (head_dim, kv_seq), flops,
                          lambda: flash_attention_time(batch * heads, seq, kv_seq, head_dim, gpu, causal, backward,
                                                       nbytes))


# The fraction of HBM bandwidth a dtype cast reaches, measured on one H200 (../shared/calibration/
# h200/elementwise.csv row 10: x.to(bf16) of an fp32 [16384, 4096], 402.7 MB in 109.6 us, 3672 GB/s
# of 4800): 0.765. Row 1 (the same cast of [8192, 2048], 42.8 us) is left out: below 60 us the
# per-call time holds the host's dispatch (h200/sources.md). A Transformer Engine FP8 cast-transpose
# is costed at this fraction of the GPU's HBM bandwidth (a bandwidth-bound kernel: the same
# fraction on the H100, an ASSUMPTION).
CAST_MEM_EFFICIENCY = 3672.0 / 4800.0

# The fraction of HBM bandwidth a copy reaches, measured on the same H200 (../shared/calibration/h200/
# elementwise.csv row 11: x.clone() of a bf16 [16384, 4096], 268.4 MB in 75.2 us, 3570 GB/s of 4800): 0.744.
# MoE token copies (Transformer Engine's permute, unpermute and chunk sort: row gathers of whole token rows,
# each a contiguous h·2 bytes) are costed at this fraction (an ASSUMPTION: a gather of rows of several kB
# moves as a copy does; the same fraction on other GPUs, as the cast's).
COPY_MEM_EFFICIENCY = 3570.0 / 4800.0


def elementwise_time(nbytes: float, gpu: GpuSpec, efficiency: float = 0.0) -> float:
    """time = nbytes / (hbm · e) + launch: a memory-bound kernel moving nbytes; e = ``efficiency``,
    or the GPU's (E_MEM) when 0."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (gpu.hbm_bandwidth * (efficiency or mem_efficiency(gpu))) + gpu.launch_overhead


def roofline_time(flops: float, nbytes: float, gpu: GpuSpec) -> float:
    """time = max(flops / (peak·E_GEMM_MAX·matmul_scale), nbytes / (hbm·E_MEM)) + launch.

    The default for an op known only by its FLOPs and bytes (trace ops): its FLOPs are
    assumed to run at the efficiency of a large GEMM.
    """
    if flops <= 0 and nbytes <= 0:
        return 0.0
    t_flops = flops / (gpu.peak_flops * gemm_max(gpu))
    t_mem = nbytes / (gpu.hbm_bandwidth * mem_efficiency(gpu))
    return max(t_flops, t_mem) + gpu.launch_overhead


# the query and key tile of the fused attention kernels, 128 rows (an ASSUMPTION: the usual block of FlashAttention's
# and cuDNN's kernels; only the rounding of an odd count depends on it)
FLASH_TILE = 128


def _tiled(n: int) -> int:
    """``n`` rows rounded up to whole flash-attention tiles."""
    return -(-n // FLASH_TILE) * FLASH_TILE


def flash_attention_time(batch_heads: int, sq: int, sk: int, head_dim: int, gpu: GpuSpec,
                         causal: bool, backward: bool = False, dtype_bytes: int = 2) -> float:
    """A fused (flash) attention kernel: 2 GEMMs forward (QKᵀ, PV), 5 backward.

    flops = 4·batch_heads·sq·sk·d forward (×2.5 backward: dQ, dK, dV, dP and the recomputed
    QKᵀ), halved for a causal mask (the masked blocks are skipped). The FLOPs run at the
    GEMM efficiency of the score GEMM's shape (sq × sk, k = d); bytes are Q, K, V, O
    (and their gradients backward). UNCALIBRATED: layers.csv has no fused-attention row.
    """
    flops = 4.0 * batch_heads * sq * sk * head_dim * (2.5 if backward else 1.0) * (0.5 if causal else 1.0)
    # the kernel walks queries and keys in tiles and masks the last one's tail: its shape is the tiles', never an
    # unaligned GEMM's (a window's or a CP share's odd key count does not take cuBLAS's align1 kernels)
    e = gemm_efficiency(_tiled(sq), _tiled(sk), head_dim, gpu, batch_heads)
    nbytes = (2 if backward else 1) * batch_heads * (2 * sq + 2 * sk) * head_dim * dtype_bytes
    return max(flops / (gpu.peak_flops * e), nbytes / (gpu.hbm_bandwidth * mem_efficiency(gpu))) + gpu.launch_overhead

"""Translation of a kernel measured on one GPU to another GPU (pure functions, no SimPy).

A profile (a Kineto trace of one GPU) names the GPU it ran on (``deviceProperties``: the CUDA
device name, ``torch.cuda.get_device_name``). :func:`catalog_name` maps that name to the catalog
GPU (emulator/data/catalog.yaml) whose figures the translation reads; an unknown name has no
translation. A measured kernel of time t on GPU S becomes, on GPU T:

- **GEMM and fused attention**: t · M_T / M_S, M the kernel model of each GPU
  (:func:`emulator.devices.compute.gemm_cost`, :func:`~emulator.devices.compute.attention_cost`)
  without its kernel table (:func:`roofline_gpu`): the roofline, with each GPU's peak, SMs, matmul
  fraction and HBM bandwidth. The tables are left out of the ratio because each GPU's table measured
  its own kernels in its own setup, and their ratio carries that setup: the H200 table costs the
  [2048 x 8192] x [8192 x 8192] weight-gradient GEMM at 0.63 of peak where the H200 profile of
  traces/h200-hf-gpt-1.3b ran it at 0.84, and the H100 table costs it at 0.77 on the same die. The
  measured kernel keeps its own inefficiency against the model; only the model's ratio moves it.
  The result is never faster than the kernel's FLOPs at T's peak (:func:`peak_floor`): no
  efficiency above 1.
- **memory-bound** (element-wise, reductions, the optimizer, memsets): t₀ + (t − t₀) · B_S / B_T,
  B = the GPU's achieved HBM bandwidth, ``hbm_bandwidth`` · its memory efficiency
  (:func:`emulator.devices.compute.mem_efficiency`), and t₀ = min(t, ``reshape.FIXED_S``) the part of
  a kernel that does not move with its bytes (launch-bound: kept as measured).
- **copies to or from the host** and the host's own time: as measured. ASSUMPTION: the host (its CPU,
  its launch rate, its PCIe link) is the one the profile ran on; a Grace CPU (GB200, GB300) is not
  the x86 host of an H100 or H200 box, and its launch rate was not measured.

Where no translation is sound the precision is refused by name (:func:`refusal`): bf16 on a GPU
without bf16 tensor cores, fp8 on one whose catalog entry gives no FP8 rate.
"""
from __future__ import annotations

from dataclasses import replace

from emulator.devices.compute import mem_efficiency
from emulator.devices.reshape import FIXED_S
from emulator.scenario.spec import GpuSpec

# CUDA device names (torch.cuda.get_device_name, as Kineto's deviceProperties records them) -> catalog
# GPU. The names are those the driver reports for each SKU: the SXM H100 80 GB reports its memory type
# ("HBM3"), the A100s their form factor; "NVIDIA A100-PG509-200" is an HGX A100 SXM4 40 GB board
# (traces/resnet-ddp-a100: its deviceProperties give totalGlobalMem 42297524224 B and 108 SMs). PCIe
# and NVL parts are not catalog GPUs: their clocks and bandwidths differ, so they are not mapped.
CUDA_NAMES = {
    "NVIDIA A100-SXM4-80GB": "A100-SXM4-80GB",
    "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB",
    "NVIDIA A100-PG509-200": "A100-SXM4-40GB",
    "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB",
    "NVIDIA H200": "H200-SXM",
    "NVIDIA H800": "H800-SXM",
    "NVIDIA B200": "B200",
    "NVIDIA GB200": "B200-GB200",
    "NVIDIA L40S": "L40S",
    "Tesla V100-SXM2-32GB": "V100-SXM2-32GB",
}


def catalog_name(device: str) -> str | None:
    """The catalog GPU of a CUDA device name (case and surrounding blanks ignored); None: unknown."""
    want = device.strip().lower()
    return next((gpu for cuda, gpu in CUDA_NAMES.items() if cuda.lower() == want), None)


def same_chip(a: GpuSpec, b: GpuSpec) -> bool:
    """Whether two catalog GPUs compute alike (the same dense peaks, SMs and matmul fractions: the A100
    40 GB and 80 GB parts, the H100 and H200), whatever their memory."""
    fields = ("peak_flops", "peak_flops_fp32", "peak_flops_tf32", "peak_flops_fp8", "peak_flops_fp4", "sm_count",
              "matmul_fraction", "matmul_fraction_fp8")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def has_bf16(gpu: GpuSpec) -> bool:
    """Whether ``gpu`` has bf16 tensor cores. bf16 and TF32 tensor cores arrive together with
    Ampere (sm_80; NVIDIA A100 Tensor Core GPU Architecture whitepaper, "TF32 and BF16"), so a catalog
    entry with a ``peak_flops_tf32`` has them; the V100 (sm_70) has neither."""
    return gpu.peak_flops_tf32 > 0


def refusal(gpu: GpuSpec, dtypes: set[str]) -> str | None:
    """Why kernels measured in ``dtypes`` cannot be carried to ``gpu``; None when they can."""
    if "bf16" in dtypes and not has_bf16(gpu):
        return (f"the profile's kernels ran in bf16, but GPU {gpu.name} has no bf16 tensor cores (bf16 arrived "
                "with TF32 on sm_80; its catalog entry gives no peak_flops_tf32), so no time measured in bf16 "
                "translates to it; profile the script in fp16 (autocast dtype=torch.float16) or choose an "
                "Ampere or later GPU")
    if "fp8" in dtypes and gpu.peak_flops_fp8 <= 0:
        return (f"the profile's GEMMs ran in fp8, but GPU {gpu.name} has no FP8 tensor-core rate (its catalog "
                "entry gives no peak_flops_fp8); profile the script in bf16 or choose a GPU with FP8")
    return None


def roofline_gpu(gpu: GpuSpec) -> GpuSpec:
    """``gpu`` without its kernel table and measured kernels: the kernel model is its roofline."""
    return replace(gpu, kernel_table="none", kernels=())


def achieved_bandwidth(gpu: GpuSpec) -> float:
    """B/s a streaming kernel reaches: ``hbm_bandwidth`` · the GPU's memory efficiency."""
    return gpu.hbm_bandwidth * mem_efficiency(gpu)


def bandwidth_ratio(source: GpuSpec, target: GpuSpec) -> float:
    """B_S / B_T: how much longer a memory-bound kernel runs on ``target`` than on ``source``."""
    return achieved_bandwidth(source) / achieved_bandwidth(target)


def memory_time(t: float, source: GpuSpec, target: GpuSpec) -> float:
    """t₀ + (t − t₀) · B_S / B_T with t₀ = min(t, FIXED_S): a memory-bound kernel measured on ``source``."""
    t0 = min(t, FIXED_S)
    return t0 + (t - t0) * bandwidth_ratio(source, target)


def modelled_time(t: float, model_source: float, model_target: float) -> float:
    """t · M_T / M_S: a measured GEMM or attention kernel moved by the kernel model's ratio."""
    return t * model_target / model_source if model_source > 0 else t


def peak_rate(gpu: GpuSpec, dtype: str) -> float:
    """The highest dense FLOP/s ``gpu`` may run a GEMM of ``dtype`` at: its FP8 rate for fp8, the
    tensor-core peak for bf16/fp16, and for fp32 the larger of its FP32 and TF32 rates (a script may
    enable TF32). 0: the GPU gives none."""
    if dtype == "fp8":
        return gpu.peak_flops_fp8
    if dtype in ("fp32", "tf32"):
        return max(gpu.peak_flops_fp32, gpu.peak_flops_tf32)
    return gpu.peak_flops


def peak_floor(flops: float, gpu: GpuSpec, dtype: str) -> float:
    """The least time ``flops`` can take on ``gpu`` in ``dtype``: flops / peak (0 with no rate)."""
    peak = peak_rate(gpu, dtype)
    return flops / peak if peak > 0 else 0.0

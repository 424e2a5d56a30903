"""Kernel tables: derives the built-in measured-kernel tables from the shared calibration set.

``derive(h100_dir)`` reads ``../shared/calibration/h100/{gemm,attention}.csv`` and
``../shared/calibration/h200/{gemm,fp8_gemm,attention}.csv`` (the ``h200`` folder beside
``h100_dir``) and returns the text of the package files ``emulator/data/kernels/h100.csv``,
``h200.csv`` and ``b200.csv`` (the format :mod:`emulator.devices.kernels` reads). Every output row
cites the row it came from: ``h100/gemm.csv row N`` is the N-th data row (line N + 1, after the header).
tests/test_kernels.py re-derives the shipped files and checks they are byte-identical.

What is taken, per table:
- h100 ``gemm bf16``: the OpenXLA sm_90 bf16 grid [S3] (b ∈ {1,2,4} × M,N,K ∈ {256..4096});
  the mamf-finder best shape of "NVIDIA H100 SXM" [S1]; vLLM's skinny torch BF16 rows [S15].
- h100 ``gemm fp16``: inclusionAI/humming's skinny torch FP16 rows [S15].
- h100 ``gemm fp8``: mamf-finder's best FP8 shape [S1] and vLLM's CUTLASS FP8 rows [S15]. The
  sm_90 FP8 grid is marked SUSPECT (above the FP8 peak) and is never used.
- h100 ``attention_fwd[_causal] fp16`` (dims head_dim × seq_len): cuDNN fused attention,
  forward, H100 80GB SXM5 [S5] (the kernel TE runs as "fused attention").
- h100 ``attention_bwd[_causal] fp16``: no H100 cuDNN backward was published, so the
  backward of FlashAttention-2 on H100 is derived from its forward [S5] and its
  forward+backward [S6] at the same (head dim, seq len, causal), with the papers' FLOP
  convention (backward = 2.5 × forward):
      t_fb / F = 3.5 / R_fb,  t_f / F = 1 / R_f  →  R_bwd = 2.5 / (3.5 / R_fb − 1 / R_f).
- b200 ``gemm bf16`` and ``gemm fp8``: the OpenXLA sm_100_B200 grids [S3] and the
  mamf-finder best shapes of "NVIDIA B200 SXM" [S1]; then the sustained GB200 cuBLASLt FP8 and
  FP4 GEMMs of ``../shared/calibration/blackwell/gemm.csv`` (:func:`_b200_sustained_gemm_rows`);
  ``attention_*`` and ``fa2_*`` from ``blackwell/attention.csv`` (:func:`_b200_attention_rows`).
The A100 has no table (its model was fitted on it: compute.py).

The H200 measurements (h200/sources.md) time each call alone with CUDA events, so a time holds
the kernel and its launch. The model adds the GPU's launch overhead (catalog ``launch_overhead``,
LAUNCH) to every kernel, so a row's rate is FLOPs / (time − LAUNCH): looked up, it gives back the
measured time. Rows of LAUNCH_BOUND or less are left out: there the host's dispatch dominates
(a 1024³ bf16 GEMM, 2.1 GFLOP, "takes" 55 µs, 39 TFLOP/s; 2048³ 57 µs): they measure the
host, not the kernel, and would teach the table that a small GEMM is twenty times slower
than it runs in a training step, where the CPU runs ahead of the GPU.
- h200 ``gemm bf16``: h200/gemm.csv (incl. the unaligned N = 50257 rows: devices/kernels.py keeps
  them apart), then the bf16 ``F.linear`` column of h200/fp8_gemm.csv for shapes gemm.csv lacks.
- h200 ``gemm fp8``: h200/fp8_gemm.csv ``fp8_us`` (``torch._scaled_mm``, per-tensor scales, split
  accumulation: Transformer Engine's dgrad and wgrad GEMMs; its fprop uses fast accumulation,
  ``_2X_ACC_FPROP = False`` in transformer_engine/pytorch/module/base.py @ d0067d0, within a few
  percent of it here: column ``fp8_fast_accum_us``), and mamf-finder's best FP8 shape of
  "NVIDIA H200 SXM" [S1].
- h200 ``attention_{fwd,bwd}[_causal] bf16``: cuDNN fused flash attention through PyTorch SDPA,
  h200/attention.csv: forward rate F / (fwd − LAUNCH); backward 2.5·F / (fwd_bwd − fwd − LAUNCH);
  then cudnn-frontend's H200 cuDNN rows [S8] for the shapes ours lack.
- h100 ``gemm fp8`` adds the h200/fp8_gemm.csv rows, and h100 ``attention_*`` are cuDNN's as
  Transformer Engine runs it (NeMo's runs), carried from the H200: the H200 has the H100's SMs,
  tensor cores and clocks (hardware.csv: both 989.4 TFLOP/s dense bf16, "same compute die as
  H100 SXM"; only HBM differs, 4800 against 3350 GB/s), and these kernels are compute-bound
  (FP8 GEMMs of these shapes: over 1000 FLOP/B; causal attention of s keys: s/4 FLOP/B, over 256
  for s ≥ 1024, above the H100's ridge at the rates reached, 0.6 × 989.4/3350 × 1000 = 177), so
  t_H100 = t_H200 × (H200 peak / H100 peak) = t_H200 × 1. Attention order: cudnn-frontend's
  kernel-only H200 timings [S8], then the FA3 paper's H100 cuDNN forward [S5], then ours
  (h200/attention.csv, whose per-call times hold host dispatch). FlashAttention-2's forward [S5]
  and derived backward (above) are kept as ``fa2_*``.
"""
from __future__ import annotations

import csv
import os
import re

HEADER = "op,dtype,dims,tflops,source\n"
_XLA = "openxla/xla"
_H100_XLA = "H100 (sm_90"
_B200_XLA = "B200 (sm_100_B200)"
_H100_ATTN = "H100 80GB SXM5"
LAUNCH = 4e-6  # s: the catalog's launch_overhead of H200-SXM (and H100), added back by the model
LAUNCH_BOUND = 60e-6  # s: h200/sources.md: "the smallest shapes (about 60 us and below) include the host's dispatch"


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _dtype(text: str) -> str:
    t = text.lower()
    if "fp8" in t:
        return "fp8"
    if t.startswith("fp16"):
        return "fp16"
    return "bf16" if t.startswith("bf16") else ""


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _gemm_rows(rows: list[dict[str, str]], gpu: str) -> list[str]:
    """gemm rows of one GPU: the XLA grid of ``gpu`` and the other sources' rows of the same GPU."""
    out = []
    for i, r in enumerate(rows, start=1):
        g, src, notes = r["gpu"], r["source"], r["notes"]
        if "SUSPECT" in notes or "SUSPECT" in src:
            continue
        if gpu == "h100":
            ours = g.startswith(_H100_XLA) or g in ("NVIDIA H100 SXM", "H100 (variant not stated)")
        else:
            ours = g == _B200_XLA or g == "NVIDIA B200 SXM"
        dtype = _dtype(r["dtype"])
        if not ours or not dtype:  # fp32 (XLA default precision) rows: no precision of ours uses them
            continue
        m = re.search(r"batch b=(\d+)", notes) if src.startswith(_XLA) else None
        batch = int(m.group(1)) if m else 1
        dims = f"{batch}x{int(r['M'])}x{int(r['N'])}x{int(r['K'])}"
        out.append(f"gemm,{dtype},{dims},{_fmt(float(r['tflops']))},h100/gemm.csv row {i}\n")
    return out


def _causal(text: str) -> str:
    return "_causal" if text == "True" else ""


def _attention_rows(rows: list[dict[str, str]]) -> list[str]:
    """The H100's own attention rows: the FA3 paper's cuDNN forward [S5] as ``attention_fwd``, and
    FlashAttention-2's forward and derived backward as ``fa2_*``."""
    out, fa2 = [], []
    fa2_fwd: dict[tuple[str, str, str], tuple[float, int]] = {}
    for i, r in enumerate(rows, start=1):
        if r["gpu"] != _H100_ATTN or r["direction"] != "fwd" or r["kernel"] not in ("cudnn", "fa2"):
            continue
        key = (r["causal"], r["head_dim"], r["seq_len"])
        if r["kernel"] == "fa2":
            fa2_fwd[key] = (float(r["tflops"]), i)
            fa2.append(f"fa2_fwd{_causal(r['causal'])},fp16,{r['head_dim']}x{r['seq_len']},"
                       f"{_fmt(float(r['tflops']))},h100/attention.csv row {i} (FlashAttention-2)\n")
            continue
        out.append(f"attention_fwd{_causal(r['causal'])},fp16,{r['head_dim']}x{r['seq_len']},"
                   f"{_fmt(float(r['tflops']))},h100/attention.csv row {i} (cuDNN)\n")
    for i, r in enumerate(rows, start=1):
        if r["gpu"] != _H100_ATTN or r["kernel"] != "fa2" or r["direction"] != "fwd+bwd":
            continue
        key = (r["causal"], r["head_dim"], r["seq_len"])
        if key not in fa2_fwd:
            continue
        fwd, j = fa2_fwd[key]
        bwd = 2.5 / (3.5 / float(r["tflops"]) - 1.0 / fwd)
        fa2.append(f"fa2_bwd{_causal(r['causal'])},fp16,{r['head_dim']}x{r['seq_len']},{_fmt(bwd)},"
                   f"h100/attention.csv rows {i} and {j} (FlashAttention-2 fwd+bwd less fwd)\n")
    return out + fa2


def _head_dim(text: str) -> int:
    """A head dim, or DeepSeek-V3's "192/128" (query-key / value) as their mean: the FLOPs are
    2·s²·(d_qk + d_v) per head forward (S8's convention), 4·s²·d at d = (d_qk + d_v)/2, as layer.py."""
    parts = [int(x) for x in text.split("/")]
    return sum(parts) // len(parts)


def _cudnn_h200_rows(rows: list[dict[str, str]], note: str = "") -> list[str]:
    """cudnn-frontend's cuDNN SDPA rows of a named "H200" [S8], bf16 and fp8 (``training.fp8_dot_product_attention``),
    forward and backward; the sliding-window rows (gpt-oss) are left out: their keys per query are the window's,
    not the sequence's."""
    out = []
    for i, r in enumerate(rows, start=1):
        if r["gpu"] != "H200" or r["kernel"] != "cudnn" or r["dtype"] not in ("bf16", "fp8") \
                or r["direction"] not in ("fwd", "bwd"):
            continue
        if "sliding" in r["notes"]:
            continue
        out.append(f"attention_{r['direction']}{_causal(r['causal'])},{r['dtype']},{_head_dim(r['head_dim'])}x"
                   f"{r['seq_len']},{_fmt(float(r['tflops']))},h100/attention.csv row {i} (cuDNN on H200{note})\n")
    return out


def _h200_time_rate(flops: float, seconds: float) -> float:
    """TFLOP/s of a kernel timed with its launch: FLOPs / (time − LAUNCH)."""
    return flops / (seconds - LAUNCH) / 1e12


def _h200_gemm_rows(gemm: list[dict[str, str]], fp8: list[dict[str, str]], mamf: list[dict[str, str]]) -> list[str]:
    out = []
    for i, r in enumerate(gemm, start=1):
        m, n, k, t = int(r["M"]), int(r["N"]), int(r["K"]), float(r["time_us"]) * 1e-6
        if t > LAUNCH_BOUND:
            out.append(f"gemm,bf16,1x{m}x{n}x{k},{_fmt(_h200_time_rate(2.0 * m * n * k, t))},h200/gemm.csv row {i}\n")
    for col, dtype in (("fp8_us", "fp8"), ("bf16_us", "bf16")):
        for i, r in enumerate(fp8, start=1):
            m, n, k, t = int(r["M"]), int(r["N"]), int(r["K"]), float(r[col]) * 1e-6
            if t > LAUNCH_BOUND:
                out.append(f"gemm,{dtype},1x{m}x{n}x{k},{_fmt(_h200_time_rate(2.0 * m * n * k, t))},"
                           f"h200/fp8_gemm.csv row {i} {col}\n")
    for i, r in enumerate(mamf, start=1):
        if r["gpu"] == "NVIDIA H200 SXM" and _dtype(r["dtype"]) == "fp8":
            out.append(f"gemm,fp8,1x{int(r['M'])}x{int(r['N'])}x{int(r['K'])},{_fmt(float(r['tflops']))},"
                       f"h100/gemm.csv row {i} (mamf-finder)\n")
    return out


def _h200_attention_rows(rows: list[dict[str, str]], note: str = "") -> list[str]:
    """h200/attention.csv: forward F/(fwd − LAUNCH), backward 2.5·F/(fwd_bwd − fwd − LAUNCH)."""
    out = []
    for i, r in enumerate(rows, start=1):
        b, h, s, d = (int(r[c]) for c in ("batch", "heads", "seq_len", "head_dim"))
        causal = r["causal"] == "True"
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        t_f, t_fb = float(r["fwd_us"]) * 1e-6, float(r["fwd_bwd_us"]) * 1e-6
        c = _causal(r["causal"])
        out.append(f"attention_fwd{c},bf16,{d}x{s},{_fmt(_h200_time_rate(flops, t_f))},"
                   f"h200/attention.csv row {i}{note}\n")
        out.append(f"attention_bwd{c},bf16,{d}x{s},{_fmt(_h200_time_rate(2.5 * flops, t_fb - t_f))},"
                   f"h200/attention.csv row {i} (fwd_bwd less fwd){note}\n")
    return out


def _field(text: str, key: str) -> str:
    m = re.search(rf"{key}=(\w+)", text)
    return m.group(1) if m else ""


def _b200_attention_rows(rows: list[dict[str, str]]) -> list[str]:
    """blackwell/attention.csv: what ``training.attention: flash`` and ``fa2`` run on sm_100.

    Transformer Engine gives its FusedAttention (cuDNN) preference on Hopper and later
    (transformer_engine/pytorch/attention/dot_product_attention/utils.py @ d0067d0, "Disabling
    FlashAttention to give FusedAttention preference on Hopper+"), and FA3 is sm90 only (same file:
    "Disabling FlashAttention 3 for compute capability != sm90"): ``flash`` is cuDNN's fused attention.
    cuDNN's sm_100 forward is measured at head dim 64 [S11]; at head dim 128, and for every backward,
    only FlashAttention-4 is [S8], so its rows stand in for cuDNN's (S11 measured cuDNN's forward within
    -10% to +0.3% of FA4's at head dim 64, the only shapes measured for both). FA4's backward is the
    2-CTA non-deterministic kernel, the default for head dim 128 since PR #2280. ``fa2``: FlashAttention-2
    2.7.4 on a B200 [S10] (no sm_100 path: a legacy kernel). Rates in the FlashAttention convention, as
    printed (ms-long kernels: no launch correction)."""
    out = []
    for i, r in enumerate(rows, start=1):
        op, shape, src = r["op"], r["shape_or_size"], r["source"]
        d, c, seq = _field(shape, "hdim"), _field(shape, "causal"), _field(shape, "seqlen")
        if not (d and c and seq):
            continue
        causal = _causal(c)
        if src.startswith("S11") and op.startswith("cuDNN SDPA forward"):
            kind, note = "attention_fwd", "cuDNN"
        elif src.startswith("S8") and "deterministic" not in op and op.endswith((" fwd", "bwd 2CTA")):
            kind = f"attention_{'fwd' if op.endswith(' fwd') else 'bwd'}"
            note = "FlashAttention-4 standing in for cuDNN"
        elif src.startswith("S10") and r["gpu"] == "NVIDIA B200" and op.split(" (")[0].split()[-1] in ("fwd", "bwd"):
            kind, note = f"fa2_{op.split(' (')[0][-3:]}", "FlashAttention-2"
        else:
            continue
        out.append(f"{kind}{causal},bf16,{d}x{seq},{_fmt(float(r['value']))},"
                   f"blackwell/attention.csv row {i} ({note})\n")
    return out


# GB200's FP8 and FP4 peaks over the B200's (NVIDIA GB200 NVL72 and HGX B200 datasheets: 5000 against 4500
# TFLOP/s dense FP8, 10000 against 9000 FP4): a GB200 rate is carried to the B200 at the same fraction of peak.
GB200_TO_B200 = 4500.0 / 5000.0


def _b200_sustained_gemm_rows(rows: list[dict[str, str]]) -> list[str]:
    """blackwell/gemm.csv, Azure's GB200 cuBLASLt GEMMs [S3] carried to the B200 (GB200_TO_B200): the only
    Blackwell GEMMs timed at sustained clocks (10,000 warm-up and 1,000 timed iterations: a training step's
    GEMMs run back to back at the power limit, where mamf-finder's 50 + 100 and XLA's profiles are bursts).
    ``-t fp8e4m3`` rows as ``fp8``; ``-t fp4e2m1`` as ``nvfp4`` (cuBLASLt's FP4 GEMMs are block-scaled;
    NVFP4 or MXFP4 is not stated). Rows of LAUNCH_BOUND or less are left out, as for the H200."""
    out = []
    for i, r in enumerate(rows, start=1):
        if not r["source"].startswith("S3") or "cublaslt_gemm" not in r["op"]:
            continue
        dtype = "nvfp4" if r["precision"].startswith("FP4") else "fp8" if r["precision"].startswith("FP8") else ""
        m = re.match(r"(\d+)x(\d+)x(\d+) \(MxNxK\), batch (\d+)", r["shape_or_size"])
        if not dtype or not m:
            continue
        mm, n, k, b = (int(x) for x in m.groups())
        rate = float(r["value"])
        if 2.0 * b * mm * n * k / (rate * 1e12) <= LAUNCH_BOUND:
            continue
        out.append(f"gemm,{dtype},{b}x{mm}x{n}x{k},{_fmt(rate * GB200_TO_B200)},blackwell/gemm.csv row {i} "
                   f"(GB200 cuBLASLt sustained; x 4500/5000 to the B200)\n")
    return out


def derive(h100_dir: str, h200_dir: str = "") -> dict[str, str]:
    """The shipped tables' text, by table name, from the shared ``h100`` and ``h200`` calibration
    folders (``h200_dir`` absent: the ``h200`` folder beside ``h100_dir``)."""
    h200_dir = h200_dir or os.path.join(os.path.dirname(os.path.abspath(h100_dir)), "h200")
    gemm = _rows(os.path.join(h100_dir, "gemm.csv"))
    attention = _rows(os.path.join(h100_dir, "attention.csv"))
    g200, f200, a200 = (_rows(os.path.join(h200_dir, f)) for f in ("gemm.csv", "fp8_gemm.csv", "attention.csv"))
    blackwell = os.path.join(os.path.dirname(os.path.abspath(h100_dir)), "blackwell")
    b200_gemm, b200_attention = (_rows(os.path.join(blackwell, f)) for f in ("gemm.csv", "attention.csv"))
    head = ("# Measured kernels (emulator/tools/kernel_tables.py derives this file from "
            "../shared/calibration/h100/ and h200/;\n# row N = the N-th data row of that file; sources in its "
            "sources.md).\n# tflops: FLOP/s / 1e12 (GEMM 2*b*m*n*k; attention 4*b*h*s^2*d, /2 causal, backward x2.5)\n")
    carried = "; carried to H100: compute-bound; same SMs and clocks"
    fp8_carried = [row.replace(" fp8_us\n", f" fp8_us{carried}\n") for row in _h200_gemm_rows([], f200, [])
                   if row.startswith("gemm,fp8,")]
    own = _attention_rows(attention)
    h100_attention = (_cudnn_h200_rows(attention, carried) + [r for r in own if r.startswith("attention_")]
                      + _h200_attention_rows(a200, f" ({carried[2:]})") + [r for r in own if r.startswith("fa2_")])
    return {"h100": head + HEADER + "".join(_gemm_rows(gemm, "h100") + fp8_carried + h100_attention),
            "h200": head + HEADER + "".join(_h200_gemm_rows(g200, f200, gemm) + _h200_attention_rows(a200)
                                            + _cudnn_h200_rows(attention)),
            "b200": head + HEADER + "".join(_gemm_rows(gemm, "b200") + _b200_sustained_gemm_rows(b200_gemm)
                                            + _b200_attention_rows(b200_attention))}


def write(h100_dir: str, out_dir: str) -> list[str]:
    """Write the derived tables into ``out_dir``; returns the paths written."""
    from emulator.outputs.atomic import write_text

    paths = []
    for name, text in derive(h100_dir).items():
        path = os.path.join(out_dir, f"{name}.csv")
        write_text(path, text)
        paths.append(path)
    return paths


# --- FP8 attention references (workload/kernel_cost.py, fp8_attention_speedup) ----------------------------------
# cudnn-frontend's sdpa_benchmark_training results on GB200 and GB300 (NVIDIA/cudnn-frontend @ 3929da2,
# benchmark/sdpa_benchmark_training/results/{llama3.1,dsv3}/{gb200,gb300}/*.csv: cuDNN 9.22, batch 2), BF16, FP8 and
# MXFP8 rows of one benchmark, so their ratios compare like with like. Not in ../shared: the files below are vendored
# as emulator/data/kernels/dpa_gb200.csv and dpa_gb300.csv by :func:`dpa_rows`.
DPA_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "mxfp8": "mxfp8"}


def dpa_rows(text: str, source: str) -> list[str]:
    """The table rows of one sdpa_benchmark_training results CSV: forward and backward, non-deterministic, no sliding
    window, head dim the mean of query-key and value dims (as layer.py costs MLA), dims head_dim x keys;
    ``source`` names the file (row N = its N-th data row)."""
    out = []
    for i, r in enumerate(csv.DictReader(text.splitlines()), start=1):
        if r["profile_pass"] not in ("fwd", "bwd") or r["deterministic_bwd"] != "False" or r["sliding_window_size"] \
                or r["success"] != "True" or r["data_type"] not in DPA_DTYPES:
            continue
        causal = "_causal" if r["attn_mask"] == "top_left" else ""
        d = (int(r["head_dim_qk"]) + int(r["head_dim_vo"])) // 2
        out.append(f"attention_{r['profile_pass']}{causal},{DPA_DTYPES[r['data_type']]},{d}x{r['kv_seqlen']},"
                   f"{_fmt(float(r['tflops']))},{source} row {i}\n")
    return out

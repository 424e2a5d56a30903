"""Kernel tables: derives the built-in measured-kernel tables from the shared calibration set.

``derive(h100_dir)`` reads ``../shared/calibration/h100/{gemm,attention}.csv`` and returns
the text of the package files ``emulator/data/kernels/h100.csv`` and ``b200.csv`` (the
format :mod:`emulator.devices.kernels` reads). Every output row cites the row it came from:
``h100/gemm.csv row N`` is the N-th data row (line N + 1, after the header).
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
  mamf-finder best shapes of "NVIDIA B200 SXM" [S1]. No B200 attention rows exist.
The A100 has no table (its model was fitted on it: compute.py).
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


def _attention_rows(rows: list[dict[str, str]]) -> list[str]:
    out = []
    fa2_fwd: dict[tuple[str, str, str], tuple[float, int]] = {}
    for i, r in enumerate(rows, start=1):
        if r["gpu"] != _H100_ATTN or r["direction"] != "fwd" or r["kernel"] not in ("cudnn", "fa2"):
            continue
        key = (r["causal"], r["head_dim"], r["seq_len"])
        if r["kernel"] == "fa2":
            fa2_fwd[key] = (float(r["tflops"]), i)
            continue
        op = "attention_fwd" + ("_causal" if r["causal"] == "True" else "")
        out.append(f"{op},fp16,{r['head_dim']}x{r['seq_len']},{_fmt(float(r['tflops']))},"
                   f"h100/attention.csv row {i} (cuDNN)\n")
    for i, r in enumerate(rows, start=1):
        if r["gpu"] != _H100_ATTN or r["kernel"] != "fa2" or r["direction"] != "fwd+bwd":
            continue
        key = (r["causal"], r["head_dim"], r["seq_len"])
        if key not in fa2_fwd:
            continue
        fwd, j = fa2_fwd[key]
        bwd = 2.5 / (3.5 / float(r["tflops"]) - 1.0 / fwd)
        op = "attention_bwd" + ("_causal" if r["causal"] == "True" else "")
        out.append(f"{op},fp16,{r['head_dim']}x{r['seq_len']},{_fmt(bwd)},"
                   f"h100/attention.csv rows {i} and {j} (FlashAttention-2 fwd+bwd less fwd)\n")
    return out


def derive(h100_dir: str) -> dict[str, str]:
    """The shipped tables' text, by table name, from the shared ``h100`` calibration folder."""
    gemm = _rows(os.path.join(h100_dir, "gemm.csv"))
    attention = _rows(os.path.join(h100_dir, "attention.csv"))
    head = ("# Measured kernels (emulator/tools/kernel_tables.py derives this file from "
            "../shared/calibration/h100/;\n# row N = the N-th data row of that file; sources in its sources.md).\n"
            "# tflops: FLOP/s / 1e12 (GEMM 2*b*m*n*k; attention 4*b*h*s^2*d, /2 causal, backward x2.5)\n")
    return {"h100": head + HEADER + "".join(_gemm_rows(gemm, "h100") + _attention_rows(attention)),
            "b200": head + HEADER + "".join(_gemm_rows(gemm, "b200"))}


def write(h100_dir: str, out_dir: str) -> list[str]:
    """Write the derived tables into ``out_dir``; returns the paths written."""
    from emulator.outputs.atomic import write_text

    paths = []
    for name, text in derive(h100_dir).items():
        path = os.path.join(out_dir, f"{name}.csv")
        write_text(path, text)
        paths.append(path)
    return paths

"""Kernel fit: how well the kernel model gives back the H200's own per-shape measurements.

Two checks over ../shared/calibration/h200/ (gemm.csv, fp8_gemm.csv, attention.csv):

- **lookup**: each measurement predicted by the model with the built-in ``h200`` table as shipped
  (so a row of the table gives back its time: exact hit, flops / rate + launch);
- **leave-one-out**: each measurement predicted from the table without the rows derived from it
  (a GEMM row; both the forward and backward rows of an attention measurement): what the model
  says of a shape it has not seen, by interpolation among its neighbours, else the roofline.

GEMMs are predicted as ``compute.gemm_cost`` predicts them (the same lookup and roofline);
attention as ``compute.attention_cost`` (forward; forward + backward against ``fwd_bwd_us``).
Rows of 60 µs or less (emulator/tools/kernel_tables.py: host dispatch, not kernel time) are not
in the table; they are reported with ``dispatch_bound: true`` and left out of the medians.
Pure functions; benchmarks/kernel_fit.py prints and writes the result.
"""
from __future__ import annotations

import csv
import os
import statistics
from dataclasses import dataclass

from emulator.devices import compute, kernels
from emulator.scenario.spec import GpuSpec
from emulator.tools.kernel_tables import LAUNCH_BOUND


@dataclass(frozen=True)
class Case:
    """One measurement: what ran, its FLOPs, the measured seconds, the table rows derived from it."""

    group: str  # gemm_bf16 | gemm_fp8 | attention_fwd | attention_fwd_bwd
    label: str
    seconds: float
    cite: str  # the source text of the table rows derived from this measurement (prefix)
    dims: tuple[int, ...]  # gemm: (1, m, n, k); attention: (batch, heads, kv_heads, seq, head_dim, causal)
    aligned: bool = True

    @property
    def dispatch_bound(self) -> bool:
        return self.seconds <= LAUNCH_BOUND


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def cases(h200_dir: str) -> list[Case]:
    """The measurements of the H200 folder, in file order."""
    out = []
    dims: tuple[int, ...]
    for i, r in enumerate(_rows(os.path.join(h200_dir, "gemm.csv")), start=1):
        dims = (1, int(r["M"]), int(r["N"]), int(r["K"]))
        out.append(Case("gemm_bf16", f"bf16 {r['M']}x{r['N']}x{r['K']}", float(r["time_us"]) * 1e-6,
                        f"h200/gemm.csv row {i}", dims, kernels.gemm_aligned(dims, 2)))
    for i, r in enumerate(_rows(os.path.join(h200_dir, "fp8_gemm.csv")), start=1):
        dims = (1, int(r["M"]), int(r["N"]), int(r["K"]))
        out.append(Case("gemm_fp8", f"fp8 {r['M']}x{r['N']}x{r['K']}", float(r["fp8_us"]) * 1e-6,
                        f"h200/fp8_gemm.csv row {i} fp8_us", dims, kernels.gemm_aligned(dims, 1)))
    for i, r in enumerate(_rows(os.path.join(h200_dir, "attention.csv")), start=1):
        dims = tuple(int(r[c]) for c in ("batch", "heads", "kv_heads", "seq_len", "head_dim")) + (
            int(r["causal"] == "True"),)
        label = f"b{r['batch']} h{r['heads']}/{r['kv_heads']} s{r['seq_len']} d{r['head_dim']}"
        cite = f"h200/attention.csv row {i}"
        out.append(Case("attention_fwd", f"fwd {label}", float(r["fwd_us"]) * 1e-6, cite, dims))
        out.append(Case("attention_fwd_bwd", f"fwd+bwd {label}", float(r["fwd_bwd_us"]) * 1e-6, cite, dims))
    return out


def _table_without(cite: str) -> kernels.KernelTable:
    """The built-in h200 table less the rows derived from one measurement (their source starts with ``cite``:
    "row 1" must not drop "row 10", so the cite is matched up to a space or the end)."""
    keep = [e for e in kernels.builtin("h200") if not (e[4] == cite or e[4].startswith(cite + " "))]
    return kernels.KernelTable(keep)


def _gemm(case: Case, gpu: GpuSpec, table: kernels.KernelTable) -> tuple[float, str]:
    dtype = "fp8" if case.group == "gemm_fp8" else "bf16"
    g = compute.at_dtype(gpu, dtype)
    nbytes = kernels.DTYPE_BYTES[dtype]
    _, m, n, k = case.dims
    hit = table.lookup("gemm", dtype, case.dims, lambda d: compute.gemm_rate(d, g, nbytes))
    if hit is None:
        return compute.gemm_time(m, n, k, g, nbytes), kernels.ROOFLINE
    return compute.gemm_flops(m, n, k) / hit.rate + g.launch_overhead, hit.source


def _attention(case: Case, gpu: GpuSpec, table: kernels.KernelTable, backward: bool) -> tuple[float, str]:
    b, h, _kv, s, d, causal = case.dims
    op = f"attention_{'bwd' if backward else 'fwd'}{'_causal' if causal else ''}"
    hit = table.lookup(op, "bf16", (d, s))
    if hit is None:
        return compute.flash_attention_time(b * h, s, s, d, gpu, bool(causal), backward), kernels.ROOFLINE
    flops = compute.attention_flops(b, h, s, s, d, bool(causal), backward)
    return flops / hit.rate + gpu.launch_overhead, hit.source


def predict(case: Case, gpu: GpuSpec, table: kernels.KernelTable) -> tuple[float, str]:
    """(seconds, source of the worst-sourced part) the model gives ``case`` with ``table``."""
    if case.group.startswith("gemm"):
        return _gemm(case, gpu, table)
    t, src = _attention(case, gpu, table, False)
    if case.group == "attention_fwd":
        return t, src
    t_b, src_b = _attention(case, gpu, table, True)
    order = kernels.SOURCES
    return t + t_b, order[max(order.index(src), order.index(src_b))]


def check(h200_dir: str, gpu: GpuSpec) -> dict:
    """Per case: measured, lookup and leave-one-out predictions and errors; medians per group."""
    full = kernels.KernelTable(kernels.builtin("h200"))
    rows = []
    for c in cases(h200_dir):
        t_l, s_l = predict(c, gpu, full)
        t_o, s_o = predict(c, gpu, _table_without(c.cite))
        rows.append({"group": c.group, "case": c.label, "aligned": c.aligned, "dispatch_bound": c.dispatch_bound,
                     "measured_s": c.seconds, "lookup_s": t_l, "lookup_source": s_l,
                     "lookup_error": t_l / c.seconds - 1, "loo_s": t_o, "loo_source": s_o,
                     "loo_error": t_o / c.seconds - 1})
    return {"rows": rows, "summary": summary(rows)}


def _median_abs(rows: list[dict], key: str) -> float:
    return statistics.median(abs(r[key]) for r in rows) if rows else 0.0


def summary(rows: list[dict]) -> dict:
    """Median absolute lookup and leave-one-out errors per group, for the unaligned GEMMs, and for
    the headline set (bf16 GEMMs and attention: the issue's "per-shape H200 GEMM and attention
    measurements"); dispatch-bound rows are left out."""
    used = [r for r in rows if not r["dispatch_bound"]]
    sets = {g: [r for r in used if r["group"] == g] for g in sorted({r["group"] for r in used})}
    sets["gemm_unaligned"] = [r for r in used if not r["aligned"]]
    sets["headline"] = [r for r in used if r["group"] != "gemm_fp8"]
    return {name: {"n": len(rs), "lookup_median_abs_error": _median_abs(rs, "lookup_error"),
                   "loo_median_abs_error": _median_abs(rs, "loo_error")} for name, rs in sets.items()}

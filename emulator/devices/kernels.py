"""The measured kernel database: FLOP/s per (GPU, op kind, dtype, shape), from measurements.

A GPU's table is its catalog field ``kernel_table`` (a built-in table of
``emulator/data/kernels/``: ``h100``, ``b200``) plus its ``kernels`` entries (per-shape
times a user measured, e.g. written by ``emulator calibrate --kineto``; they come first).
The compute model (compute.py, ``measured_first``) asks :func:`lookup` before its roofline:

1. **measured**: an entry of exactly this shape (a GEMM also matches with m and n swapped:
   Cᵀ = Bᵀ·Aᵀ does the same work);
2. **interpolated**: the shape lies inside a measured grid: the rate is interpolated
   multilinearly in log-shape space (log of every dimension) on log(rate), from the 2^d
   grid corners that bracket it; every corner must have been measured;
   else, the shape lies inside the measured range (each dimension between the smallest and
   largest measured) and has measured neighbours within one octave (a factor 2) in every dimension:
   the rate is the caller's ``prior`` (compute.py's roofline rate, which knows tile and wave
   quantisation) times the inverse-distance-weighted (Shepard, weights 1/d², d the Euclidean
   distance in log-shape space) geometric mean of measured/prior over those neighbours;
   without a prior, the weighted geometric mean of their rates;
3. otherwise ``None``: the roofline costs it (compute.py).

**Unaligned GEMMs.** cuBLAS runs a GEMM whose operands' leading dimensions are not multiples of
16 bytes (8 bf16/fp16 elements, 16 fp8) on its unaligned fallback kernels
(``cutlass_75_tensorop_bf16_s1688gemm_..._align1``: ../shared/calibration/h200/sources.md), about
a sixth of the aligned rate. Such a GEMM is looked up only among unaligned entries, and an
aligned one only among aligned entries: the two are different kernels, never interpolated
into each other (:func:`gemm_aligned`). The leading dimensions are those of a Linear layer's
forward, y[m, n] = x[m, k] · w[n, k]ᵀ: k (of x and w) and n (of y); m, the rows (tokens), is
none (the cuBLAS documentation puts the 16-byte requirement on lda, ldb and ldc, not on m, n, k).
A caller whose rows are another dimension says which (``rows``: a weight gradient dW = dYᵀ·X,
written (k_in, n_out, tokens), has rows = 3).

Op kinds and their dims:
- ``gemm``: (batch, m, n, k); FLOPs 2·batch·m·n·k;
- ``attention_fwd``, ``attention_bwd`` and their ``_causal`` forms: (head_dim, seq_len) of a
  fused attention kernel as ``training.attention: flash`` runs it (cuDNN's fused flash
  attention, as Transformer Engine and PyTorch SDPA pick it on sm90), FLOPs in the
  FlashAttention convention (4·b·heads·s²·d forward, halved when causal; backward 2.5 × forward);
- ``fa2_fwd``, ``fa2_bwd`` and their ``_causal`` forms: the same for FlashAttention-2's kernels.

bf16 and fp16 run the same tensor-core rate on Hopper and Blackwell (NVIDIA H100 datasheet:
989.4 TFLOP/s dense for each; B200: 2.25 PFLOP/s for each), so a dtype with no row of its
own is looked up in the other's rows.

Table files (CSV, ``#`` lines are comments): ``op,dtype,dims,tflops,source``; dims are
``x``-joined integers; ``source`` cites the measurement (file and row).
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from itertools import product
from typing import Callable

import numpy as np

from emulator.errors import CatalogError
from emulator.scenario.spec import GpuSpec

MEASURED, INTERPOLATED, ROOFLINE = "measured", "interpolated", "roofline"
SOURCES = (MEASURED, INTERPOLATED, ROOFLINE)
BUILTIN = ("h100", "h200", "b200")
OPS = {"gemm": 4, "attention_fwd": 2, "attention_bwd": 2, "attention_fwd_causal": 2, "attention_bwd_causal": 2,
       "fa2_fwd": 2, "fa2_bwd": 2, "fa2_fwd_causal": 2, "fa2_bwd_causal": 2}
_ALIASES = {"bf16": "fp16", "fp16": "bf16"}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4, "tf32": 4}
# cuBLAS's tensor-core kernels need every leading dimension to be a multiple of 16 bytes (cuBLAS
# documentation, "Tensor Core Usage"); below it cuBLAS falls back to the align1 kernels
# (../shared/calibration/h200/sources.md, gemm.csv).
ALIGN_BYTES = 16
UNALIGNED = "gemm_align1"  # the table key of unaligned GEMM entries
NEIGHBOURHOOD = 1.0  # octaves (log2): how far a measured neighbour may lie, in each dimension
Prior = Callable[[tuple[int, ...]], float]


def gemm_aligned(dims: tuple[int, ...], dtype_bytes: int, rows: int = 1) -> bool:
    """Whether GEMM dims (batch, m, n, k) have leading dimensions of multiples of 16 bytes: every one
    of m, n, k but ``rows`` (the index of the rows, no operand's leading dimension: 1, m, in a
    Linear's forward and input gradient; 3, the tokens k, in its weight gradient)."""
    return all(d * dtype_bytes % ALIGN_BYTES == 0 for i, d in enumerate(dims[1:], start=1) if i != rows)


def table_key(op: str, dtype: str, dims: tuple[int, ...], rows: int = 1) -> str:
    """The op an entry is grouped under: ``gemm_align1`` for an unaligned GEMM, else ``op``."""
    if op == "gemm" and not gemm_aligned(dims, DTYPE_BYTES.get(dtype, 2), rows):
        return UNALIGNED
    return op


@dataclass(frozen=True)
class Hit:
    """What the table says of one kernel: its rate (FLOP/s), how it was found, from which rows."""

    rate: float
    source: str  # measured | interpolated
    cites: tuple[str, ...]


class _Group:
    """The entries of one (op, dtype): exact points and the axes of their grid."""

    def __init__(self, points: dict[tuple[int, ...], tuple[float, str]]) -> None:
        self.points = points
        dims = len(next(iter(points)))
        self.axes = [sorted({p[i] for p in points}) for i in range(dims)]
        # each entry's log-shape (math.log, as the query's), and as one array for the neighbourhood's filter
        self._entries = [(p, tuple(math.log(x) for x in p), got) for p, got in points.items()]
        self._logs = np.array([lp for _, lp, _ in self._entries], dtype=float)

    def exact(self, dims: tuple[int, ...], swap_mn: bool) -> Hit | None:
        got = self.points.get(dims)
        if got is None and swap_mn:
            got = self.points.get((dims[0], dims[2], dims[1], dims[3]))
        return Hit(got[0], MEASURED, (got[1],)) if got else None

    def interpolate(self, dims: tuple[int, ...]) -> Hit | None:
        brackets = []
        for x, axis in zip(dims, self.axes):
            if x < axis[0] or x > axis[-1]:
                return None
            lo = max(v for v in axis if v <= x)
            hi = min(v for v in axis if v >= x)
            w = 0.0 if hi == lo else (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
            brackets.append(((lo, 1.0 - w), (hi, w)) if hi != lo else ((lo, 1.0),))
        log_rate, cites = 0.0, []
        for corner in product(*brackets):
            weight = math.prod(w for _, w in corner)
            got = self.points.get(tuple(v for v, _ in corner))
            if got is None:
                return None
            log_rate += weight * math.log(got[0])
            cites.append(got[1])
        return Hit(math.exp(log_rate), INTERPOLATED, tuple(cites))

    def neighbours(self, dims: tuple[int, ...], prior: Prior | None) -> Hit | None:
        """Inside the measured range (every dimension within the measured ones), Shepard interpolation
        over the entries within NEIGHBOURHOOD octaves in every dimension:
        prior(dims) · exp(Σ w·log(rate/prior) / Σ w), w = 1/d² (d: log-shape distance); None: none near."""
        if any(x < axis[0] or x > axis[-1] for x, axis in zip(dims, self.axes)):
            return None  # outside the measured range: the roofline's
        logs = [math.log(x) for x in dims]
        num = den = 0.0
        cites = []
        # the entries within the neighbourhood in every dimension, in table order (the same float operations
        # as one max(abs(a − b)) per entry, done at once)
        near = np.abs(self._logs - np.array(logs)).max(axis=1) <= NEIGHBOURHOOD * math.log(2) + 1e-9
        for i in np.flatnonzero(near).tolist():
            p, lp, (rate, cite) = self._entries[i]
            w = 1.0 / sum((a - b) ** 2 for a, b in zip(logs, lp))  # p != dims: exact() came first
            num += w * (math.log(rate / prior(p)) if prior else math.log(rate))
            den += w
            cites.append(cite)
        if not cites:
            return None
        base = prior(dims) if prior else 1.0
        return Hit(base * math.exp(num / den), INTERPOLATED, tuple(cites))


class KernelTable:
    """Entries (op, dtype, dims, FLOP/s, source), grouped for lookup. Earlier entries win."""

    def __init__(self, entries: list[tuple[str, str, tuple[int, ...], float, str]]) -> None:
        points: dict[tuple[str, str], dict[tuple[int, ...], tuple[float, str]]] = {}
        for op, dtype, dims, rate, source in entries:
            points.setdefault((table_key(op, dtype, dims), dtype), {}).setdefault(dims, (rate, source))
        self.groups = {key: _Group(p) for key, p in points.items()}

    def __len__(self) -> int:
        return sum(len(g.points) for g in self.groups.values())

    def lookup(self, op: str, dtype: str, dims: tuple[int, ...], prior: Prior | None = None,
               rows: int = 1) -> Hit | None:
        """Exact, else grid-interpolated, else from near neighbours (``prior``: the model's rate of a
        shape, see the module docstring), in this dtype's rows, then in its alias's; None: not covered.
        ``rows``: which GEMM dim is no leading dimension (:func:`gemm_aligned`)."""
        key = table_key(op, dtype, dims, rows)
        groups = [g for d in (dtype, _ALIASES.get(dtype)) if (g := self.groups.get((key, d or ""))) is not None]
        for g in groups:
            if (hit := g.exact(dims, op == "gemm")) is not None:
                return hit
        for g in groups:
            if (hit := g.interpolate(dims)) is not None:
                return hit
        for g in groups:
            if (hit := g.neighbours(dims, prior)) is not None:
                return hit
        return None


def parse_table(text: str, where: str) -> list[tuple[str, str, tuple[int, ...], float, str]]:
    """The rows of a table file; CatalogError naming ``where`` and the line for a bad row."""
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip() and not ln.startswith("#")]
    if not lines or lines[0][1].strip() != "op,dtype,dims,tflops,source":
        raise CatalogError(f"{where}: expected the header 'op,dtype,dims,tflops,source'")
    out = []
    for (i, _), row in zip(lines[1:], csv.reader(io.StringIO("\n".join(ln for _, ln in lines[1:])))):
        try:
            op, dtype, dims_text, tflops, source = row
            dims = tuple(int(d) for d in dims_text.split("x"))
            rate = float(tflops) * 1e12
        except ValueError:
            raise CatalogError(f"{where}: line {i}: expected op,dtype,dims (e.g. 1x4096x4096x4096),tflops,source"
                               ) from None
        if OPS.get(op) != len(dims) or not rate > 0 or min(dims) < 1:
            raise CatalogError(f"{where}: line {i}: expected an op of {', '.join(OPS)} with its dims "
                               f"(gemm: batch x m x n x k; attention: head_dim x seq_len) and a positive rate")
        out.append((op, dtype, dims, rate, source))
    return out


@lru_cache(maxsize=None)
def builtin(name: str) -> list[tuple[str, str, tuple[int, ...], float, str]]:
    """The rows of a built-in table (emulator/data/kernels/NAME.csv)."""
    if name not in BUILTIN:
        raise CatalogError(f'unknown kernel table "{name}" (known: {", ".join(BUILTIN)})')
    text = resources.files("emulator").joinpath(f"data/kernels/{name}.csv").read_text(encoding="utf-8")
    return parse_table(text, f"emulator/data/kernels/{name}.csv")


@lru_cache(maxsize=None)
def reference(name: str) -> KernelTable:
    """A table of emulator/data/kernels/NAME.csv that no GPU takes as its own, read for a ratio between its rows:
    ``dpa_gb200`` and ``dpa_gb300``, cuDNN's attention in BF16, FP8 and MXFP8 (workload/kernel_cost.py)."""
    text = resources.files("emulator").joinpath(f"data/kernels/{name}.csv").read_text(encoding="utf-8")
    return KernelTable(parse_table(text, f"emulator/data/kernels/{name}.csv"))


def gemm_flops(dims: tuple[int, ...]) -> float:
    """2·batch·m·n·k of gemm dims (batch, m, n, k)."""
    b, m, n, k = dims
    return 2.0 * b * m * n * k


@lru_cache(maxsize=64)
def table(builtin_name: str, measured: tuple[tuple[str, str, tuple[int, ...], float], ...]) -> KernelTable | None:
    """A GPU's table: its measured entries (op, dtype, dims, seconds; GEMMs) first, then the built-in one."""
    rows = [(op, dtype, dims, gemm_flops(dims) / seconds, "calibrated (catalog kernels)")
            for op, dtype, dims, seconds in measured]
    if builtin_name and builtin_name != "none":
        rows += builtin(builtin_name)
    return KernelTable(rows) if rows else None


def lookup(gpu: GpuSpec, op: str, dtype: str, dims: tuple[int, ...], prior: Prior | None = None,
           rows: int = 1) -> Hit | None:
    """The measured (or interpolated) rate of a kernel on ``gpu``; None when its table does not cover it."""
    t = table(gpu.kernel_table, gpu.kernels)
    return t.lookup(op, dtype, dims, prior, rows) if t is not None else None

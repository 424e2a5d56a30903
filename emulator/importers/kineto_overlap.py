"""The compute slowdown under communication, measured from one rank's Kineto GPU kernels.

While an NCCL kernel is resident it holds SMs and HBM bandwidth, and a compute kernel that
runs beside it (on another stream of the same GPU) takes longer. The catalog's GPU field
``comm_overlap_slowdown`` is that factor; ``measure_overlap`` measures it from a trace:

- compute kernels (every kernel that is not NCCL's) are grouped by identity: the kernel
  name plus the launch configuration the trace records (grid, block, registers per thread,
  shared memory) and the 'Input Dims' of the aten op that launched it, when recorded;
- an instance is *under comm* when at least ``UNDER`` (90%) of its interval overlaps the
  union of the NCCL kernels resident on other streams of the same device, and *alone*
  when it overlaps none of them (a resident NCCL kernel is its whole interval, including
  the time it waits for its peers: it holds its SMs all along); the rest is not used;
- each group with at least ``MIN_EACH`` instances on both sides, and a median alone of at
  least ``MIN_DUR`` (10 us: Kineto's timestamps may be whole microseconds, and a 2-us
  kernel read as 3 us is not 1.5 times slower), gives the ratio of the median duration
  under comm to the median alone;
- the factor is the duration-weighted median of the group ratios (weight: the group's
  summed duration over the instances used), with the weighted quartiles as its spread.

Pure: the same kernels give the same result, whatever their order in the file.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from emulator.importers.native import TraceError

UNDER = 0.9  # share of a kernel's interval that must overlap NCCL to count as "under comm"
MIN_EACH = 3  # instances needed on each side (under comm, alone) for a group to give a ratio
MIN_GROUPS = 3  # groups needed before the factor is trusted (and written to a catalog)
MIN_DUR = 10e-6  # s, shortest median-alone duration of a group used (10 ticks of a 1-us clock;
# 10 us read from a file as 10 * 1e-6 is 9.999999999999999e-06: compared with a 1e-9 slack)
US = 1e-6  # Kineto timestamps and durations are microseconds


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel of a rank's trace."""

    ts: float  # s
    dur: float  # s
    device: int
    stream: int
    key: str  # identity of a compute kernel (name and shape); NCCL kernels: their name
    nccl: bool
    rank: int = 0  # which trace file (several ranks' kernels may be pooled; each GPU is (rank, device))


@dataclass(frozen=True)
class GroupRatio:
    """One kernel identity seen both under comm and alone."""

    key: str
    under: int  # instances under comm
    alone: int  # instances alone
    ratio: float  # median under comm / median alone
    weight: float  # s, summed duration of the instances used


@dataclass(frozen=True)
class OverlapFit:
    """The measured slowdown and what it rests on."""

    factor: float | None  # None: no group had enough instances on both sides
    q1: float | None  # duration-weighted quartiles of the group ratios
    q3: float | None
    groups: tuple[GroupRatio, ...]  # sorted by key
    kernels: int  # instances (under comm + alone) in the groups used
    compute: int  # compute kernels in the trace
    under: int  # of which under comm
    alone: int  # of which alone

    @property
    def enough(self) -> bool:
        return self.factor is not None and len(self.groups) >= MIN_GROUPS

    def why_not(self) -> str:
        """Why the factor is not trusted, in words ("" when it is)."""
        if self.enough:
            return ""
        return (f"{len(self.groups)} kernel groups (median alone >= {MIN_DUR * 1e6:.0f} us) ran at least "
                f"{MIN_EACH} times both under a resident NCCL kernel (>= {UNDER:.0%} overlap) and alone, "
                f"{MIN_GROUPS} needed (of {self.compute} compute kernels, {self.under} under comm, "
                f"{self.alone} alone)")


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """The smallest value whose cumulative weight (values sorted ascending) reaches q of the total."""
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= q * total * (1 - 1e-12):
            return v
    return pairs[-1][0]


Gpu = tuple[int, int]  # (rank, device)


def _comm_intervals(kernels: list[Kernel]) -> dict[tuple[Gpu, int], list[tuple[float, float]]]:
    """((rank, device), stream) → that stream's NCCL intervals, sorted and merged."""
    out: dict[tuple[Gpu, int], list[tuple[float, float]]] = {}
    for k in kernels:
        if k.nccl:
            out.setdefault(((k.rank, k.device), k.stream), []).append((k.ts, k.ts + k.dur))
    return {s: _merge(ivs) for s, ivs in out.items()}


def _merge(ivs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(ivs):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _covered(k: Kernel, comm: dict[tuple[Gpu, int], list[tuple[float, float]]]) -> float:
    """Seconds of k's interval during which an NCCL kernel is resident on another stream of its GPU."""
    ivs = _merge([iv for (gpu, stream), lst in comm.items() if gpu == (k.rank, k.device) and stream != k.stream
                  for iv in lst])
    end = k.ts + k.dur
    return sum(max(0.0, min(b, end) - max(a, k.ts)) for a, b in ivs)


def _order(k: Kernel) -> tuple:
    return (k.rank, k.device, k.ts, k.stream, k.dur, k.key, k.nccl)


def classify(kernels: list[Kernel]) -> dict[str, tuple[list[float], list[float]]]:
    """key → (durations under comm, durations alone) of the compute kernels."""
    comm = _comm_intervals(kernels)
    out: dict[str, tuple[list[float], list[float]]] = {}
    for k in sorted(kernels, key=_order):  # a fixed order: sums come out the same for any file order
        if k.nccl or k.dur <= 0:
            continue
        under, alone = out.setdefault(k.key, ([], []))
        c = _covered(k, comm)
        if c >= UNDER * k.dur:
            under.append(k.dur)
        elif c <= 0:
            alone.append(k.dur)
    return out


def measure_overlap(kernels: list[Kernel]) -> OverlapFit:
    """The slowdown of compute kernels under resident NCCL kernels (module docstring)."""
    split = classify(kernels)
    groups = []
    for key in sorted(split):
        under, alone = split[key]
        if len(under) >= MIN_EACH and len(alone) >= MIN_EACH and statistics.median(alone) >= MIN_DUR * (1 - 1e-9):
            groups.append(GroupRatio(key, len(under), len(alone),
                                     statistics.median(under) / statistics.median(alone),
                                     sum(under) + sum(alone)))
    n_under = sum(len(u) for u, _ in split.values())
    n_alone = sum(len(a) for _, a in split.values())
    n_compute = sum(1 for k in kernels if not k.nccl and k.dur > 0)
    used = sum(g.under + g.alone for g in groups)
    if not groups:
        return OverlapFit(None, None, None, (), 0, n_compute, n_under, n_alone)
    ratios, weights = [g.ratio for g in groups], [g.weight for g in groups]
    return OverlapFit(weighted_quantile(ratios, weights, 0.5), weighted_quantile(ratios, weights, 0.25),
                      weighted_quantile(ratios, weights, 0.75), tuple(groups), used, n_compute, n_under,
                      n_alone)


# ---------------------------------------------------------------------------- from a trace


_SHAPE_ARGS = ("grid", "block", "registers per thread", "shared memory")


def _int_arg(args: dict, key: str, name: str, where: str) -> int:
    v = args.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{where}: kernel {name[:60]!r}: '{key}' is {v!r}, expected an integer")
    return v


def kernels_of(data: dict, rank: int = 0, where: str = "trace") -> list[Kernel]:
    """Every GPU kernel of a parsed Kineto trace (all its steps), with its identity key
    (``where``: the file, for errors)."""
    events = [e for e in data.get("traceEvents", []) if isinstance(e, dict)]
    dims = {}
    for e in events:  # the aten op that launched a kernel shares its 'External id'
        args = e.get("args")
        if e.get("cat") == "cpu_op" and isinstance(args, dict) and args.get("Input Dims") is not None:
            dims[args.get("External id")] = f"{e.get('name')} {args.get('Input Dims')}"
    out = []
    for e in events:
        args = e.get("args")
        if e.get("cat") != "kernel" or e.get("ph") != "X" or not isinstance(args, dict):
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or isinstance(dur, bool):
            continue
        name = str(e.get("name", ""))
        nccl = "nccl" in name.lower()
        shape = " ".join(f"{a}={args[a]}" for a in _SHAPE_ARGS if a in args)
        key = name if nccl else " | ".join(p for p in (name, shape, dims.get(args.get("External id"), "")) if p)
        out.append(Kernel(float(ts) * US, float(dur) * US, _int_arg(args, "device", name, where),
                          _int_arg(args, "stream", name, where), key, nccl, rank))
    return out


def measure_files(paths: list[str]) -> OverlapFit:
    """The slowdown measured over one or several ranks' trace files, their kernels pooled
    (each file's compute kernels are classed against that file's own NCCL kernels)."""
    from emulator.importers.kineto_reader import read_json

    kernels: list[Kernel] = []
    for i, p in enumerate(paths):
        kernels += kernels_of(read_json(p), i, p)
    return measure_overlap(kernels)

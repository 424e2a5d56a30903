"""Calibration: ``emulator calibrate`` fits catalog figures to a user's own measurements.

Inputs
- ``--nccl-log FILE`` (repeatable): the text table that nccl-tests prints
  (``all_reduce_perf`` etc.). The out-of-place columns size, count, type, time
  (us), algbw and busbw (GB/s) are read; the GPU count from the ``Rank N ...
  on HOST device D`` lines (or ``nGpus``), the operation from ``Collective test
  starting: X_perf`` or the file name. Logs from one host calibrate the node's
  interior (NVLink), logs across hosts its NICs.
  * efficiency = busbw at large sizes (the best busbw over sizes >= 64 MiB, else
    over all sizes) / line rate (``intra_bandwidth``, or the NICs per GPU);
  * small-message latency t = launch + steps * per_step, steps = 2(n-1) for
    all_reduce and n-1 for the others, fitted by least squares over the logs'
    small-message times (median over sizes <= 1 KiB). With one GPU count only,
    the base node's ``collective_launch`` is kept and per_step = (t - launch)/steps.
    The catalog splits a step into its links' latencies and a software part, so
    step_latency_intra = per_step - 2 * intra_latency (GPU->switch->GPU) and
    step_latency_inter = per_step - 2 * nic_latency.
- ``--kineto FILE``: a profile of a few steps on one GPU. GEMM efficiency =
  2*M*N*K / (kernel time) / peak_flops for the kernels of each aten::mm, addmm,
  bmm, baddbmm or linear whose 'Input Dims' are recorded (FLOP-weighted overall,
  and per shape); memory-bound efficiency = bytes / time / hbm_bandwidth for
  elementwise ops moving >= 1 MiB (inputs + one output of the largest input's size).
  Per shape, the median time of each GEMM (batch, m, n, k and dtype) is kept too: with
  ``--out`` they become the calibrated GPU's ``kernels`` entries, which the workload
  builder looks up before the roofline (devices/kernels.py: that exact shape, or
  interpolated inside a grid of them); other shapes use the fitted efficiencies.
- ``--kineto FILE`` also measures ``comm_overlap_slowdown``: how many times longer compute
  kernels run while an NCCL kernel is resident on another stream of the same GPU, over
  all the trace's steps (importers/kineto_overlap.py). It is written into the GPU entry
  only when enough kernel groups ran both under comm and alone; otherwise the report
  says why it was left out. A trace with such evidence but no shapes gives the factor alone.
- ``--kineto FILE`` also measures ``host_launch``: the host's issuing of the chosen step (the gaps between
  its launches, less its syncs and the profiler's own cost of the ops it recorded: importers/profile.py
  ``launch_gaps``) over its launches. It is written into the node entry (workload/host.py).
- ``--base NODE``, ``--name NEW``, ``--out FILE.yaml``: the result is written as a
  catalog file (units as strings) with a node NEW copied from NODE and the fitted
  fields replaced.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
from dataclasses import dataclass, replace

from emulator.errors import EmulatorError
from emulator.importers.kineto_overlap import OverlapFit, measure_files
from emulator.outputs.atomic import write_text
from emulator.scenario.spec import GpuSpec, NodeSpec

LARGE = 64 * 2**20  # B: sizes at which busbw has plateaued
SMALL = 1024  # B: sizes at which time is latency only
_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "all_to_all", "broadcast", "reduce",
        "sendrecv")


class CalibrationError(EmulatorError):
    """A calibration input is unreadable or cannot support a fit."""


class NothingToFit(CalibrationError):
    """A readable Kineto trace whose ops give no compute efficiency."""


# ---------------------------------------------------------------------------- nccl-tests logs


@dataclass(frozen=True)
class NcclRow:
    size: float  # B
    count: int
    dtype: str
    time_s: float
    algbw: float  # B/s
    busbw: float  # B/s


@dataclass(frozen=True)
class NcclLog:
    path: str
    op: str
    gpus: int
    hosts: int
    rows: tuple[NcclRow, ...]

    @property
    def steps(self) -> int:
        """Latency steps of a ring: 2(n-1) for all-reduce, n-1 for the others."""
        return 2 * (self.gpus - 1) if self.op == "all_reduce" else self.gpus - 1

    def large_busbw(self) -> float:
        large = [r.busbw for r in self.rows if r.size >= LARGE] or [r.busbw for r in self.rows]
        return max(large)

    def small_time(self) -> float:
        small = [r.time_s for r in self.rows if r.size <= SMALL] or [min(self.rows, key=lambda r: r.size).time_s]
        return statistics.median(small)


def _op_of(text: str, path: str) -> str:
    m = re.search(r"Collective test starting:\s*(\w+?)_perf", text)
    name = m.group(1) if m else next((op for op in _OPS if op in os.path.basename(path).lower()), None)
    if name is None:
        raise CalibrationError(f"{path}: cannot tell the operation: no 'Collective test starting: X_perf' line "
                               "and no operation (all_reduce, all_gather, ...) in the file name")
    return {"alltoall": "all_to_all"}.get(name, name)


def parse_nccl_log(path: str) -> NcclLog:
    """Read the out-of-place half of an nccl-tests table."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise CalibrationError(f"{path}: cannot read: {e.strerror}") from None
    header: list[str] | None = None
    rows: list[NcclRow] = []
    devices, hosts = 0, set()
    ngpus = None
    for line in text.splitlines():
        s = line.strip()
        if m := re.match(r"#\s*Rank\s+\d+.*?\son\s+(\S+)\s+device", s):
            devices += 1
            hosts.add(m.group(1))
        elif m := re.search(r"nGpus\s+(\d+)", s):
            ngpus = int(m.group(1))
        toks = s.lstrip("#").split()
        if s.startswith("#") and {"size", "count", "type", "time", "algbw", "busbw"} <= set(toks):
            header = toks
        elif header and s and not s.startswith("#"):
            rows.append(_row(header, s.split(), path))
    if header is None or not rows:
        raise CalibrationError(f"{path}: no nccl-tests table (a '# size count type ... time algbw busbw' header "
                               "followed by rows)")
    gpus = devices or ngpus or 0
    if gpus < 2:
        raise CalibrationError(f"{path}: cannot tell how many GPUs ran (no 'Rank N ... device' lines, no nGpus)")
    return NcclLog(path, _op_of(text, path), gpus, max(1, len(hosts)), tuple(rows))


def _row(header: list[str], toks: list[str], path: str) -> NcclRow:
    if len(toks) != len(header):
        raise CalibrationError(f"{path}: row {' '.join(toks)!r} has {len(toks)} columns, the header {len(header)}")
    col = {name: header.index(name) for name in ("size", "count", "type", "time", "algbw", "busbw")}
    try:
        return NcclRow(float(toks[col["size"]]), int(toks[col["count"]]), toks[col["type"]],
                       float(toks[col["time"]]) * 1e-6, float(toks[col["algbw"]]) * 1e9,
                       float(toks[col["busbw"]]) * 1e9)
    except ValueError:
        raise CalibrationError(f"{path}: row {' '.join(toks)!r}: expected numbers in size, count, time, "
                               "algbw and busbw") from None


def fit_latency(points: list[tuple[int, float]], launch_default: float) -> tuple[float, float]:
    """Least-squares fit of t = launch + steps * per_step over (steps, t) points.

    With a single distinct step count, launch = ``launch_default`` and
    per_step = (mean t - launch) / steps.
    """
    xs = [float(s) for s, _ in points]
    ys = [t for _, t in points]
    if len(set(xs)) < 2:
        per = (statistics.fmean(ys) - launch_default) / xs[0]
        return launch_default, per
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    per = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - per * mx, per


@dataclass(frozen=True)
class LinkFit:
    efficiency: float
    busbw: float  # B/s
    line_rate: float  # B/s per GPU
    launch: float  # s
    per_step: float  # s


def fit_links(logs: list[NcclLog], node: NodeSpec, inter: bool) -> LinkFit:
    """Efficiency and per-step latency for one link class (inter: logs across hosts)."""
    line = node.nics * node.nic_bandwidth / node.gpus_per_node if inter else node.intra_bandwidth
    busbw = max(log.large_busbw() for log in logs)
    launch, per = fit_latency([(log.steps, log.small_time()) for log in logs], node.collective_launch)
    return LinkFit(busbw / line, busbw, line, launch, per)


# ---------------------------------------------------------------------------- Kineto compute


def _gemm_flops(name: str, dims: list) -> float | None:
    try:
        if name == "aten::mm":
            (m, k), (_, n) = dims[0], dims[1]
            return 2.0 * m * n * k
        if name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            return 2.0 * m * n * k
        if name == "aten::bmm":
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return 2.0 * b * m * n * k
        if name == "aten::baddbmm":
            (b, m, k), (_, _, n) = dims[1], dims[2]
            return 2.0 * b * m * n * k
        if name == "aten::linear":
            x, w = dims[0], dims[1]
            rows = 1
            for d in x[:-1]:
                rows *= d
            return 2.0 * rows * x[-1] * w[0]
    except (TypeError, ValueError, IndexError):
        return None
    return None


def _gemm_dims(name: str, dims: list) -> tuple[int, int, int, int] | None:
    """(batch, m, n, k) of an aten GEMM from its 'Input Dims' (linear: x [..., k], weight [n, k])."""
    try:
        if name in ("aten::mm", "aten::addmm"):
            (m, k), (_, n) = dims[0 if name == "aten::mm" else 1], dims[1 if name == "aten::mm" else 2]
            return 1, int(m), int(n), int(k)
        if name in ("aten::bmm", "aten::baddbmm"):
            (b, m, k), (_, _, n) = dims[0 if name == "aten::bmm" else 1], dims[1 if name == "aten::bmm" else 2]
            return int(b), int(m), int(n), int(k)
        if name == "aten::linear":
            x, w = dims[0], dims[1]
            return 1, _numel(x[:-1]), int(w[0]), int(x[-1])
    except (TypeError, ValueError, IndexError):
        return None
    return None


_DTYPES = {"c10::bfloat16": "bf16", "bfloat16": "bf16", "c10::half": "fp16", "half": "fp16", "float16": "fp16",
           "float": "fp32", "float32": "fp32", "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8"}


def _gemm_dtype(name: str, types: list) -> str:
    """The precision of a GEMM's first matrix operand ('Input type'), as the scenario names it."""
    i = 1 if name in ("aten::addmm", "aten::baddbmm") else 0
    return _DTYPES.get(str(types[i]).lower(), "") if len(types) > i else ""


_ELEMENTWISE = re.compile(r"^aten::(add|mul|sub|div|relu|gelu|sigmoid|tanh|threshold_backward|copy_|fill_|"
                          r"zero_|clamp|softmax|_softmax|layer_norm|native_layer_norm|dropout|addcmul|addcdiv|"
                          r"sqrt|exp|where|masked_fill)")


@dataclass(frozen=True)
class ComputeFit:
    gemm_efficiency: float | None
    gemm_by_shape: dict[str, float]
    memory_efficiency: float | None
    kernels: int
    # per-shape GEMM times: ((batch, m, n, k), dtype, median seconds of the op's kernels), sorted
    gemm_times: tuple[tuple[tuple[int, int, int, int], str, float], ...] = ()
    measured_on: str = ""  # the catalog GPU the trace ran on, when another part of the base GPU's chip


def fit_compute(path: str, gpu: GpuSpec, base: str = "") -> ComputeFit:
    """GEMM and memory-bound efficiencies of a one-GPU Kineto profile against ``gpu`` (the GPU of
    node ``base``): refused when the trace names another catalog GPU (:func:`check_device`), or
    when an efficiency comes out above 1 of ``gpu``'s peak."""
    from emulator.importers.kineto_reader import DTYPE_BYTES, read_rank

    try:
        rt = read_rank(path)
    except EmulatorError as e:
        raise CalibrationError(str(e)) from None
    ran_on = check_device(path, rt.device, gpu, base)
    base_gpu, gpu = gpu, ran_on or gpu  # efficiencies are fractions of the peak and bandwidth it ran at
    # Kernels are grouped by their innermost aten op: under autocast an outer aten::addmm holds the
    # casts of its operands (fp32 -> bf16 copies) beside the GEMM, and only the inner op (the bf16
    # aten::addmm, an aten::copy_) says what each kernel computed and in which dtype.
    groups: dict[int, list] = {}
    for g in rt.gpu_ops:
        if g.cpu_inner is not None and g.cat == "kernel" and not g.is_nccl:
            groups.setdefault(id(g.cpu_inner), []).append(g)
    gemm_flops = gemm_time = mem_bytes = mem_time = 0.0
    shapes: dict[str, list[float]] = {}
    times: dict[tuple[tuple[int, int, int, int], str], list[float]] = {}
    for kernels in groups.values():
        cpu = kernels[0].cpu_inner
        assert cpu is not None  # grouped above
        name, args = str(cpu.get("name")), cpu.get("args", {})
        dims, types = args.get("Input Dims"), args.get("Input type", [])
        t = sum(k.dur for k in kernels)
        if not dims or t <= 0:
            continue
        flops = _gemm_flops(name, dims)
        if flops:
            gemm_flops += flops
            gemm_time += t
            shapes.setdefault(f"{name} {dims}", []).append(flops / t / gpu.peak_flops)
            gdims, gtype = _gemm_dims(name, dims), _gemm_dtype(name, types)
            if gdims is not None and gtype:
                times.setdefault((gdims, gtype), []).append(t)
        elif _ELEMENTWISE.match(name):
            sizes = [_numel(d) * DTYPE_BYTES.get(str(ty).lower(), 4) for d, ty in zip(dims, types)
                     if isinstance(d, list) and d]
            if sizes and sum(sizes) + max(sizes) >= 2**20:
                mem_bytes += sum(sizes) + max(sizes)
                mem_time += t
    if not groups:
        raise NothingToFit(f"{path}: no kernel is launched under an aten op with shapes "
                           "(profile with record_shapes=True)")
    if not gemm_time and not mem_time:
        raise NothingToFit(_nothing_fitted(path, groups))
    fit = ComputeFit(gemm_flops / gemm_time / gpu.peak_flops if gemm_time else None,
                     {k: statistics.median(v) for k, v in shapes.items()},
                     mem_bytes / mem_time / gpu.hbm_bandwidth if mem_time else None, len(rt.gpu_ops),
                     tuple((d, ty, statistics.median(v)) for (d, ty), v in sorted(times.items())),
                     measured_on=gpu.name if gpu is not base_gpu else "")
    _check_below_peak(path, fit, gpu)
    return fit


def check_device(path: str, device: str, gpu: GpuSpec, base: str = "") -> GpuSpec | None:
    """The catalog GPU a trace ran on when it is another part of ``gpu``'s chip (the A100 40 GB for an
    A100 80 GB base: the same peaks, SMs and matmul fraction, other HBM), whose peak and bandwidth its
    efficiencies are fractions of; None when it is ``gpu`` or one the catalog does not know (the user's to
    pair with a base). A trace from another chip is refused, naming both: its kernel times are another
    GPU's, and as efficiencies of ``gpu``'s peak they mean nothing (an H200 trace against an A100's
    peak reads 1.86)."""
    from emulator.devices.translation import catalog_name, same_chip
    from emulator.scenario import catalog

    name = catalog_name(device) if device else None
    if name is None or name == gpu.name:
        return None
    ran_on = catalog.gpu(name)
    if same_chip(ran_on, gpu):
        return ran_on
    nodes = [n for n in catalog.node_names() if catalog.node(n).gpu.name == name]
    hint = f" (--base {nodes[0]})" if nodes else ""
    of = f"--base {base}'s GPU" if base else "the base GPU"
    raise CalibrationError(f"{path}: the trace ran on {device} (catalog GPU {name}), but {of} is {gpu.name}, another "
                           f"chip; expected a trace from the base's own GPU: calibrate on a node with {name}{hint}")


def _check_below_peak(path: str, fit: ComputeFit, gpu: GpuSpec) -> None:
    """No fitted efficiency above 1: a kernel cannot outrun the GPU's peak or its HBM bandwidth."""
    for what, value, of in (("GEMM", fit.gemm_efficiency, f"peak ({gpu.peak_flops / 1e12:,.1f} TFLOP/s)"),
                            ("memory-bound", fit.memory_efficiency,
                             f"HBM bandwidth ({gpu.hbm_bandwidth / 1e9:,.0f} GB/s)")):
        if value is not None and value > 1:
            raise CalibrationError(f"{path}: its {what} kernels ran at {value:.2f} of GPU {gpu.name}'s {of}, above "
                                   "1: the trace ran on a faster GPU than the base's, or its shapes are not what "
                                   "the kernels computed; calibrate on a node with the GPU the trace ran on")


def _nothing_fitted(path: str, groups: dict[int, list]) -> str:
    """Why a Kineto profile gave no efficiency at all, in words."""
    ops = [kernels[0].cpu_op for kernels in groups.values()]
    shaped = [op for op in ops if op.get("args", {}).get("Input Dims")]
    if not shaped:
        return (f"{path}: the trace was recorded without shapes: none of its {len(ops)} aten ops that launch "
                "kernels has 'Input Dims', so nothing can be fitted; profile with record_shapes=True")
    return (f"{path}: nothing to fit: none of the {len(shaped)} aten ops with shapes is a GEMM (aten::mm, addmm, "
            "bmm, baddbmm, linear) or an elementwise op moving at least 1 MiB")


def _numel(dims: list) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def fit_overlap(path: str) -> OverlapFit:
    """The compute slowdown under resident NCCL kernels, over every step of a Kineto trace."""
    try:
        return measure_files([path])
    except EmulatorError as e:
        raise CalibrationError(str(e)) from None


@dataclass(frozen=True)
class HostFit:
    """The host's issuing of one profiled step: its launches and their seconds; host_launch their mean."""

    launches: int
    seconds: float

    @property
    def host_launch(self) -> float:
        return self.seconds / self.launches


def fit_host(path: str) -> HostFit | None:
    """The chosen step's launch gaps (importers/profile.py ``launch_gaps``: syncs and the profiler's cost
    of the ops it recorded taken out), summed over its launches; None for a step that launches nothing."""
    from emulator.importers.kineto_reader import read_rank
    from emulator.importers.profile import launch_gaps

    try:
        rt = read_rank(path)
    except EmulatorError as e:
        raise CalibrationError(str(e)) from None
    gaps = launch_gaps(rt)
    return HostFit(len(gaps), sum(gaps)) if gaps else None


def written_slowdown(overlap: OverlapFit | None, gpu: GpuSpec) -> float:
    """The comm_overlap_slowdown a calibrated GPU entry carries: the measured factor when the
    trace held enough evidence (at least 1: the catalog's range, 1 = none), else the base GPU's."""
    if overlap is not None and overlap.enough and overlap.factor is not None:
        return max(1.0, overlap.factor)
    return gpu.comm_overlap_slowdown


# ---------------------------------------------------------------------------- the catalog entry


def calibrated_node(base: NodeSpec, name: str, intra: LinkFit | None, inter: LinkFit | None) -> NodeSpec:
    node = replace(base, name=name)
    if intra:
        node = replace(node, intra_efficiency=intra.efficiency, collective_launch=intra.launch,
                       step_latency_intra=max(0.0, intra.per_step - 2 * base.intra_latency))
    if inter:
        node = replace(node, nic_efficiency=inter.efficiency,
                       step_latency_inter=max(0.0, inter.per_step - 2 * base.nic_latency))
        if not intra:
            node = replace(node, collective_launch=inter.launch)
    return node


def _q(v: float, unit: str, scale: float) -> str:
    return f"{v / scale:.6g} {unit}"


def catalog_yaml(node: NodeSpec, source: str, compute: ComputeFit | None,
                 overlap: OverlapFit | None = None) -> str:
    """A catalog file (same shape as emulator/data/catalog.yaml) holding ``node`` and, when
    the Kineto fit measured efficiencies or the overlap slowdown, a GPU entry of its own that
    carries them."""
    g = node.gpu
    lines = [f"# Written by `emulator calibrate`: {source}"]
    gpu_name = g.name
    measured = compute is not None and (compute.gemm_efficiency is not None or compute.memory_efficiency is not None
                                        or bool(compute.gemm_times))
    if measured or (overlap is not None and overlap.enough):
        gpu_name = f"{node.name}-gpu"
        lines += ["gpus:", f"  {gpu_name}:",
                  f"    peak_flops: {_q(g.peak_flops, 'TFLOP/s', 1e12)}",
                  f"    hbm_bandwidth: {_q(g.hbm_bandwidth, 'GB/s', 1e9)}",
                  f"    memory: {_q(g.memory_bytes, 'GiB', 2**30)}",
                  f"    launch_overhead: {_q(g.launch_overhead, 'us', 1e-6)}"]
        # the base GPU's hardware facts (its catalog fields) carry over to the calibrated entry
        lines += [f"    sm_count: {g.sm_count}"] if g.sm_count else []
        lines += [f"    matmul_fraction: {g.matmul_fraction:.6g}"] if g.matmul_fraction else []
        lines += [f"    {f}: {_q(getattr(g, f), 'TFLOP/s', 1e12)}"
                  for f in ("peak_flops_fp32", "peak_flops_tf32", "peak_flops_fp8") if getattr(g, f)]
        if compute is not None and compute.gemm_efficiency is not None:
            lines.append(f"    gemm_efficiency: {compute.gemm_efficiency:.6g}")
        if compute is not None and compute.memory_efficiency is not None:
            lines.append(f"    memory_efficiency: {compute.memory_efficiency:.6g}")
        slowdown = written_slowdown(overlap, g)
        if slowdown != 1.0:
            lines.append(f"    comm_overlap_slowdown: {slowdown:.6g}")
        lines += _kernel_lines(g, compute)
        lines.append(f"    source: \"{source}; base GPU {g.name}\"")
    lines += ["nodes:", f"  {node.name}:",
              f"    gpu: {gpu_name}",
              f"    gpus_per_node: {node.gpus_per_node}",
              f"    intra: {node.intra}",
              f"    intra_bandwidth: {_q(node.intra_bandwidth, 'GB/s', 1e9)}",
              f"    intra_efficiency: {node.intra_efficiency:.6g}",
              f"    intra_latency: {_q(node.intra_latency, 'us', 1e-6)}",
              f"    step_latency_intra: {_q(node.step_latency_intra, 'us', 1e-6)}",
              f"    collective_launch: {_q(node.collective_launch, 'us', 1e-6)}",
              f"    step_latency_inter: {_q(node.step_latency_inter, 'us', 1e-6)}",
              f"    nics: {node.nics}",
              f"    nic_bandwidth: {_q(node.nic_bandwidth * 8, 'Gb/s', 1e9)}",
              f"    nic_efficiency: {node.nic_efficiency:.6g}",
              f"    nic_latency: {_q(node.nic_latency, 'us', 1e-6)}",
              *([f"    nvls_busbw: {_q(node.nvls_busbw, 'GB/s', 1e9)}"] if node.nvls_busbw else []),
              *([f"    nvlink_domain: {node.nvlink_domain}"] if node.nvlink_domain else []),
              *([f"    host_bandwidth: {_q(node.host_bandwidth, 'GB/s', 1e9)}"] if node.host_bandwidth else []),
              *([f"    host_launch: {_q(node.host_launch, 'us', 1e-6)}"] if node.host_launch else []),
              f"    source: \"{source}\""]
    return "\n".join(lines) + "\n"


def _kernel_lines(g: GpuSpec, compute: ComputeFit | None) -> list[str]:
    """The GPU entry's measured kernels: every profiled GEMM shape with its median kernel time
    (devices/kernels.py looks them up before the built-in table and the roofline)."""
    lines = [f"    kernel_table: {g.kernel_table or 'none'}"]
    measured = compute.gemm_times if compute is not None else ()
    entries: list[tuple[tuple[int, ...], str, float]] = [(d, ty, s) for d, ty, s in measured]
    entries += [(d, ty, s) for _, ty, d, s in g.kernels if (d, ty) not in {(e[0], e[1]) for e in entries}]
    if entries:
        lines.append("    kernels:  # op dtype batch x m x n x k, median kernel time (emulator calibrate --kineto)")
        lines += [f'      - "gemm {ty} {"x".join(map(str, d))} {s * 1e6:.6g} us"' for d, ty, s in entries]
    return lines


# ---------------------------------------------------------------------------- the subcommand


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nccl-log", action="append", default=[], metavar="FILE",
                        help="nccl-tests output (all_reduce_perf, ...); repeat for several GPU counts")
    parser.add_argument("--kineto", metavar="FILE", help="a one-GPU PyTorch profiler trace with record_shapes")
    parser.add_argument("--base", default="dgx-a100", metavar="NODE", help="catalog node to start from")
    parser.add_argument("--name", default=None, metavar="NEW",
                        help="name of the calibrated node (default BASE-calibrated)")
    parser.add_argument("--out", default=None, metavar="FILE.yaml", help="write the catalog entry here")


def calibrate_command(args: argparse.Namespace) -> str:
    """Run the fits; write ``--out`` if given; return the report text."""
    from emulator.scenario import catalog

    if not args.nccl_log and not args.kineto:
        raise CalibrationError("calibrate: give at least one --nccl-log FILE or --kineto FILE")
    base = catalog.node(args.base)
    name = args.name or f"{args.base}-calibrated"
    logs = [parse_nccl_log(p) for p in args.nccl_log]
    intra_logs = [log for log in logs if log.hosts == 1]
    inter_logs = [log for log in logs if log.hosts > 1]
    intra = fit_links(intra_logs, base, inter=False) if intra_logs else None
    inter = fit_links(inter_logs, base, inter=True) if inter_logs else None
    overlap = fit_overlap(args.kineto) if args.kineto else None
    compute, no_compute = _compute_or_why(args.kineto, base.gpu, overlap, args.base)
    host = fit_host(args.kineto) if args.kineto else None
    node = calibrated_node(base, name, intra, inter)
    if host is not None:
        node = replace(node, host_launch=host.host_launch)
    report = _report(node, logs, intra, inter, compute) + no_compute + _overlap_report(overlap) + _host_report(host)
    if args.out:
        sources = [os.path.basename(p) for p in args.nccl_log]
        sources += [os.path.basename(args.kineto)] if args.kineto else []
        text = catalog_yaml(node, f"calibrated from {', '.join(sources)} on base {args.base}", compute, overlap)
        write_text(args.out, text)  # atomic: a temporary file renamed over it
        report += f"wrote node {name!r} to {args.out}\n"
    return report


def _compute_or_why(path: str | None, gpu: GpuSpec, overlap: OverlapFit | None,
                    base: str = "") -> tuple[ComputeFit | None, str]:
    """The compute fit; a trace that fits no efficiency is an error unless it measured the
    overlap slowdown (then the reason is a line of the report)."""
    if not path:
        return None, ""
    try:
        return fit_compute(path, gpu, base), ""
    except NothingToFit as e:
        if overlap is None or not overlap.enough:
            raise
        return None, f"no compute efficiency: {e}\n"


def _host_report(host: HostFit | None) -> str:
    if host is None:
        return ""
    return (f"host_launch {host.host_launch * 1e6:.3g} us: the host issued the step's {host.launches} launches in "
            f"{host.seconds * 1e3:.4g} ms (gaps between launches, less syncs and the profiler's cost of the ops it "
            "recorded)\n")


def _overlap_report(overlap: OverlapFit | None) -> str:
    if overlap is None:
        return ""
    if not overlap.enough:
        return f"comm_overlap_slowdown left out: {overlap.why_not()}\n"
    assert overlap.factor is not None and overlap.q1 is not None and overlap.q3 is not None
    below = " (below 1: written as 1, no slowdown)" if overlap.factor < 1 else ""
    return (f"comm_overlap_slowdown {overlap.factor:.4f}{below}: duration-weighted median of "
            f"{len(overlap.groups)} kernel groups' ratios (IQR {overlap.q1:.4f}-{overlap.q3:.4f}), "
            f"{overlap.kernels} kernels under a resident NCCL kernel or alone\n")


def _report(node: NodeSpec, logs: list[NcclLog], intra: LinkFit | None, inter: LinkFit | None,
            compute: ComputeFit | None) -> str:
    out = []
    for log in logs:
        out.append(f"{os.path.basename(log.path)}: {log.op} on {log.gpus} GPUs ({log.hosts} host(s)): "
                   f"busbw {log.large_busbw() / 1e9:.1f} GB/s, small-message time {log.small_time() * 1e6:.2f} us")
    for label, fit in (("intra-node", intra), ("inter-node", inter)):
        if fit:
            rates = f"{fit.busbw / 1e9:.1f} / {fit.line_rate / 1e9:.1f} GB/s"
            out.append(f"{label}: efficiency {fit.efficiency:.4f} ({rates}), "
                       f"launch {fit.launch * 1e6:.3f} us, per step {fit.per_step * 1e6:.3f} us")
    if compute:
        if compute.measured_on:
            out.append(f"the trace ran on {compute.measured_on}, the base GPU's chip with its own memory: its "
                       f"efficiencies are fractions of {compute.measured_on}'s peak and HBM bandwidth, carried to "
                       f"{node.gpu.name} as they are")
        if compute.gemm_efficiency is not None:
            shapes = len(compute.gemm_by_shape)
            out.append(f"GEMM efficiency {compute.gemm_efficiency:.4f} of peak over {shapes} shapes")
        if compute.gemm_times:
            out.append(f"per-shape kernels: {len(compute.gemm_times)} GEMM shapes measured "
                       "(written to the GPU's kernels with --out)")
        if compute.memory_efficiency is not None:
            out.append(f"memory-bound efficiency {compute.memory_efficiency:.4f} of HBM bandwidth")
    out.append(f"node {node.name}: intra_efficiency {node.intra_efficiency:.4f}, "
               f"step_latency_intra {node.step_latency_intra * 1e6:.3f} us, "
               f"collective_launch {node.collective_launch * 1e6:.3f} us")
    return "\n".join(out) + "\n"

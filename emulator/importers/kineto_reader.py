"""Reading Kineto (PyTorch profiler) traces: one rank's events of one profiler step
into records (GPU ops, host calls, their CPU context, NCCL metadata).

Pure parsing: no Program is built here (``emulator.importers.kineto`` does that).
Malformed input raises TraceError naming the file.
"""
from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass, field

from emulator.importers.native import TraceError  # the project's one trace error (an EmulatorError)
from emulator.scenario import paths

US = 1e-6  # Kineto timestamps are microseconds
TOL_S = 2e-6  # s, slack allowed when testing a dependency against measured times
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_HOST_CATS = ("cpu_op", "user_annotation", "python_function")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")

DTYPE_BYTES = {
    "float": 4, "float32": 4, "fp32": 4, "double": 8, "float64": 8, "half": 2, "c10::half": 2,
    "float16": 2, "fp16": 2, "bfloat16": 2, "c10::bfloat16": 2, "bf16": 2, "long int": 8,
    "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2, "signed char": 1,
    "char": 1, "int8": 1, "unsigned char": 1, "byte": 1, "uint8": 1, "bool": 1,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "float8": 1,
}

_COLL_NAMES = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "barrier": "all_reduce",
    "reduce": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "gather": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "scatter": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all", "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "send": "send", "recv": "recv",
}
_KERNEL_COLL = (("AllReduce", "all_reduce"), ("AllGather", "all_gather"),
                ("ReduceScatter", "reduce_scatter"), ("Broadcast", "broadcast"),
                ("Reduce", "all_reduce"), ("SendRecv", "all_to_all"), ("Send", "send"),
                ("Recv", "recv"))


# ---------------------------------------------------------------------------- records


@dataclass
class CommInfo:
    """What one NCCL kernel communicates (before mirroring)."""

    op: str  # one of COLLECTIVE_OPS, or "send" / "recv"
    bytes: float
    group: tuple[int, ...] | None  # None: the whole world
    peer: int = -1
    source: str = ""  # "kernel args" | "annotation" | "kernel name"


@dataclass
class GpuOp:
    """One GPU activity of the chosen step, with its launch and CPU context."""

    ts: float  # s, shared clock
    dur: float  # s
    stream: int
    name: str
    cat: str
    args: dict
    launch_ts: float  # s, the host-side launch (every GPU op of a step is matched to its launch)
    launch_tid: object = None
    category: str = "fwd"
    cpu_op: dict | None = None  # innermost enclosing aten op (with 'Input Dims' when recorded)
    cpu_instance: int = -1  # identity of that cpu op instance (to group its kernels)
    cpu_inner: dict | None = None  # innermost enclosing aten op: the tensors this kernel itself touches
    node: str = ""  # innermost enclosing non-aten annotation (an autograd node such as "AddmmBackward0")
    node_instance: int = -1  # identity of that annotation instance
    comm: CommInfo | None = None
    compiled: dict | None = None  # the Inductor record around a compiled (Triton) kernel's launch: its args

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def is_nccl(self) -> bool:
        return self.cat == "kernel" and "nccl" in self.name.lower()


@dataclass
class HostCall:
    """A runtime call that orders GPU work: a stream wait or a blocking sync."""

    kind: str  # "wait" | "sync"
    ts: float
    end: float
    tid: object


@dataclass
class RankTrace:
    """The chosen step of one rank's trace file, parsed."""

    path: str
    rank: int | None
    world: int | None
    pg_ranks: dict[str, tuple[int, ...]]
    step: int | None
    step_start: float  # s
    step_dur: float  # s
    gpu_ops: list[GpuOp]  # in launch order
    host_calls: list[HostCall]
    warnings: list[str] = field(default_factory=list)
    host_op_ts: list[float] = field(default_factory=list)  # s, starts of the recorded aten ops (sorted)
    device: str = ""  # the CUDA name of the GPU its kernels ran on (deviceProperties); "": not recorded


# ---------------------------------------------------------------------------- reading


def trace_files(path: str) -> list[str]:
    """The trace files under ``path`` (a directory, sorted by name, or one file)."""
    wrong = paths.problem(path, folder_ok=True)
    if wrong is not None:
        raise TraceError(f"{path}: {wrong}")
    if not os.path.isdir(path):
        return [path]
    files = sorted(os.path.join(path, f) for f in os.listdir(path)
                   if f.endswith(".json") or f.endswith(".json.gz"))
    if not files:
        raise TraceError(f"{path}: no .json or .json.gz trace files in this directory")
    for f in files:  # a device or a pipe named x.json would be read for ever
        wrong = paths.problem(f)
        if wrong is not None:
            raise TraceError(f"{f}: {wrong}")
    return files


def read_json(path: str) -> dict:
    """Parse a Kineto file (plain or gzip) into its top-level object."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError) as e:
        raise TraceError(f"{path}: cannot read the trace: {e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a JSON trace: {e}") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: not a Kineto trace: no 'traceEvents' list")
    return data


def _num(e: dict, key: str, path: str) -> float:
    v = e.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceError(f"{path}: event {e.get('name', '?')!r}: '{key}' is {v!r}, expected a number")
    return float(v)


def steps_of(events: list[dict], path: str) -> dict[int, tuple[float, float]]:
    out: dict[int, tuple[float, float]] = {}
    for e in events:
        m = _STEP.match(str(e.get("name", "")))
        # the host's step annotation only: newer profilers also write a "gpu_user_annotation" copy
        # spanning the step's GPU work (the H200 trace's is 93 ms of a 260 ms step), which would
        # otherwise replace it
        if m and e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation":
            out[int(m.group(1))] = (_num(e, "ts", path) * US, _num(e, "dur", path) * US)
    return out


def complete_steps(events: list[dict], steps: dict[int, tuple[float, float]], path: str) -> set[int]:
    """Steps all of whose kernel launches have their kernel in the trace."""
    gpu_corr = {e.get("args", {}).get("correlation") for e in events if e.get("cat") in _GPU_CATS}
    ok = set()
    for n, (ts, dur) in steps.items():
        missing = False
        for e in events:
            if e.get("cat") not in _RUNTIME_CATS or "LaunchKernel" not in str(e.get("name", "")):
                continue  # CUPTI may drop a memset record; a missing kernel means a cut step
            t = _num(e, "ts", path) * US
            if ts <= t <= ts + dur and e.get("args", {}).get("correlation") not in gpu_corr:
                missing = True
                break
        if not missing:
            ok.add(n)
    return ok


def _is_launch(name: str) -> bool:
    return "Launch" in name or "Memcpy" in name or "Memset" in name


def _is_sync(name: str) -> bool:
    return "Synchronize" in name or name in ("cudaMemcpy", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2")


def _dist_info(data: dict, path: str) -> tuple[int | None, int | None, dict[str, tuple[int, ...]]]:
    info = data.get("distributedInfo")
    if info is None:
        return None, None, {}
    if not isinstance(info, dict):
        raise TraceError(f"{path}: 'distributedInfo' is {info!r}, expected an object")
    rank, world = info.get("rank"), info.get("world_size")
    if rank is not None and (not isinstance(rank, int) or rank < 0):
        raise TraceError(f"{path}: distributedInfo.rank is {rank!r}, expected a non-negative integer")
    if world is not None and (not isinstance(world, int) or world < 1):
        raise TraceError(f"{path}: distributedInfo.world_size is {world!r}, expected a positive integer")
    pgs = {}
    for pg in info.get("pg_config", []) or []:
        if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
            name = str(pg.get("pg_name"))
            pgs[name] = _members(pg["ranks"], f"{path}: distributedInfo.pg_config {name!r}")
    return rank, world, pgs


def read_rank(path: str, iteration: int | None = None, *, data: dict | None = None) -> RankTrace:
    """Parse one rank's file and keep the GPU work launched inside ``ProfilerStep#iteration``.

    ``iteration=None`` takes the last complete step; a trace without
    ``ProfilerStep`` annotations is taken whole.
    """
    data = data if data is not None else read_json(path)
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]
    rank, world, pgs = _dist_info(data, path)
    steps = steps_of(events, path)
    if iteration is not None and iteration not in steps:
        have = ", ".join(f"#{n}" for n in sorted(steps)) or "none"
        raise TraceError(f"{path}: no ProfilerStep#{iteration} (steps in the file: {have})")
    if iteration is None and steps:
        complete = complete_steps(events, steps, path)
        if not complete:
            raise TraceError(f"{path}: no complete ProfilerStep (every step lacks GPU activity of some launch)")
        iteration = max(complete)
    if iteration is not None:
        win = steps[iteration]
    else:
        ts = [_num(e, "ts", path) * US for e in events if e.get("cat") in _RUNTIME_CATS + _GPU_CATS]
        if not ts:
            raise TraceError(f"{path}: no GPU activity and no CUDA runtime calls in the trace")
        win = (min(ts), max(ts) - min(ts))
    gpu_ops, calls = _collect(events, win, path)
    rt = RankTrace(path, rank, world, pgs, iteration, win[0], win[1], gpu_ops, calls, device=device_name(data, gpu_ops))
    _annotate(rt, events)
    return rt


def device_name(data: dict, gpu_ops: list[GpuOp]) -> str:
    """The name of the GPU the step's kernels ran on, as Kineto records it in ``deviceProperties``
    (torch.cuda.get_device_name: "NVIDIA H200"): the entry whose ``id`` is the kernels' ``device``,
    or the one name every entry has; "" when the trace records none or several GPUs it cannot tell apart."""
    props = [p for p in data.get("deviceProperties") or [] if isinstance(p, dict) and p.get("name")]
    used = {g.args.get("device") for g in gpu_ops if isinstance(g.args, dict) and g.args.get("device") is not None}
    if len(used) == 1:
        dev = used.pop()
        named = [str(p["name"]) for p in props if p.get("id") == dev]
        if named:
            return named[0]
    names = {str(p["name"]) for p in props}
    return names.pop() if len(names) == 1 else ""


def _collect(events: list[dict], win: tuple[float, float], path: str) -> tuple[list[GpuOp], list[HostCall]]:
    start, dur = win
    gpu_by_corr: dict[object, dict] = {}
    for e in events:
        if e.get("cat") in _GPU_CATS and e.get("ph") == "X":
            args = e.get("args")
            if not isinstance(args, dict) or "stream" not in args:
                raise TraceError(f"{path}: GPU event {e.get('name', '?')!r} at ts {e.get('ts')} has no 'stream' arg")
            gpu_by_corr[args.get("correlation", id(e))] = e
    ops: list[GpuOp] = []
    calls: list[HostCall] = []
    for e in events:
        if e.get("cat") not in _RUNTIME_CATS or e.get("ph") != "X":
            continue
        t = _num(e, "ts", path) * US
        if not start <= t <= start + dur:
            continue
        name = str(e.get("name", ""))
        g = gpu_by_corr.get(e.get("args", {}).get("correlation"))
        if g is not None:
            ops.append(GpuOp(_num(g, "ts", path) * US, _num(g, "dur", path) * US, int(g["args"]["stream"]),
                             str(g.get("name", "")), str(g.get("cat")), g["args"], t, e.get("tid")))
        elif name == "cudaStreamWaitEvent":
            calls.append(HostCall("wait", t, t + _num(e, "dur", path) * US, e.get("tid")))
        elif _is_sync(name):
            calls.append(HostCall("sync", t, t + _num(e, "dur", path) * US, e.get("tid")))
    ops.sort(key=lambda o: (o.launch_ts, o.ts))
    calls.sort(key=lambda c: c.ts)
    if not ops:
        raise TraceError(f"{path}: the chosen step launches no GPU work")
    return ops, calls


# ---------------------------------------------------------------------------- CPU context


def _enclosing(intervals: list[dict], times: list[float]) -> list[list[dict]]:
    """For each time (sorted), the stack of intervals (ts, dur in s) that contain it."""
    out: list[list[dict]] = []
    stack: list[dict] = []
    i = 0
    for t in times:
        while i < len(intervals) and intervals[i]["_ts"] <= t:
            iv = intervals[i]
            while stack and stack[-1]["_end"] < iv["_ts"]:
                stack.pop()
            stack.append(iv)
            i += 1
        while stack and stack[-1]["_end"] < t:
            stack.pop()
        out.append([iv for iv in stack if iv["_end"] >= t])
    return out


def _annotate(rt: RankTrace, events: list[dict]) -> None:
    """Category, innermost aten op and communication info of every GPU op."""
    by_tid: dict[object, list[dict]] = {}
    for e in events:
        if e.get("cat") in _HOST_CATS and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)):
            e = dict(e)
            e["_ts"] = e["ts"] * US
            e["_end"] = e["_ts"] + float(e.get("dur", 0) or 0) * US
            by_tid.setdefault(e.get("tid"), []).append(e)
    for ivs in by_tid.values():
        ivs.sort(key=lambda e: (e["_ts"], -e["_end"]))
    rt.host_op_ts = sorted(e["_ts"] for ivs in by_tid.values() for e in ivs if e.get("cat") == "cpu_op")
    ops_by_tid: dict[object, list[GpuOp]] = {}
    for op in rt.gpu_ops:
        ops_by_tid.setdefault(op.launch_tid, []).append(op)
    for tid, ops in ops_by_tid.items():
        ops.sort(key=lambda o: o.launch_ts)
        stacks = _enclosing(by_tid.get(tid, []), [o.launch_ts for o in ops])
        for op, stack in zip(ops, stacks):
            _classify(op, stack, tid, rt)


def _classify(op: GpuOp, stack: list[dict], tid: object, rt: RankTrace) -> None:
    names = [str(e.get("name", "")) for e in stack]
    if op.cat == "gpu_memcpy":
        op.category = "memcpy"
    elif op.cat == "gpu_memset":
        op.category = "memset"
    elif op.is_nccl:
        op.category = "comm"
    elif any(n.startswith("Optimizer.") or n.startswith("optimizer") for n in names):
        op.category = "optimizer"
    elif any("backward" in n.lower() or n.startswith("autograd::engine") for n in names):
        op.category = "bwd"
    else:
        op.category = "fwd"
    aten = [e for e in stack if str(e.get("name", "")).startswith("aten::")]
    if aten:
        # the outermost aten op is the one whose shapes describe the whole computation
        op.cpu_op = aten[0]
        op.cpu_instance = id(aten[0])
        op.cpu_inner = aten[-1]
    # torch.compile: Inductor wraps each Triton launch in a record named after the kernel, whose args carry
    # kernel_file, kernel_hash and kernel_backend (and kernel_flop, kernel_num_gb with its benchmark options;
    # torch _inductor/runtime/triton_heuristics.py, CachingAutotuner.get_profiler_kwargs), with the kernel's
    # tensor arguments' 'Input Dims' under record_shapes
    inductor = [e for e in stack if isinstance(e.get("args"), dict) and "kernel_backend" in e["args"]]
    if inductor:
        op.compiled = inductor[-1]
    nodes = [e for e in stack if not str(e.get("name", "")).startswith("aten::")]
    if nodes:
        op.node = str(nodes[-1].get("name", ""))
        op.node_instance = id(nodes[-1])
    if op.is_nccl:
        op.comm = _comm_info(op, stack, rt)


def _dtype_bytes(name: object, where: str) -> int:
    key = str(name).strip().lower()
    if key not in DTYPE_BYTES:
        raise TraceError(f"{where}: unknown dtype {name!r}")
    return DTYPE_BYTES[key]


def _numel(dims: object) -> int:
    """Elements of a shape list ([[a, b], [c]] sums the tensors; [] is a scalar or none)."""
    if not isinstance(dims, list):
        return 0
    if dims and all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    return sum(_numel(d) for d in dims if isinstance(d, list) and d)


def _parse_ranks(v: object, where: str) -> tuple[int, ...] | None:
    """A process group's ranks (a list, or its JSON text), sorted; each member once."""
    if isinstance(v, str) and v.strip().startswith("["):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            return None
    if not isinstance(v, list) or not v:
        return None
    return _members(v, where)


def _members(v: list, where: str) -> tuple[int, ...]:
    try:
        ranks = [int(x) for x in v]
    except (TypeError, ValueError):
        raise TraceError(f"{where}: process group ranks {v!r}: expected a list of integers") from None
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise TraceError(f"{where}: process group ranks {ranks} list rank {twice[0]} more than once; "
                         "expected each member once")
    return tuple(sorted(ranks))


def _bytes_for(coll: str, in_n: int, out_n: int, esize: int, n: int) -> float:
    """nccl-tests buffer size S: all-reduce buffer, all-gather output, reduce-scatter input,
    all-to-all send buffer, broadcast buffer."""
    if coll == "all_gather":
        return float((out_n or in_n * n) * esize)
    if coll == "reduce_scatter":
        return float((in_n or out_n * n) * esize)
    return float((in_n or out_n) * esize)


def _comm_info(op: GpuOp, stack: list[dict], rt: RankTrace) -> CommInfo:
    where = f"{rt.path}: NCCL kernel at ts {op.ts / US:.0f} us"
    a = op.args
    n = rt.world or 1
    if "Collective name" in a:
        coll = _COLL_NAMES.get(str(a["Collective name"]).lower())
        if coll is None:
            raise TraceError(f"{where}: unknown 'Collective name' {a['Collective name']!r}")
        group = _parse_ranks(a.get("Process Group Ranks"), where)
        gsize = int(a.get("Group size") or (len(group) if group else n))
        esize = _dtype_bytes(a.get("dtype", "float"), where)
        in_n, out_n = int(a.get("In msg nelems") or 0), int(a.get("Out msg nelems") or 0)
        return CommInfo(coll, _bytes_for(coll, in_n, out_n, esize, gsize), group,
                        int(a.get("Peer rank", -1) if str(a.get("Peer rank", "-1")).lstrip("-").isdigit() else -1),
                        "kernel args")
    ann = [e for e in stack if str(e.get("name", "")).startswith("nccl:")]
    if ann:
        e = ann[-1]
        key = str(e["name"])[5:]
        coll = _COLL_NAMES.get(key.lower())
        if coll is None:
            raise TraceError(f"{where}: unknown annotation {e['name']!r}")
        args = e.get("args", {})
        types = [t for t in args.get("Input type", []) if t and t not in ("Scalar", "TensorList")]
        esize = _dtype_bytes(types[0], where) if types else 4
        in_n, out_n = _numel(args.get("Input Dims")), _numel(args.get("Output Dims"))
        return CommInfo(coll, _bytes_for(coll, in_n, out_n, esize, n), None, -1, "annotation")
    for token, coll in _KERNEL_COLL:
        if token in op.name:
            rt.warnings.append(f"{where}: no size in kernel args or nccl:* annotation; imported with 0 bytes")
            return CommInfo(coll, 0.0, None, -1, "kernel name")
    raise TraceError(f"{where}: cannot tell which collective {op.name[:60]!r} is")

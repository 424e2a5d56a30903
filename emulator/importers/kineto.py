"""Kineto importer: PyTorch profiler traces (Chrome JSON) of real runs into a Program.

``load_kineto(path, mirror=0, iteration=None)`` reads one rank per file (a
directory of ``*.json`` / ``*.json.gz``, or one file) and turns one
``ProfilerStep#N`` into the per-rank op DAG of :mod:`emulator.program`.

What becomes what
- GPU kernels, memcpys and memsets -> ``compute`` ops with their measured
  ``duration`` on their CUDA stream (stream ``"cuda:7"``). Category: ``bwd``
  under an autograd/backward CPU op, ``optimizer`` under ``Optimizer.*``,
  ``memcpy``/``memset``, else ``fwd``.
- NCCL kernels -> ``collective`` ops (or send/recv). Kind, element count, dtype
  and group come from the kernel args ('Collective name', 'In msg nelems', 'Out
  msg nelems', 'dtype', 'Process Group Ranks') when present, else from the
  enclosing CPU-side ``nccl:*`` annotation of the launch ('Input Dims',
  'Output Dims', 'Input type'), found by time containment on the launching
  thread. ``bytes`` is the nccl-tests buffer size S (see ``Op``). DLRM's
  ``SendRecv`` kernels under ``nccl:all_to_all`` are all_to_all collectives.
  The measured NCCL kernel time is *not* kept on the op: the engine re-emulates
  the transfer, and waiting for slow ranks emerges from the rendezvous.
- The CPU (choice documented here): one in-order host lane per rank, stream
  ``"cpu"``, made of fixed-duration compute ops (category ``host``). All launch
  calls of all host threads of the rank are merged in time order; the cpu op
  before a launch lasts from the previous launch (or sync return) to this
  launch, and the GPU op depends on it: a GPU op cannot start before the CPU
  launched it. A blocking sync (``cuda*Synchronize``, ``cudaMemcpy``) ends the
  CPU lane's segment; the next segment starts from the sync's return and depends
  on the GPU op that the sync waited for (the launched op whose measured end is
  the latest before the sync returned), so the host waits for the emulated GPU
  rather than for the measured one. The first cpu op of a rank lasts from the
  earliest step start over all ranks (shared clock) to its first launch, which
  keeps the measured start skew between ranks.
- Cross-stream waits: the traces carry no event ids, so a ``cudaStreamWaitEvent``
  followed (on the same thread) by a launch ``b`` on stream X makes ``b``
  depend on the last op launched before the wait on every other stream Y,
  *unless* the measured timeline rules it out (``b`` started before that op
  ended, beyond ``_TOL_S``): the event was then recorded earlier, or on another
  stream.

``Program.meta["measured"]`` holds what the trace measured, per rank (a list
indexed by rank): the GPU span (first to last GPU op of the step), the start
offset, and per collective its measured duration and, when all ranks share a
clock, its own cost (end minus the last rank's arrival) and its wait.
"""
from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass, field

from ..program import COLLECTIVE, COMPUTE, RECV, SEND, Op, Program

from ..trace import TraceError  # the project's one trace error (an EmulatorError)


US = 1e-6  # Kineto timestamps are microseconds
_TOL_S = 2e-6  # s, slack allowed when testing a dependency against measured times
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
    launch_ts: float | None = None  # s
    launch_tid: object = None
    category: str = "fwd"
    cpu_op: dict | None = None  # innermost enclosing aten op (with 'Input Dims' when recorded)
    cpu_instance: int = -1  # identity of that cpu op instance (to group its kernels)
    comm: CommInfo | None = None

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


# ---------------------------------------------------------------------------- reading


def trace_files(path: str) -> list[str]:
    """The trace files under ``path`` (a directory, sorted by name, or one file)."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.endswith(".json") or f.endswith(".json.gz"))
        if not files:
            raise TraceError(f"{path}: no .json or .json.gz trace files in this directory")
        return files
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such file or directory")
    return [path]


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


def _steps(events: list[dict], path: str) -> dict[int, tuple[float, float]]:
    out: dict[int, tuple[float, float]] = {}
    for e in events:
        m = _STEP.match(str(e.get("name", "")))
        if m and e.get("ph") == "X":
            out[int(m.group(1))] = (_num(e, "ts", path) * US, _num(e, "dur", path) * US)
    return out


def _complete_steps(events: list[dict], steps: dict[int, tuple[float, float]], path: str) -> set[int]:
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
            pgs[str(pg.get("pg_name"))] = tuple(int(r) for r in pg["ranks"])
    return rank, world, pgs


def read_rank(path: str, iteration: int | None = None, *, data: dict | None = None) -> RankTrace:
    """Parse one rank's file and keep the GPU work launched inside ``ProfilerStep#iteration``.

    ``iteration=None`` takes the last complete step; a trace without
    ``ProfilerStep`` annotations is taken whole.
    """
    data = data if data is not None else read_json(path)
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]
    rank, world, pgs = _dist_info(data, path)
    steps = _steps(events, path)
    if iteration is not None and iteration not in steps:
        have = ", ".join(f"#{n}" for n in sorted(steps)) or "none"
        raise TraceError(f"{path}: no ProfilerStep#{iteration} (steps in the file: {have})")
    if iteration is None and steps:
        complete = _complete_steps(events, steps, path)
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
    rt = RankTrace(path, rank, world, pgs, iteration, win[0], win[1], gpu_ops, calls)
    _annotate(rt, events)
    return rt


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


def _parse_ranks(v: object) -> tuple[int, ...] | None:
    if isinstance(v, list):
        return tuple(sorted(int(x) for x in v))
    if isinstance(v, str) and v.strip().startswith("["):
        try:
            lst = json.loads(v)
        except json.JSONDecodeError:
            return None
        return tuple(sorted(int(x) for x in lst)) if lst else None
    return None


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
        group = _parse_ranks(a.get("Process Group Ranks"))
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


# ---------------------------------------------------------------------------- building


def load_kineto(path: str, *, mirror: int = 0, iteration: int | None = None) -> Program:
    """Import Kineto traces (a directory of per-rank files, or one file) as a Program.

    ``mirror=N`` replays a one-rank trace as N symmetric data-parallel ranks.
    ``iteration`` picks ``ProfilerStep#iteration`` (default: the last step that is
    complete in every file).
    """
    if not isinstance(mirror, int) or mirror < 0:
        raise TraceError(f"{path}: mirror must be a non-negative integer, found {mirror!r}")
    files = trace_files(path)
    datas = [read_json(f) for f in files]
    if iteration is None:
        iteration = _common_step(files, datas)
    traces = [read_rank(f, iteration, data=d) for f, d in zip(files, datas)]
    traces = _assign_ranks(traces, path, mirror)
    if mirror:
        if len(traces) != 1:
            raise TraceError(f"{path}: mirror needs a one-rank trace, found {len(traces)} rank files")
        world = mirror
        sources = [traces[0]] * mirror
    else:
        world = len(traces)
        sources = traces
    shared = not mirror and _shared_clock(traces)
    t0 = min(t.step_start for t in sources) if shared else None
    ops: list[Op] = []
    per_rank: list[dict] = []
    next_id = [0]
    for r, rt in enumerate(sources):
        built, info = _build_rank(rt, r, world, bool(mirror), t0 if t0 is not None else rt.step_start, next_id)
        ops.extend(built)
        per_rank.append(info)
    if shared:
        _own_costs(per_rank)
    program = Program(ranks=world, ops=ops, meta={
        "source": {"format": "kineto", "path": path, "files": files, "iteration": traces[0].step,
                   "mirror": mirror},
        "measured": {
            "iteration": traces[0].step, "shared_clock": shared, "ranks": per_rank,
            "span_s": max(p["end_s"] for p in per_rank) - min(p["start_s"] for p in per_rank),
        },
        "warnings": [w for t in traces for w in t.warnings],
    })
    try:
        program.validate()
    except ValueError as e:
        raise TraceError(f"{path}: the imported program is inconsistent: {e}") from None
    return program


def _common_step(files: list[str], datas: list[dict]) -> int | None:
    common: set[int] | None = None
    any_steps = False
    for f, d in zip(files, datas):
        events = [e for e in d["traceEvents"] if isinstance(e, dict)]
        steps = _steps(events, f)
        if not steps:
            continue
        any_steps = True
        done = _complete_steps(events, steps, f)
        common = done if common is None else common & done
    if not any_steps:
        return None
    if not common:
        raise TraceError(f"{os.path.dirname(files[0]) or files[0]}: no ProfilerStep is complete in every rank file")
    return max(common)


def _assign_ranks(traces: list[RankTrace], path: str, mirror: int) -> list[RankTrace]:
    if all(t.rank is not None for t in traces):
        by_rank = {}
        for t in traces:
            if t.rank in by_rank:
                raise TraceError(f"{path}: rank {t.rank} appears twice ({by_rank[t.rank].path} and {t.path})")
            by_rank[t.rank] = t
        ordered = [by_rank[r] for r in sorted(by_rank)]
    else:
        ordered = traces
    if mirror:
        return ordered
    ranks = [t.rank for t in ordered]
    world = ordered[0].world
    if all(r is not None for r in ranks) and ranks != list(range(len(ordered))):
        hint = f"; use mirror={world} to replay one rank as {world} symmetric ranks" if len(ordered) == 1 and world else ""
        raise TraceError(f"{path}: has the traces of ranks {ranks} of a world of {world}, "
                         f"expected every rank 0..{len(ordered) - 1}{hint}")
    if world is not None and world != len(ordered):
        hint = f"; use mirror={world} to replay one rank as {world} symmetric ranks" if len(ordered) == 1 else ""
        raise TraceError(f"{path}: world_size is {world} but there are {len(ordered)} rank files{hint}")
    return ordered


def _shared_clock(traces: list[RankTrace]) -> bool:
    """True when the k-th collectives of the ranks end together (within 100 us): one host clock."""
    if len(traces) < 2:
        return False
    ends = [[o.end for o in t.gpu_ops if o.is_nccl] for t in traces]
    k = min(len(e) for e in ends)
    if k == 0:
        return False
    return all(max(e[i] for e in ends) - min(e[i] for e in ends) < 100e-6 for i in range(k))


def _short(name: str) -> str:
    name = name.split("(")[0].strip()
    if name.startswith("void "):
        name = name[5:]
    return name[:80]


def _build_rank(rt: RankTrace, rank: int, world: int, mirrored: bool, t0: float,
                next_id: list[int]) -> tuple[list[Op], dict]:
    """The ops of one rank: a host lane, the GPU ops, and their dependencies."""
    ops: list[Op] = []
    gpu_ids: list[int] = []  # op id of rt.gpu_ops[i]
    state = _LaneState(cursor=t0)

    def new_id() -> int:
        next_id[0] += 1
        return next_id[0] - 1

    def host(until: float, deps: tuple[int, ...], name: str) -> int | None:
        dur = max(0.0, until - state.cursor)
        if dur <= 0 and not deps and state.last_cpu is not None:
            return state.last_cpu
        if state.last_cpu is None and dur <= 0 and not deps:
            return None
        oid = new_id()
        ops.append(Op(id=oid, rank=rank, kind=COMPUTE, stream="cpu", deps=deps, name=name,
                      duration=dur, category="host"))
        state.cursor = max(state.cursor, until)
        state.last_cpu = oid
        return oid

    calls = list(rt.host_calls)
    ci = 0
    pending_waits: dict[object, list[dict[int, int]]] = {}  # tid -> snapshots (stream -> gpu index)
    last_on_stream: dict[int, int] = {}  # stream -> index into rt.gpu_ops
    pending_sync_dep: list[int] = []
    collectives: list[dict] = []
    for i, g in enumerate(rt.gpu_ops):
        while ci < len(calls) and calls[ci].ts <= g.launch_ts:
            c = calls[ci]
            ci += 1
            if c.kind == "wait":
                pending_waits.setdefault(c.tid, []).append(dict(last_on_stream))
            elif _sync_blocks(c, rt.gpu_ops, i):
                host(c.ts, tuple(pending_sync_dep), "cpu")
                pending_sync_dep = []
                waited = _waited_op(rt.gpu_ops[:i], c.end)
                if waited is not None:
                    pending_sync_dep = [gpu_ids[waited]]
                state.cursor = max(state.cursor, c.end)
        cpu = host(g.launch_ts, tuple(pending_sync_dep), "cpu")
        pending_sync_dep = []
        deps = [cpu] if cpu is not None else []
        for snap in pending_waits.pop(g.launch_tid, []):
            for s, j in snap.items():
                if s != g.stream and g.ts >= rt.gpu_ops[j].end - _TOL_S and gpu_ids[j] not in deps:
                    deps.append(gpu_ids[j])
        oid = new_id()
        gpu_ids.append(oid)
        ops.append(_gpu_op(g, oid, rank, world, mirrored, tuple(deps), rt))
        if ops[-1].kind != COMPUTE:
            collectives.append({"op_id": oid, "collective": ops[-1].collective or ops[-1].kind,
                                "group": list(ops[-1].group), "bytes": ops[-1].bytes,
                                "start_s": g.ts - t0, "end_s": g.end - t0, "duration_s": g.dur,
                                "own_s": None, "wait_s": None})
        last_on_stream[g.stream] = i
    first = min(g.ts for g in rt.gpu_ops)
    last = max(g.end for g in rt.gpu_ops)
    info = {"rank": rank, "file": rt.path, "span_s": last - first, "start_s": first - t0,
            "end_s": last - t0, "step_start_s": rt.step_start - t0, "cpu_step_s": rt.step_dur,
            "collectives": collectives}
    return ops, info


@dataclass
class _LaneState:
    cursor: float
    last_cpu: int | None = None


def _sync_blocks(call: HostCall, gpu_ops: list[GpuOp], i: int) -> bool:
    """A sync blocks the merged host lane unless another thread launched during it."""
    return not any(call.ts < g.launch_ts < call.end and g.launch_tid != call.tid for g in gpu_ops[i:i + 64])


def _waited_op(launched: list[GpuOp], sync_end: float) -> int | None:
    """Index of the launched op that a sync returning at ``sync_end`` waited for."""
    best, best_end = None, -1.0
    for j, g in enumerate(launched):
        if g.end <= sync_end + _TOL_S and g.end > best_end:
            best, best_end = j, g.end
    return best


def _gpu_op(g: GpuOp, oid: int, rank: int, world: int, mirrored: bool, deps: tuple[int, ...],
            rt: RankTrace) -> Op:
    stream = f"cuda:{g.stream}"
    name = _short(g.name)
    if g.comm is None:
        nbytes = float(g.args.get("bytes", 0) or 0) if g.cat == "gpu_memcpy" else 0.0
        return Op(id=oid, rank=rank, kind=COMPUTE, stream=stream, deps=deps, name=name,
                  duration=g.dur, bytes=nbytes, category=g.category)
    c = g.comm
    if c.op in (SEND, RECV):
        if c.peer < 0:
            rt.warnings.append(f"{rt.path}: {c.op} at ts {g.ts / US:.0f} us has no peer; imported as a "
                               f"fixed-duration compute op")
            return Op(id=oid, rank=rank, kind=COMPUTE, stream=stream, deps=deps, name=name,
                      duration=g.dur, bytes=c.bytes, category="comm")
        return Op(id=oid, rank=rank, kind=c.op, stream=stream, deps=deps, name=name, bytes=c.bytes,
                  peer=c.peer, category="comm")
    group = c.group
    if mirrored or group is None:
        if mirrored and group is not None and rt.world and len(group) != rt.world:
            rt.warnings.append(f"{rt.path}: collective on sub-group {list(group)} widened to all {world} ranks")
        group = tuple(range(world))
    nbytes = c.bytes
    if mirrored and c.op in ("all_gather", "reduce_scatter"):
        n_old = len(c.group) if c.group else (rt.world or 1)
        nbytes = c.bytes / n_old * world  # S scales with the group for these two
    return Op(id=oid, rank=rank, kind=COLLECTIVE, stream=stream, deps=deps, name=name, bytes=nbytes,
              collective=c.op, group=group, category="comm")


def _own_costs(per_rank: list[dict]) -> None:
    """Own cost and wait of each collective, matched k-th to k-th per group (shared clock)."""
    by_group: dict[tuple, list[list[dict]]] = {}
    for info in per_rank:
        seen: dict[tuple, list[dict]] = {}
        for c in info["collectives"]:
            seen.setdefault(tuple(c["group"]), []).append(c)
        for g, lst in seen.items():
            by_group.setdefault(g, []).append(lst)
    for g, lists in by_group.items():
        if len(lists) != len(g):
            continue
        for k in range(min(len(lst) for lst in lists)):
            arrival = max(lst[k]["start_s"] for lst in lists)
            for lst in lists:
                c = lst[k]
                c["own_s"] = max(0.0, c["end_s"] - arrival)
                c["wait_s"] = max(0.0, arrival - c["start_s"])

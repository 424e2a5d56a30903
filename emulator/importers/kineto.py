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
  ended, beyond ``TOL_S``): the event was then recorded earlier, or on another
  stream.

``Program.meta.measured`` (``emulator.meta.Measured``) holds what the trace measured, per rank (a list
indexed by rank): the GPU span (first to last GPU op of the step), the start
offset, and per collective its measured duration and, when all ranks share a
clock, its own cost (end minus the last rank's arrival) and its wait.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from emulator.importers.kineto_reader import (  # records and reading
    TOL_S,
    US,
    GpuOp,
    HostCall,
    RankTrace,
    complete_steps,
    read_json,
    read_rank,
    steps_of,
    trace_files,
)
from emulator.importers.native import TraceError  # the project's one trace error (an EmulatorError)
from emulator.importers.pairs import pair_mismatch
from emulator.meta import CollectiveMeasure, Measured, ProgramMeta, RankMeasure, TraceFacts, TraceSource
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Op, OpKind, Program

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
        if mirror > 1 and not any(g.is_nccl for g in traces[0].gpu_ops):
            # mirrored copies of a step without communication would run side by side and never meet:
            # a data-parallel run of a one-GPU script is a profiled workload (DDP's gradient buckets)
            raise TraceError(f"{path}: the trace has no communication, so {mirror} mirrored copies would not "
                             "exchange gradients; to predict the script data-parallel, give it as "
                             "workload.profile (with workload.profiled) and set parallel.dp")
        world = mirror
        sources = [traces[0]] * mirror
    else:
        world = len(traces)
        sources = traces
    shared = not mirror and _shared_clock(traces)
    t0 = min(t.step_start for t in sources) if shared else None
    ops: list[Op] = []
    per_rank: list[RankMeasure] = []
    next_id = [0]
    for r, rt in enumerate(sources):
        built, info = _build_rank(rt, r, world, bool(mirror), t0 if t0 is not None else rt.step_start, next_id)
        ops.extend(built)
        per_rank.append(info)
    if shared:
        _own_costs(per_rank)
    measured: Measured = {
        "iteration": traces[0].step, "shared_clock": shared, "ranks": per_rank,
        "span_s": max(p["end_s"] for p in per_rank) - min(p["start_s"] for p in per_rank),
    }
    source = TraceSource("kineto", path, tuple(files), traces[0].step, mirror)
    facts = TraceFacts(source, measured, tuple(w for t in traces for w in t.warnings))
    program = Program(ranks=world, ops=ops, meta=ProgramMeta(trace=facts))
    try:
        program.validate()
    except ValueError as e:
        raise TraceError(f"{path}: the imported program is inconsistent: {e}") from None
    mismatch = pair_mismatch(program)
    if mismatch is not None:
        raise TraceError(f"{path}: the imported program is inconsistent: {mismatch}")
    return program


def _common_step(files: list[str], datas: list[dict]) -> int | None:
    common: set[int] | None = None
    any_steps = False
    for f, d in zip(files, datas):
        events = [e for e in d["traceEvents"] if isinstance(e, dict)]
        steps = steps_of(events, f)
        if not steps:
            continue
        any_steps = True
        done = complete_steps(events, steps, f)
        common = done if common is None else common & done
    if not any_steps:
        return None
    if not common:
        raise TraceError(f"{os.path.dirname(files[0]) or files[0]}: no ProfilerStep is complete in every rank file")
    return max(common)


def _assign_ranks(traces: list[RankTrace], path: str, mirror: int) -> list[RankTrace]:
    if all(t.rank is not None for t in traces):
        by_rank: dict[int, RankTrace] = {}
        for t in traces:
            rank = t.rank
            assert rank is not None  # all of them, just checked
            if rank in by_rank:
                raise TraceError(f"{path}: rank {rank} appears twice ({by_rank[rank].path} and {t.path})")
            by_rank[rank] = t
        ordered = [by_rank[r] for r in sorted(by_rank)]
    else:
        ordered = traces
    if mirror:
        return ordered
    ranks = [t.rank for t in ordered]
    world = ordered[0].world
    if all(r is not None for r in ranks) and ranks != list(range(len(ordered))):
        one = len(ordered) == 1 and world
        hint = f"; use mirror={world} to replay one rank as {world} symmetric ranks" if one else ""
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
                next_id: list[int]) -> tuple[list[Op], RankMeasure]:
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
    collectives: list[CollectiveMeasure] = []
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
                if s != g.stream and g.ts >= rt.gpu_ops[j].end - TOL_S and gpu_ids[j] not in deps:
                    deps.append(gpu_ids[j])
        oid = new_id()
        gpu_ids.append(oid)
        ops.append(_gpu_op(g, oid, rank, world, mirrored, tuple(deps), rt))
        if ops[-1].kind is not COMPUTE:
            collectives.append({"op_id": oid, "collective": ops[-1].collective or ops[-1].kind.label,
                                "group": list(ops[-1].group), "bytes": ops[-1].bytes,
                                "start_s": g.ts - t0, "end_s": g.end - t0, "duration_s": g.dur,
                                "own_s": None, "wait_s": None})
        last_on_stream[g.stream] = i
    first = min(g.ts for g in rt.gpu_ops)
    last = max(g.end for g in rt.gpu_ops)
    info: RankMeasure = {"rank": rank, "file": rt.path, "span_s": last - first, "start_s": first - t0,
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
        if g.end <= sync_end + TOL_S and g.end > best_end:
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
    if c.op in (SEND.label, RECV.label):
        if c.peer < 0:
            rt.warnings.append(f"{rt.path}: {c.op} at ts {g.ts / US:.0f} us has no peer; imported as a "
                               f"fixed-duration compute op")
            return Op(id=oid, rank=rank, kind=COMPUTE, stream=stream, deps=deps, name=name,
                      duration=g.dur, bytes=c.bytes, category="comm")
        return Op(id=oid, rank=rank, kind=OpKind.parse(c.op), stream=stream, deps=deps, name=name, bytes=c.bytes,
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


def _own_costs(per_rank: list[RankMeasure]) -> None:
    """Own cost and wait of each collective, matched k-th to k-th per group (shared clock)."""
    by_group: dict[tuple[int, ...], list[list[CollectiveMeasure]]] = {}
    for info in per_rank:
        seen: dict[tuple[int, ...], list[CollectiveMeasure]] = {}
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

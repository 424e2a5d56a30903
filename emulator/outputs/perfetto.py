"""trace.json: a Chrome/Perfetto trace (JSON trace-event format).

One process per rank, named "rank 5 · node 0 · gpu 5", one thread per stream;
each op a complete ("X") event in µs, with bytes, FLOPs, micro-batch, stage
and, for communication, the time spent waiting for the other members. The
busiest fabric links are counter tracks (GB/s) in a "fabric links" process.

A multi-job run (``jobs:``) has one process per job instead, named "job a · nodes 0, 2",
with one thread per rank and stream ("rank 3 · gpu 19 · compute"; the rank is the job's own).
Timed link faults (``at``/``until``) are spans from ``at`` to ``until`` (or to the
end of the run) in a "faults" process, with an instant event at ``at``.
"""
from __future__ import annotations

import json
from typing import IO, Iterable, Iterator

from emulator.outputs.atomic import write_atomic
from emulator.result import Result
from emulator.spans import by_rank

TOP_LINKS = 24  # counter tracks are kept for the busiest links only: readable and small


def _rank_name(result: Result, rank: int) -> str:
    topo = result.topology
    node = topo.node_of(rank) if rank < len(topo.gpus) else -1
    if node < 0:
        return f"rank {rank} · {topo.gpus[rank] if rank < len(topo.gpus) else 'gpu ?'}"
    return f"rank {rank} · node {node} · gpu {rank % topo.gpus_per_node}"


def _job_lanes(result: Result) -> tuple[list[dict], dict[tuple[int, str], tuple[int, int]]]:
    """Metadata events and (cluster GPU, stream) → (pid, tid) for a multi-job run: a process per job."""
    events: list[dict] = []
    streams: dict[int, set[str]] = {}
    for s in result.spans:
        streams.setdefault(s.rank, set()).add(s.stream)
    lanes: dict[tuple[int, str], tuple[int, int]] = {}
    for pid, run in enumerate(result.jobs):
        nodes = ", ".join(str(n) for n in run.job.nodes_assigned)
        events.append({"ph": "M", "pid": pid, "name": "process_name",
                       "args": {"name": f"job {run.job.name} · nodes {nodes}"}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
        tid = 0
        for rank, gpu in enumerate(run.gpus):
            for name in sorted(streams.get(gpu, ()), key=lambda n: (n != "compute", n)):
                lanes[(gpu, name)] = (pid, tid)
                events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                               "args": {"name": f"rank {rank} · gpu {gpu} · {name}"}})
                events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                               "args": {"sort_index": tid}})
                tid += 1
    return events, lanes


def trace_events(result: Result) -> list[dict]:
    """Every event of the trace, in file order."""
    return list(iter_events(result))


def iter_events(result: Result) -> Iterator[dict]:
    """The events of ``trace_events``, one at a time (``write_perfetto`` never holds them all)."""
    if result.jobs:
        yield from _job_events(result)
        return
    events: list[dict] = []
    streams: dict[int, dict[str, int]] = {}
    spans = by_rank(result.spans)
    for s in spans:
        streams.setdefault(s.rank, {}).setdefault(s.stream, 0)
    for rank in sorted(streams):
        events.append({"ph": "M", "pid": rank, "name": "process_name", "args": {"name": _rank_name(result, rank)}})
        events.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
        names = sorted(streams[rank], key=lambda n: (n != "compute", n))
        for tid, name in enumerate(names):
            streams[rank][name] = tid
            events.append({"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": name}})
    yield from events
    for s in spans:
        args = {"op_id": s.op_id, "bytes": s.bytes, "flops": s.flops, "microbatch": s.microbatch, "stage": s.stage}
        if s.kind != "compute":
            args["wait_us"] = round((s.xfer_s - s.start_s) * 1e6, 6)
        yield {"ph": "X", "pid": s.rank, "tid": streams[s.rank][s.stream], "name": s.name,
               "cat": s.category or s.kind, "ts": round(s.start_s * 1e6, 6),
               "dur": round((s.end_s - s.start_s) * 1e6, 6), "args": args}
    yield from link_counters(result, pid=max(streams, default=0) + 1)
    yield from fault_events(result, pid=max(streams, default=0) + 2)


def _job_events(result: Result) -> list[dict]:
    events, lanes = _job_lanes(result)
    for s in by_rank(result.spans):
        args = {"op_id": s.op_id, "bytes": s.bytes, "flops": s.flops, "microbatch": s.microbatch, "stage": s.stage}
        if s.kind != "compute":
            args["wait_us"] = round((s.xfer_s - s.start_s) * 1e6, 6)
        pid, tid = lanes[(s.rank, s.stream)]
        events.append({"ph": "X", "pid": pid, "tid": tid, "name": s.name, "cat": s.category or s.kind,
                       "ts": round(s.start_s * 1e6, 6), "dur": round((s.end_s - s.start_s) * 1e6, 6), "args": args})
    events.extend(link_counters(result, pid=len(result.jobs)))
    events.extend(fault_events(result, pid=len(result.jobs) + 1))
    return events
def fault_events(result: Result, pid: int) -> list[dict]:
    """The timed link faults: one thread per fault, a span while it lasts and an instant when it begins."""
    if not result.faults:
        return []
    end = max((s.end_s for s in result.spans), default=0.0)
    out: list[dict] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "faults"}}]
    for tid, f in enumerate(result.faults):
        stop = f.until_s if f.until_s is not None else max(end, f.at_s)
        args = {"flows_rerouted": f.rerouted, "flows_stalled": f.stalled}
        out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": f.label}})
        out.append({"ph": "i", "pid": pid, "tid": tid, "s": "g", "name": f.label, "ts": round(f.at_s * 1e6, 6),
                    "args": args})
        out.append({"ph": "X", "pid": pid, "tid": tid, "name": f.label, "cat": "fault",
                    "ts": round(f.at_s * 1e6, 6), "dur": round((stop - f.at_s) * 1e6, 6), "args": args})
    return out


def link_counters(result: Result, pid: int) -> list[dict]:
    if not result.link_series:
        return []
    volume = result.link_bytes
    busiest = sorted(result.link_series, key=lambda l: (-volume[l] if l < len(volume) else 0.0, l))[:TOP_LINKS]
    out = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "fabric links (GB/s)"}}]
    for link in sorted(busiest):
        u, v = result.topology.links[link]
        name = f"{u}->{v}"
        for t, load in result.link_series[link]:
            out.append({"ph": "C", "pid": pid, "name": name, "ts": round(t * 1e6, 6),
                        "args": {"GB/s": round(load / 1e9, 6)}})
    return out


def write_perfetto(path: str, result: Result) -> None:
    head = {"displayTimeUnit": "ms", "otherData": {"scenario": result.scenario.name}}
    write_atomic(path, lambda fh: write_trace(fh, head, iter_events(result)))


def write_trace(fh: IO[str], head: dict, events: Iterable[dict], chunk: int = 4096) -> None:
    """Write ``{**head, "traceEvents": [*events]}`` as compact JSON, the bytes ``json.dump`` would
    write, ``chunk`` events at a time. ``json.dump`` encodes in pure Python (only ``json.dumps``
    takes the C encoder): a 1.8M-span trace took 130 s that way, and held every event at once."""
    fh.write(json.dumps(head, separators=(",", ":"))[:-1] + ',"traceEvents":[')
    first = True
    batch: list[dict] = []
    for e in events:
        batch.append(e)
        if len(batch) == chunk:
            fh.write(("" if first else ",") + json.dumps(batch, separators=(",", ":"))[1:-1])
            first, batch = False, []
    if batch:
        fh.write(("" if first else ",") + json.dumps(batch, separators=(",", ":"))[1:-1])
    fh.write("]}")

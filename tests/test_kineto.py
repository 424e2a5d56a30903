"""Tests of emulator/importers/kineto.py: Kineto (PyTorch profiler) traces into a Program."""
from __future__ import annotations

import gzip
import json
import os

import pytest

from emulator.errors import EmulatorError
from emulator.importers.kineto import TraceError, load_kineto
from emulator.program import COLLECTIVE
from emulator.run import simulation
from emulator.scenario import load_scenario_text

HERE = os.path.dirname(__file__)
DATA = os.path.join(HERE, "data", "kineto")
REPO = os.path.dirname(HERE)
REAL = os.path.join(REPO, "..", "shared", "traces", "kineto")
DLRM = os.path.join(REAL, "dlrm-8rank-v100")
RESNET = os.path.join(REAL, "resnet-ddp-a100")
needs_real = pytest.mark.skipif(not os.path.isdir(REAL), reason="the real traces ../shared/traces/kineto are absent")

US = 1e-6


# ----------------------------------------------------------------------------- a hand-made trace


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 9, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _launch(ts, corr, name="cudaLaunchKernel", tid=1):
    return _x("cuda_runtime", name, ts, 5 if name == "cudaLaunchKernel" else 1, tid, correlation=corr)


def _kernel(name, ts, dur, stream, corr, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": dict(stream=stream, correlation=corr, **args)}


def hand_trace(world: int = 2, rank: int = 0) -> dict:
    """ProfilerStep#3 (t = 1000..1200 us) with a GEMM, a bf16 all-reduce, a sync and a broadcast.

    #2 and #4 are incomplete (a launch whose kernel is missing), so #3 is the default.
    """
    ev = [
        _x("user_annotation", "ProfilerStep#2", 800, 150), _launch(810, 90),
        _x("user_annotation", "ProfilerStep#3", 1000, 200),
        _x("cpu_op", "aten::mm", 1010, 20, **{"Input Dims": [[64, 128], [128, 256]], "Input type": ["float", "float"]}),
        _launch(1015, 1), _kernel("volta_sgemm_128x64_nn", 1030, 40, 7, 1),
        _x("cuda_runtime", "cudaStreamWaitEvent", 1040, 1),
        _x("cpu_op", "record_param_comms", 1044, 22),
        _x("user_annotation", "nccl:all_reduce", 1045, 20, **{"Input Dims": [[1000]], "Input type": ["c10::BFloat16"]}),
        _launch(1050, 2), _kernel("ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclDevComm*)", 1070, 30, 20, 2),
        _launch(1060, 3), _kernel("void relu_kernel<float>(float*)", 1071, 10, 7, 3),
        _x("cuda_runtime", "cudaStreamSynchronize", 1090, 20),
        _x("cuda_runtime", "cudaStreamWaitEvent", 1115, 1),
        _x("user_annotation", "Optimizer.step#SGD.step", 1118, 4),
        _launch(1120, 4), _kernel("add_kernel", 1125, 5, 7, 4),
        _x("cuda_runtime", "cudaStreamWaitEvent", 1121, 1),
        _launch(1122, 5), _kernel("ncclKernel_Broadcast_RING_LL_Sum_float", 1126, 10, 20, 5, **{
            "Collective name": "broadcast", "In msg nelems": 10, "Out msg nelems": 10, "Group size": 2,
            "dtype": "Float", "Process Group Ranks": "[0, 1]"}),
        _x("user_annotation", "ProfilerStep#4", 1300, 100), _launch(1310, 91),
    ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": ev}


def _write(tmp_path, data, name="rank0.json", gz=False):
    p = tmp_path / (name + (".gz" if gz else ""))
    if gz:
        with gzip.open(p, "wt") as f:
            json.dump(data, f)
    else:
        p.write_text(json.dumps(data))
    return str(p)


def test_hand_trace_ops_deps_and_host_lane(tmp_path):
    prog = load_kineto(_write(tmp_path, hand_trace(), gz=True), mirror=2)
    assert prog.ranks == 2 and len(prog.ops) == 22  # 11 ops per rank, rank 1 a copy of rank 0
    r0 = [op for op in prog.ops if op.rank == 0]
    kinds = [(op.stream, op.kind.label) for op in r0]
    assert kinds == [("cpu", "compute"), ("cuda:7", "compute"), ("cpu", "compute"), ("cuda:20", "collective"),
                     ("cpu", "compute"), ("cuda:7", "compute"), ("cpu", "compute"), ("cpu", "compute"),
                     ("cuda:7", "compute"), ("cpu", "compute"), ("cuda:20", "collective")]
    a, gemm, b, ar, c, relu, d, e, add, f, bc = r0
    # host lane: 1000->1015 (15 us), 1015->1050 (35), 1050->1060 (10), 1060->sync at 1090 (30),
    # sync returns at 1110, then 1110->1120 (10) and 1120->1122 (2)
    assert [round(op.duration / US, 6) for op in (a, b, c, d, e, f)] == [15, 35, 10, 30, 10, 2]
    assert gemm.duration == pytest.approx(40 * US) and gemm.deps == (a.id,) and gemm.category == "fwd"
    # the wait at 1040 precedes the all-reduce launch; the GEMM on stream 7 ended at 1070 = its start
    assert ar.deps == (b.id, gemm.id)
    assert ar.collective == "all_reduce" and ar.bytes == 2000  # 1000 bf16 elements x 2 B
    assert ar.group == (0, 1) and ar.duration is None
    assert relu.deps == (c.id,)  # no wait before it
    # the sync returned at 1110, just after the all-reduce ended (1100): the host waits on it
    assert e.deps == (ar.id,) and d.deps == ()
    # wait at 1115 then 'add' on stream 7 at 1125: the all-reduce (stream 20) ended at 1100
    assert add.deps == (e.id, ar.id) and add.category == "optimizer"
    # wait at 1121 then the broadcast starts at 1126, before 'add' ends (1130): no dependency
    assert bc.deps == (f.id,)
    assert bc.collective == "broadcast" and bc.bytes == 40  # 10 floats x 4 B
    r1 = [op for op in prog.ops if op.rank == 1]
    assert r1[3].deps == (r1[2].id, r1[1].id) and r1[3].group == (0, 1)


def test_hand_trace_measured_meta(tmp_path):
    prog = load_kineto(_write(tmp_path, hand_trace()), mirror=2)
    m = prog.meta.measured
    assert m["iteration"] == 3 and m["shared_clock"] is False
    r0 = m["ranks"][0]
    # GPU ops from 1030 (GEMM start) to 1136 (broadcast end): 106 us; step starts at 1000
    assert r0["span_s"] == pytest.approx(106 * US)
    assert r0["start_s"] == pytest.approx(30 * US) and r0["cpu_step_s"] == pytest.approx(200 * US)
    colls = [(c["collective"], c["bytes"], round(c["duration_s"] / US, 6), c["own_s"]) for c in r0["collectives"]]
    assert colls == [("all_reduce", 2000.0, 30, None), ("broadcast", 40.0, 10, None)]


def test_iteration_choice(tmp_path):
    path = _write(tmp_path, hand_trace())
    with pytest.raises(TraceError, match=r"rank0.json: no ProfilerStep#7 \(steps in the file: #2, #3, #4\)"):
        load_kineto(path, mirror=2, iteration=7)
    with pytest.raises(TraceError, match="rank0.json: the chosen step launches no GPU work"):
        load_kineto(path, mirror=2, iteration=2)  # its one launch has no kernel in the trace


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a JSON trace"),
    (json.dumps({"schemaVersion": 1}), "no 'traceEvents' list"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {}}]}),
     "GPU event 'k' at ts 1 has no 'stream' arg"),
    (json.dumps({"distributedInfo": {"rank": "zero"}, "traceEvents": []}), "distributedInfo.rank is 'zero'"),
])
def test_malformed_files(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TraceError, match=message) as err:
        load_kineto(str(p))
    assert str(p) in str(err.value) and isinstance(err.value, EmulatorError)


def test_rank_set_errors(tmp_path):
    one = _write(tmp_path, hand_trace(world=2))
    with pytest.raises(TraceError, match="world_size is 2 but there are 1 rank files; use mirror=2"):
        load_kineto(one)
    d = tmp_path / "two"
    d.mkdir()
    _write(d, hand_trace(world=2, rank=0), "a.json")
    _write(d, hand_trace(world=2, rank=0), "b.json")
    with pytest.raises(TraceError, match="rank 0 appears twice"):
        load_kineto(str(d))
    with pytest.raises(TraceError, match="missing: file not found"):
        load_kineto(str(tmp_path / "missing"))


# ----------------------------------------------------------------------------- cut of real traces


def test_dlrm_cut_first_all_to_all():
    """Ranks 0 and 1 of DLRM around their first all-to-all (tests/data/kineto/dlrm-2rank)."""
    prog = load_kineto(os.path.join(DATA, "dlrm-2rank"))
    m = prog.meta.measured
    assert prog.ranks == 2 and m["shared_clock"] is True
    c0, c1 = (r["collectives"][0] for r in m["ranks"])
    # SendRecv kernel under nccl:all_to_all with Input Dims [[6144]] float: 6144 x 4 = 24576 B
    assert (c0["collective"], c0["bytes"], c0["group"]) == ("all_to_all", 24576.0, [0, 1])
    # rank 1 arrives first; both kernels end together. Own cost = end - last arrival (rank 0):
    # rank 0's kernel, 2146 us, is all own cost; rank 1 waited 7635 - 2146 = 5489 us.
    assert c0["duration_s"] == pytest.approx(2146 * US) and c1["duration_s"] == pytest.approx(7635 * US)
    assert c0["own_s"] == pytest.approx(2146 * US, abs=1 * US) and c0["wait_s"] == 0
    assert c1["wait_s"] == pytest.approx(5489 * US, abs=1 * US)
    # rank 1's step started 5489 us earlier: rank 0's host lane opens with that skew
    first0 = next(op for op in prog.ops if op.rank == 0)
    assert first0.stream == "cpu" and first0.duration > 5.4e-3


def test_resnet_cut_modern_nccl_args():
    prog = load_kineto(os.path.join(DATA, "resnet-allreduce.json"), mirror=4)
    colls = [op for op in prog.ops if op.kind is COLLECTIVE and op.rank == 0]
    # 'In msg nelems' 2049000 floats, widened from the 2-rank group to 4 mirrored ranks
    assert [(c.collective, c.bytes, c.group) for c in colls] == [("all_reduce", 8196000.0, (0, 1, 2, 3))]
    assert prog.ranks == 4 and len(prog.ops) == 4 * len([op for op in prog.ops if op.rank == 0])


# ----------------------------------------------------------------------------- whole real traces


@needs_real
def test_dlrm_real_measured_spans():
    prog = load_kineto(DLRM)
    m = prog.meta.measured
    assert prog.ranks == 8 and m["iteration"] == 10 and m["shared_clock"]
    # README of ../shared/traces/kineto: GPU span per rank of ProfilerStep#10, in ms
    readme = [13.009, 18.467, 11.350, 17.511, 16.589, 16.392, 11.410, 10.967]
    assert [round(r["span_s"] * 1e3, 3) for r in m["ranks"]] == pytest.approx(readme, abs=0.0011)
    for r in m["ranks"]:
        kinds = [c["collective"] for c in r["collectives"]]
        assert kinds.count("all_to_all") == 5 and kinds.count("all_reduce") == 3
    # the k-th collective ends together on every rank: own costs are small, waits are large
    first = [r["collectives"][0] for r in m["ranks"]]
    assert max(c["own_s"] for c in first) < 20 * US
    assert max(c["wait_s"] for c in first) > 7e-3  # the README's "up to 7.6 ms"


@needs_real
def test_resnet_real_steps():
    spans = {}
    for it in (4, 5, 6):
        prog = load_kineto(os.path.join(RESNET, "rank0.json.gz"), mirror=2, iteration=it)
        spans[it] = prog.meta.measured["ranks"][0]["span_s"] * 1e3
    assert spans == pytest.approx({4: 215.77, 5: 213.53, 6: 218.76}, abs=0.01)  # README, ms
    prog = load_kineto(RESNET, mirror=2)
    assert prog.meta.measured["iteration"] == 6  # the last complete step
    colls = [op for op in prog.ops if op.kind is COLLECTIVE and op.rank == 0]
    ar = [c for c in colls if c.collective == "all_reduce"]
    assert len(ar) == 5 and len(colls) == 7
    # 2049000 + 7875584 + 6563840 + 6637568 + 2431040 = 25557032 floats ("about 25.6M")
    assert sum(c.bytes for c in ar) == 25557032 * 4


def _list_schedule(prog, cost):
    """Reference replay: start = max(deps, stream predecessor); collectives end at
    (last member's arrival + cost(op)). Returns {op id: (start, end)}."""
    prev, last = {}, {}
    for op in prog.ops:
        prev[op.id] = last.get((op.rank, op.stream))
        last[(op.rank, op.stream)] = op.id
    count, members = {}, {}
    for op in prog.ops:
        if op.kind is COLLECTIVE:
            k = count.get((op.rank, op.group), 0)
            count[(op.rank, op.group)] = k + 1
            members.setdefault((op.group, k), []).append(op)
    key = {op.id: k for k, ops in members.items() for op in ops}
    ready, times, pending = {}, {}, list(prog.ops)
    while pending:
        rest = []
        for op in pending:
            need = list(op.deps) + ([prev[op.id]] if prev[op.id] is not None else [])
            if not all(d in times for d in need):
                rest.append(op)
                continue
            ready[op.id] = max((times[d][1] for d in need), default=0.0)
            if op.kind is not COLLECTIVE:
                times[op.id] = (ready[op.id], ready[op.id] + (op.duration or 0.0))
            elif all(o.id in ready for o in members[key[op.id]]):
                t = max(ready[o.id] for o in members[key[op.id]])
                for o in members[key[op.id]]:
                    times[o.id] = (ready[o.id], t + cost(o))
            else:
                rest.append(op)
        rest = [op for op in rest if op.id not in times]
        assert len(rest) < len(pending), "the imported DAG deadlocks"
        pending = rest
    return times


@needs_real
def test_dlrm_dag_reproduces_measured_ends():
    """The imported DAG, with each collective costing its measured own cost, gives back the
    measured end of every rank: the waits emerge from the rendezvous."""
    prog = load_kineto(DLRM)
    own = {c["op_id"]: c["own_s"] for r in prog.meta.measured["ranks"] for c in r["collectives"]}
    times = _list_schedule(prog, lambda op: own[op.id])
    for r in prog.meta.measured["ranks"]:
        gpu = [times[op.id] for op in prog.ops if op.rank == r["rank"] and op.stream != "cpu"]
        assert max(t[1] for t in gpu) == pytest.approx(r["end_s"], abs=150 * US)  # measured: 0.07-0.1 ms off
        assert min(t[0] for t in gpu) == pytest.approx(r["start_s"], abs=20 * US)  # the launch latency


@needs_real
def test_resnet_dag_reproduces_measured_span():
    prog = load_kineto(RESNET, mirror=2)
    meas = {c["op_id"]: c["duration_s"] for r in prog.meta.measured["ranks"] for c in r["collectives"]}
    times = _list_schedule(prog, lambda op: meas[op.id])
    gpu = [times[op.id] for op in prog.ops if op.rank == 0 and op.stream != "cpu"]
    span = max(t[1] for t in gpu) - min(t[0] for t in gpu)
    assert span == pytest.approx(prog.meta.measured["ranks"][0]["span_s"], rel=0.005)


# ----------------------------------------------------------------------------- replay on the engine

def _scenario(text: str):
    return load_scenario_text(text)


def _gpu_end(result, rank: int) -> float:
    return max(s.end_s for s in result.spans if s.rank == rank and s.stream != "cpu")


@needs_real
def test_replay_dlrm_on_dgx_v100():
    """8-rank DLRM on an 8xV100 node: each rank ends where it was measured (all ranks end within
    0.1 ms of each other there), and each rank waits in its collectives as measured."""
    prog = load_kineto(DLRM)
    result = simulation.run_program(prog, _scenario("name: dlrm\ncluster: {nodes: 1, node: dgx-v100}\n"))
    measured = prog.meta.measured
    last_end = max(_gpu_end(result, r) for r in range(8))
    assert last_end == pytest.approx(max(r["end_s"] for r in measured["ranks"]), rel=0.10)
    for r in measured["ranks"]:
        comm = [s for s in result.spans if s.rank == r["rank"] and s.kind == "collective"]
        wait = sum(s.xfer_s - s.start_s for s in comm)
        meas_wait = sum(c["wait_s"] for c in r["collectives"])
        # the pattern: rank 1 waits 11.1 ms in all, rank 7 1.5 ms; each within 0.5 ms
        assert wait == pytest.approx(meas_wait, abs=0.5e-3)
    waits = [sum(c["wait_s"] for c in r["collectives"]) for r in measured["ranks"]]
    assert max(waits) > 11e-3 and min(waits) < 2e-3  # a real spread, so the check above can fail


@needs_real
def test_replay_resnet_mirrored_on_a100():
    prog = load_kineto(RESNET, mirror=2)
    result = simulation.run_program(prog, _scenario("name: resnet\ncluster: {nodes: 1, node: dgx-a100}\n"))
    spans = [s for s in result.spans if s.rank == 0 and s.stream != "cpu"]
    span = max(s.end_s for s in spans) - min(s.start_s for s in spans)
    assert span == pytest.approx(prog.meta.measured["ranks"][0]["span_s"], rel=0.05)  # 218.76 ms


def _exposed_trace() -> dict:
    """Kernel A (100 us), then an all-reduce of 25M floats on stream 20 after A, a kernel C (300 us)
    that overlaps it, and kernel B that waits for the all-reduce."""
    ev = [
        _x("user_annotation", "ProfilerStep#1", 0, 5000),
        _launch(10, 1), _kernel("A", 20, 100, 7, 1),
        _x("cuda_runtime", "cudaStreamWaitEvent", 30, 1),
        _launch(40, 2), _kernel("ncclKernel_AllReduce", 120, 900, 20, 2, **{
            "Collective name": "allreduce", "In msg nelems": 25_000_000, "Out msg nelems": 25_000_000,
            "Group size": 2, "dtype": "Float", "Process Group Ranks": "[0, 1]"}),
        _launch(50, 3), _kernel("C", 120, 300, 7, 3),
        _x("cuda_runtime", "cudaStreamWaitEvent", 60, 1),
        _launch(70, 4), _kernel("B", 1020, 50, 7, 4),
    ]
    return {"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": ev}


def _graph(tmp_path, bandwidth: float) -> str:
    g = {"nodes": [{"id": "g0", "kind": "gpu"}, {"id": "g1", "kind": "gpu"}, {"id": "sw", "kind": "switch"}],
         "links": [{"src": a, "dst": b, "bandwidth": bandwidth, "latency": 1e-6}
                   for a, b in (("g0", "sw"), ("sw", "g0"), ("g1", "sw"), ("sw", "g1"))]}
    p = tmp_path / f"graph-{bandwidth:.0f}.json"
    p.write_text(json.dumps(g))
    return str(p)


def test_halving_bandwidth_lengthens_exactly_the_exposed_comm(tmp_path):
    prog = load_kineto(_write(tmp_path, _exposed_trace()), mirror=2)
    b_op = [op for op in prog.ops if op.rank == 0 and op.name == "B"][0]
    ar = [op for op in prog.ops if op.rank == 0 and op.kind is COLLECTIVE][0]
    assert ar.id in b_op.deps and ar.bytes == 100e6  # B waits for the all-reduce of 25M x 4 B
    ends = {}
    for bw in (100e9, 50e9):
        text = f"name: x\ncluster:\n  fabric: {{kind: custom, graph: {_graph(tmp_path, bw)}}}\n"
        result = simulation.run_program(prog, _scenario(text))
        spans = {s.op_id: s for s in result.spans}
        c_op = [op for op in prog.ops if op.rank == 0 and op.name == "C"][0]
        # C (300 us) ends before the all-reduce, so B starts when the all-reduce ends
        assert spans[c_op.id].end_s < spans[ar.id].end_s
        assert spans[b_op.id].start_s == pytest.approx(spans[ar.id].end_s, abs=1e-12)
        ends[bw] = (spans[ar.id].end_s - spans[ar.id].xfer_s, _gpu_end(result, 0))
    # ring all-reduce on 2 ranks moves 2(n-1)/n x S = S over each link: S/B = 100e6/100e9 = 1 ms,
    # 2 ms at half the bandwidth; everything else is unchanged, so the end moves by exactly 1 ms
    assert ends[50e9][0] - ends[100e9][0] == pytest.approx(1e-3, rel=1e-6)
    assert ends[50e9][1] - ends[100e9][1] == pytest.approx(1e-3, rel=1e-6)


def test_replay_report_on_the_exposed_case(tmp_path):
    from emulator.importers.replay_report import compare

    prog = load_kineto(_write(tmp_path, _exposed_trace()), mirror=2)
    text = f"name: x\ncluster:\n  fabric: {{kind: custom, graph: {_graph(tmp_path, 100e9)}}}\n"
    result = simulation.run_program(prog, _scenario(text))
    rows = compare(prog, result)
    assert [r["rank"] for r in rows] == [0, 1]
    r0 = rows[0]
    # measured: A starts at 20 us, B ends at 1070 us: span 1050 us, end 1070 us (step starts at 0)
    assert r0["measured_span_s"] == pytest.approx(1050e-6) and r0["measured_end_s"] == pytest.approx(1070e-6)
    assert r0["measured_wait_s"] is None  # one rank mirrored: no clock shared with a peer
    # emulated: both mirrored ranks arrive together, so no wait; the span is A + all-reduce + B
    # (the launch lane delays A to 10 us, B waits on the all-reduce), all from the same spans
    spans = {s.op_id: s for s in result.spans if s.rank == 0}
    gpu = [s for s in spans.values() if s.stream != "cpu"]
    assert r0["emulated_wait_s"] == pytest.approx(0.0, abs=1e-12)
    assert r0["emulated_span_s"] == pytest.approx(max(s.end_s for s in gpu) - min(s.start_s for s in gpu))
    assert r0["span_error"] == pytest.approx((r0["emulated_span_s"] - 1050e-6) / 1050e-6)

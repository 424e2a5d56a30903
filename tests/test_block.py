"""Block ops: a unit's ops run as one op where only its start decides their times (block.py,
engine.py, Op.parts), and give exactly the run of its ops one by one."""
import os

import pytest
from helpers import custom_scenario, star

from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Fold, Op, Part, Program
from emulator.run.block import offsets
from emulator.run.engine import BLOCK, Engine
from emulator.run.simulation import build_cluster, build_workload, run_program
from emulator.scenario import load_scenario, load_scenario_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_offsets_follow_deps_and_streams():
    # a (1 s) → b: collective on tp after a (2 s) → c after b (3 s) → x: collective on tp after c
    # (0.5 s), overlapped by y (4 s, waits only for c, the compute before it) → z waits for x and y.
    # a [0, 1]; b [1, 3]; c [3, 6]; x [6, 6.5]; y [6, 10]; z from max(6.5, 10) = 10 to 11.
    parts = [Part(COMPUTE, "compute", "a", 1.0, 0.0, 0.0, "fwd"),
             Part(COLLECTIVE, "tp", "b", None, 0.0, 1.0, "comm", "all_reduce", (0, 1), (0,)),
             Part(COMPUTE, "compute", "c", 3.0, 0.0, 0.0, "fwd", deps=(1,)),
             Part(COLLECTIVE, "tp", "x", None, 0.0, 1.0, "comm", "all_reduce", (0, 1), (2,)),
             Part(COMPUTE, "compute", "y", 4.0, 0.0, 0.0, "fwd"),
             Part(COMPUTE, "compute", "z", 1.0, 0.0, 0.0, "fwd", deps=(3,))]
    starts, ends = offsets(parts, [1.0, 2.0, 3.0, 0.5, 4.0, 1.0])
    assert starts == (0.0, 1.0, 3.0, 6.0, 6.0, 10.0)
    assert ends == (1.0, 3.0, 6.0, 6.5, 10.0, 11.0)


def _blocked(send: bool) -> tuple[Program, Fold]:
    # 4 GPUs on a grid (2, 2), the second axis folded: ranks 0 and 2 are simulated. Each runs one
    # block: 1 s of compute, an all-reduce of 1e9 B with its copy (group (0, 1) or (2, 3)), 1 s of
    # compute; its id is its last part's (2 and 5), its parts take ids 0-2 and 3-5. With ``send``
    # rank 0 then sends 1 MB to rank 2.
    fold = Fold((2, 2), (False, True))
    ops = []
    for last, r, g in ((2, 0, (0, 1)), (5, 2, (2, 3))):
        parts = (Part(COMPUTE, "compute", "a", 1.0, 0.0, 0.0, "fwd"),
                 Part(COLLECTIVE, "tp", "ar", None, 0.0, 1e9, "comm", "all_reduce", g, (0,)),
                 Part(COMPUTE, "compute", "b", 1.0, 0.0, 0.0, "fwd", deps=(1,)))
        ops.append(Op(last, r, COMPUTE, name=f"r{r}.", parts=parts))
    if send:
        ops += [Op(6, 0, SEND, stream="p2p", deps=(2,), peer=2, bytes=1e6, tag=1),
                Op(7, 2, RECV, stream="p2p", deps=(5,), peer=0, bytes=1e6, tag=1)]
    return Program(4, ops, fold), fold


@pytest.mark.parametrize("send, kept", [(False, True), (True, False)])
def test_a_block_runs_as_one_op_where_its_collective_is_private(tmp_path, send, kept):
    # The numbers of test_engine_timed's private collectives: a 2-rank ring all-reduce of 1e9 B on a
    # star of 50 GB/s and 1 us a link takes 2(n−1)·α + 2(n−1)/n·S/B = 2 × 2e-6 + 1e9/50e9 =
    # 0.020004 s; the iteration is 1 + 0.020004 + 1 = 2.020004 s. With the send its 1e6 B follow:
    # 2e-6 + 1e6/50e9 = 2.2e-5 s more, 2.020026 s; the send shares the groups' links, so their
    # all-reduces are not private and the blocks are opened (run op by op).
    sc = custom_scenario(star(tmp_path, 4, bw=50e9, lat=1e-6))
    program, fold = _blocked(send)
    program.validate()
    cluster = build_cluster(sc, fold)
    engine = Engine(program, cluster.collectives, cluster.topology.capacity, cluster.gpus(program.simulated_ranks()))
    assert (BLOCK in engine.kind) is kept
    spans, events = engine.run()
    end = max(engine.end)
    assert end == pytest.approx(2.020026 if send else 2.020004, rel=1e-12)
    # the spans are the parts': ids 0-2 on rank 0 (names r0.a, r0.ar, r0.b), at 0, 1 and 1.020004 s
    rows = [s for s in spans if s.rank == 0 and s.stream != "p2p"]
    assert [(s.op_id, s.name, s.kind) for s in rows] == [(0, "r0.a", "compute"), (1, "r0.ar", "collective"),
                                                         (2, "r0.b", "compute")]
    assert [s.start_s for s in rows] == pytest.approx([0.0, 1.0, 1.020004], rel=1e-12)
    assert rows[1].xfer_s == pytest.approx(1.0, rel=1e-12)
    if not send:
        assert events == 0  # nothing waited for the clock
        # the all-reduce moved its bytes as when run op by op (its group's links, each a link
        # compression keeps: 2 ring steps × (n−1)/n·S = 2 × 5e8 = 1e9 B on each)
        opened = Engine(program.expanded(), cluster.collectives, cluster.topology.capacity,
                        cluster.gpus(program.simulated_ranks()))
        opened.run()
        assert BLOCK not in opened.kind and max(opened.end) == end
        assert engine.fabric.bytes_on_link == opened.fabric.bytes_on_link
        assert max(engine.fabric.bytes_on_link) == pytest.approx(1e9, rel=1e-12)


def test_validate_names_a_bad_block():
    bad = (Part(COMPUTE, "compute", "a", 1.0, 0.0, 0.0, "fwd"), Part(SEND, "p2p", "s", None, 0.0, 1.0, "comm"),
           Part(COMPUTE, "compute", "b", 1.0, 0.0, 0.0, "fwd"))
    with pytest.raises(ValueError, match="op 2: part 1 is a send"):
        Program(1, [Op(2, 0, COMPUTE, parts=bad)]).validate()
    late = (Part(COMPUTE, "compute", "a", 1.0, 0.0, 0.0, "fwd", deps=(1,)),
            Part(COMPUTE, "compute", "b", 1.0, 0.0, 0.0, "fwd"))
    with pytest.raises(ValueError, match="op 1: part 0 depends on a part that is not before it"):
        Program(1, [Op(1, 0, COMPUTE, parts=late)]).validate()


CP_MOE = """name: cpmoe
cluster: {nodes: 2, node: dgx-h100}
model: {layers: 4, hidden: 2048, heads: 16, ffn_hidden: 4096, seq_len: 8192, vocab: 32000, experts: 8, top_k: 2}
training: {global_batch: 16, micro_batch: 1, recompute: selective}
parallel: {tp: 2, pp: 2, cp: 2, ep: 2, dp: 2, sequence_parallel: true, schedule: interleaved-1f1b, virtual_stages: 2}
"""


def _scenarios():
    return [("quickstart", load_scenario(os.path.join(ROOT, "scenarios", "quickstart.yaml"))),
            ("gpt3-1024", load_scenario(os.path.join(ROOT, "scenarios", "gpt3-175b-1024-a100.yaml"),
                                        ["training.global_batch=256"])),
            ("mixtral", load_scenario(os.path.join(ROOT, "scenarios", "mixtral-8x7b-moe-32-h100.yaml"))),
            ("cp-moe", load_scenario_text(CP_MOE, "cpmoe.yaml")),
            ("two-iterations", load_scenario(os.path.join(ROOT, "scenarios", "quickstart.yaml"),
                                             ["simulation.iterations=2"]))]


@pytest.mark.parametrize("name, sc", _scenarios(), ids=lambda x: x if isinstance(x, str) else "")
def test_blocks_expand_to_the_ops_built_one_by_one(name, sc):
    plain, _ = build_workload(sc)
    blocked, _ = build_workload(sc, blocks=True)
    assert any(op.parts for op in blocked.ops) and len(blocked.ops) < len(plain.ops)
    opened = blocked.expanded().ops
    assert opened == plain.ops  # every field of every op, ids and deps included
    assert [op.costed for op in opened] == [op.costed for op in plain.ops]
    assert len(opened) == sum(len(op.parts) or 1 for op in blocked.ops)


@pytest.mark.parametrize("name, sc", _scenarios(), ids=lambda x: x if isinstance(x, str) else "")
def test_blocked_runs_equal_the_runs_op_by_op(name, sc):
    plain, _ = build_workload(sc)
    blocked, _ = build_workload(sc, blocks=True)
    a, b = run_program(plain, sc), run_program(blocked, sc)
    # the same spans (ids, names, ranks, streams), at the same times but for rounding: a block's part
    # ends at the block's start plus a sum taken from 0, an op at its own start plus its duration
    T = a.iteration_time_s
    assert b.iteration_time_s == pytest.approx(T, rel=1e-12)
    sa, sb = list(a.spans), list(b.spans)
    assert [(s.op_id, s.rank, s.stream, s.name, s.kind, s.bytes) for s in sa] == \
           [(s.op_id, s.rank, s.stream, s.name, s.kind, s.bytes) for s in sb]
    assert max(abs(x.start_s - y.start_s) + abs(x.end_s - y.end_s) + abs(x.xfer_s - y.xfer_s)
               for x, y in zip(sa, sb)) <= 1e-12 * T
    assert b.link_bytes == pytest.approx(a.link_bytes, rel=1e-12)


def test_blocks_open_where_a_gpu_slows_under_communication_or_a_fault_is_timed():
    # comm_overlap_slowdown 2 makes a kernel's time depend on what else runs, and a link fault timed
    # mid-run changes a collective's time: the blocks are opened, and the run is the one op by op
    # (the programs are built without the fault, which would turn folding, and so blocks, off).
    base = os.path.join(ROOT, "scenarios", "quickstart.yaml")
    two = ["cluster.nodes=2", "parallel.dp=4", "cluster.fabric.kind=fat_tree"]
    fault = "cluster.overrides=[{kind: link_degrade, target: 'nic0.0<->leaf0', factor: 0.25, at: 0.001 s}]"
    for build, run in ((["cluster.node.gpu.comm_overlap_slowdown=2"], []), (two, [fault])):
        sc = load_scenario(base, build)
        plain, _ = build_workload(sc)
        blocked, _ = build_workload(sc, blocks=True)
        assert any(op.parts for op in blocked.ops)
        on = load_scenario(base, build + run)
        assert run_program(blocked, on).iteration_time_s == run_program(plain, on).iteration_time_s

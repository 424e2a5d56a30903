"""Tests of emulator/importers/chakra.py: Chakra .et export and import."""
from __future__ import annotations

import os

import pytest

from emulator.importers.native import TraceError
from emulator.meta import ProgramMeta
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Fold, Op, Program
from emulator.scenario import load_scenario_text
from emulator.workload.builder import build_program

pytest.importorskip("chakra.schema.protobuf.et_def_pb2",
                    reason="the optional extra mlc-chakra is not installed (pip install mlc-chakra)")

from emulator.importers.chakra import export_chakra, load_chakra  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data", "kineto")


def two_rank_program() -> Program:
    """Every op kind, two streams, a dependency across ranks, a fold and meta."""
    ops = [
        Op(0, 0, COMPUTE, "compute", (), "fwd0", flops=2.5e12, bytes=1.5e9, category="fwd", microbatch=0,
           stage=0, layer=3),
        Op(1, 1, COMPUTE, "compute", (), "fwd1", duration=1.25e-4, category="fwd", microbatch=0, stage=1),
        Op(2, 0, SEND, "pp", (0,), "send", bytes=4194304.0, peer=1, tag=7, microbatch=0),
        Op(3, 1, RECV, "pp", (), "recv", bytes=4194304.0, peer=0, tag=7, microbatch=0),
        Op(4, 1, COMPUTE, "compute", (3, 0), "bwd1", flops=1e12, category="bwd"),
        Op(5, 0, COLLECTIVE, "dp", (0,), "grads", bytes=1e8 / 3, collective="all_reduce", group=(0, 1)),
        Op(6, 1, COLLECTIVE, "dp", (4,), "grads", bytes=1e8 / 3, collective="all_reduce", group=(0, 1)),
        Op(7, 0, COLLECTIVE, "dp", (), "bcast", bytes=12.0, collective="broadcast", group=(0, 1), root=1),
        Op(8, 1, COLLECTIVE, "dp", (), "bcast", bytes=12.0, collective="broadcast", group=(0, 1), root=1),
        Op(9, 0, COMPUTE, "cpu", (5,), "host", duration=0.0, category="host"),
    ]
    return Program(ranks=4, ops=ops, fold=Fold((2, 2), (True, False)), meta=ProgramMeta.from_dict({"model_flops": 1.5e15}))


def by_rank(p: Program) -> dict[int, list[Op]]:
    out: dict[int, list[Op]] = {}
    for op in p.ops:
        out.setdefault(op.rank, []).append(op)
    return out


def test_round_trip_is_identical(tmp_path):
    p = two_rank_program()
    paths = export_chakra(p, str(tmp_path / "et"))
    assert [os.path.basename(x) for x in paths] == ["chakra.0.et", "chakra.1.et", "comm_group.json"]
    q = load_chakra(str(tmp_path / "et"))
    # same ops (every field, including float sizes like 1e8/3 and the op order), fold, ranks, meta
    assert q.ops == p.ops and q.ranks == 4 and q.fold == p.fold and q.meta == p.meta


def test_round_trip_of_an_imported_kineto_trace(tmp_path):
    from emulator.importers.kineto import load_kineto

    p = load_kineto(os.path.join(DATA, "dlrm-2rank"))
    export_chakra(p, str(tmp_path))
    q = load_chakra(str(tmp_path))
    assert by_rank(q) == by_rank(p) and q.meta == p.meta


def test_round_trip_of_a_generated_workload(tmp_path):
    s = load_scenario_text("name: x\ncluster: {nodes: 1, node: dgx-a100}\n"
                           "model: {layers: 4, hidden: 1024, heads: 16, seq_len: 512, vocab: 32000}\n"
                           "training: {global_batch: 16, micro_batch: 2}\nparallel: {tp: 2, pp: 2, dp: 2}\n")
    p = build_program(s, None)
    export_chakra(p, str(tmp_path))
    q = load_chakra(str(tmp_path))
    assert by_rank(q) == by_rank(p)


def test_exported_nodes_follow_the_chakra_schema(tmp_path):
    from chakra.schema.protobuf import et_def_pb2 as pb

    from emulator.importers.chakra import read_msgs

    export_chakra(two_rank_program(), str(tmp_path))
    msgs = read_msgs(str(tmp_path / "chakra.0.et"))
    nodes = []
    for raw in msgs[1:]:
        n = pb.Node()
        n.ParseFromString(raw)
        nodes.append(n)
    assert [pb.NodeType.Name(n.type) for n in nodes] == ["COMP_NODE", "COMM_SEND_NODE", "COMM_COLL_NODE",
                                                         "COMM_COLL_NODE", "COMP_NODE"]
    attrs = {a.name: a for a in nodes[2].attr}
    assert attrs["comm_type"].int64_val == pb.ALL_REDUCE and attrs["comm_size"].int64_val == 33333333
    # the second collective on stream "dp" follows the first: a control dependency on it
    assert list(nodes[3].ctrl_deps) == [5] and list(nodes[1].data_deps) == [0]
    comp = {a.name: a for a in nodes[0].attr}
    assert comp["num_ops"].int64_val == 2_500_000_000_000 and comp["tensor_size"].uint64_val == 1_500_000_000


def test_foreign_file_gets_streams_and_new_ids(tmp_path):
    """A file written by another tool: no emu_* attributes, ids from 0 in every file."""
    from chakra.schema.protobuf import et_def_pb2 as pb

    from emulator.importers.chakra import write_msg

    for rank in (0, 1):
        with open(tmp_path / f"w.{rank}.et", "wb") as f:
            write_msg(f, pb.GlobalMetadata(version="0.0.4"))
            comm = pb.Node(id=1, name="ar", type=pb.COMM_COLL_NODE, data_deps=[0])
            comm.attr.add(name="comm_type", int64_val=pb.ALL_REDUCE)
            comm.attr.add(name="comm_size", int64_val=1 << 20)
            write_msg(f, comm)  # written before its dependency: the import sorts it after
            write_msg(f, pb.Node(id=0, name="mm", type=pb.COMP_NODE, duration_micros=250))
    p = load_chakra(str(tmp_path))
    assert [(op.id, op.rank, op.kind, op.stream, op.deps) for op in p.ops] == [
        (0, 0, COMPUTE, "compute", ()), (1, 0, COLLECTIVE, "comm", (0,)),
        (10**9, 1, COMPUTE, "compute", ()), (10**9 + 1, 1, COLLECTIVE, "comm", (10**9,))]
    assert p.ops[0].duration == pytest.approx(250e-6) and p.ops[1].group == (0, 1) and p.ops[1].bytes == 1 << 20


def test_bad_files(tmp_path):
    bad = tmp_path / "x.0.et"
    bad.write_bytes(b"\x85\x01abc")  # says 133 bytes follow, only 3 do
    with pytest.raises(TraceError, match=r"x\.0\.et: truncated Chakra file"):
        load_chakra(str(bad))
    bad.write_bytes(b"\x03\xff\xff\xff")
    with pytest.raises(TraceError, match=r"x\.0\.et: not a Chakra execution trace"):
        load_chakra(str(bad))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match=r"empty: no Chakra files"):
        load_chakra(str(tmp_path / "empty"))


def test_offloading_copies_are_memory_stores_and_loads(tmp_path):
    """Activation offloading's copies export as Chakra's MEM_STORE_NODE (d2h) and MEM_LOAD_NODE (h2d), and the file
    reads back to the same program, the copies on their streams."""
    from chakra.schema.protobuf import et_def_pb2 as pb

    from emulator.importers.chakra import read_msgs

    s = load_scenario_text("name: x\ncluster: {nodes: 1, node: dgx-h100}\n"
                           "model: {layers: 2, hidden: 1024, heads: 8, seq_len: 4096, vocab: 1024}\n"
                           "training: {global_batch: 8, micro_batch: 1, attention: flash, "
                           "fine_grained_activation_offloading: true, offload_modules: [core_attn, attn_proj]}\n"
                           "parallel: {tp: 1, pp: 1, dp: 8}\n")
    p = build_program(s, None)
    export_chakra(p, str(tmp_path))
    q = load_chakra(str(tmp_path))
    assert by_rank(q) == by_rank(p)
    copies = [op for op in q.ops if op.stream in ("d2h", "h2d") and op.rank == 0]
    # 2 layers, 1 micro-batch; the last layer's backward follows its forward at once, so it stays
    assert sorted(op.stream for op in copies) == ["d2h", "h2d"]
    types = []
    for raw in read_msgs(str(tmp_path / "chakra.0.et"))[1:]:
        n = pb.Node()
        n.ParseFromString(raw)
        types.append(pb.NodeType.Name(n.type))
    assert types.count("MEM_STORE_NODE") == 1 and types.count("MEM_LOAD_NODE") == 1

"""Communicator groups in Chakra traces (issue 18): pg_name on every communication node, the
ASTRA-sim group file beside the ETs, groups read back on import, `emulator export`, and a
missing rank file reported as such (issue 17)."""
from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="the chakra extra (mlc-chakra) is not installed")

from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402

from emulator.cli import main  # noqa: E402
from emulator.importers.chakra import export_chakra, load_chakra, read_msgs, write_msg  # noqa: E402
from emulator.importers.chakra_groups import read_group_file  # noqa: E402
from emulator.importers.native import TraceError  # noqa: E402
from emulator.program import COLLECTIVE, RECV, SEND, Op, Program  # noqa: E402
from emulator.run.simulation import run_program  # noqa: E402
from emulator.scenario import load_scenario_text  # noqa: E402
from emulator.workload.builder import build_program  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "scenarios", "quickstart.yaml")
SMALL = ("name: x\ncluster: {nodes: 2, node: dgx-a100}\n"
         "model: {layers: 4, hidden: 512, heads: 8, seq_len: 1024, vocab: 32000%s}\n"
         "training: {global_batch: 16, micro_batch: 1}\nparallel: {%s}\n")
LAYOUTS = {  # 16 GPUs, several groups each
    "tp2-pp2-dp4": ("", "tp: 2, pp: 2, dp: 4, schedule: 1f1b"),
    "tp2-cp2-pp2-dp2": ("", "tp: 2, cp: 2, pp: 2, dp: 2"),
    "tp2-pp2-dp4-ep4": (", experts: 8, top_k: 2", "tp: 2, pp: 2, dp: 4, ep: 4"),
}


def nodes_of(path: str) -> list:
    out = []
    for raw in read_msgs(path)[1:]:
        n = pb.Node()
        n.ParseFromString(raw)
        out.append(n)
    return out


def attrs(n) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in n.attr}


# ---------------------------------------------------------------------------- export


def test_quickstart_tp2_pp2_dp2_export_carries_its_groups(tmp_path, capsys):
    out = str(tmp_path / "et")
    assert main(["export", QUICKSTART, "--format", "chakra", "--out", out]) == 0
    said = capsys.readouterr().out
    assert f"--workload-configuration={out}/chakra --comm-group-configuration={out}/comm_group.json" in said
    assert sorted(os.listdir(out)) == sorted([f"chakra.{r}.et" for r in range(8)] + ["comm_group.json"])
    # Megatron's order pp, dp, tp (tp fastest): rank = 4*pp + 2*dp + tp. TP groups {0,1} {2,3} {4,5} {6,7};
    # DP groups {0,2} {1,3} {4,6} {5,7}; PP pairs {0,4} {1,5} {2,6} {3,7} (also the embedding all-reduce).
    # Ids 1.. in sorted order of the members.
    groups = json.loads((tmp_path / "et" / "comm_group.json").read_text())
    assert groups == {"1": [0, 1], "2": [0, 2], "3": [0, 4], "4": [1, 3], "5": [1, 5], "6": [2, 3], "7": [2, 6],
                      "8": [3, 7], "9": [4, 5], "10": [4, 6], "11": [5, 7], "12": [6, 7]}
    for rank in range(8):  # each rank in exactly one TP group, one DP group and one PP pair
        tp, dp, pp = rank ^ 1, rank ^ 2, rank ^ 4
        mine = sorted(tuple(m) for m in groups.values() if rank in m)
        assert mine == sorted(tuple(sorted((rank, other))) for other in (tp, dp, pp))
    for rank in range(8):
        for n in nodes_of(os.path.join(out, f"chakra.{rank}.et")):
            a = attrs(n)
            kind = pb.NodeType.Name(n.type)
            if kind == "COMM_COLL_NODE":
                assert rank in groups[a["pg_name"]], (rank, n.id)
            elif kind in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
                # peer and tag as Chakra's schema has them: comm_src/comm_dst/comm_tag, int32
                src, dst = a["comm_src"], a["comm_dst"]
                assert (src == rank) == (kind == "COMM_SEND_NODE") and {src, dst} == {rank, rank ^ 4}
                assert groups[a["pg_name"]] == sorted((src, dst)) and a["comm_tag"] >= 0
            else:
                assert "pg_name" not in a
    # and `emulator run` of the exported trace gives the iteration time of the scenario (run folded)
    (tmp_path / "back.yaml").write_text("name: back\ncluster: {nodes: 1, node: dgx-a100}\n"
                                        "workload: {trace: et, format: chakra}\n")
    times = []
    for scenario in (QUICKSTART, str(tmp_path / "back.yaml")):
        assert main(["run", scenario, "--json"]) == 0
        times.append(json.loads(capsys.readouterr().out)["iteration_time_s"])
    assert times[1] == pytest.approx(times[0], rel=1e-9)


def test_export_bad_input_exits_2(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["export", QUICKSTART, "--out", str(tmp_path / "file")]) == 2
    # checked before any work, as every destination (emulator/outputs/destination.py)
    assert capsys.readouterr().err.startswith(f"emulator: --out {tmp_path}/file: exists and is a file, not a folder")
    (tmp_path / "s.yaml").write_text("name: empty\ncluster: {nodes: 1, node: dgx-a100}\n")
    assert main(["export", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "et")]) == 2
    assert "s.yaml: model: a run needs a workload" in capsys.readouterr().err


def test_chakra_jsonizer_reads_every_exported_file(tmp_path, monkeypatch):
    from chakra.src.jsonizer import jsonizer

    sc = load_scenario_text(SMALL % LAYOUTS["tp2-pp2-dp4-ep4"], "x.yaml")
    program = build_program(sc, None)
    paths = export_chakra(program, str(tmp_path / "et"))
    for path in paths[:-1]:
        monkeypatch.setattr(sys, "argv", ["chakra_jsonizer", "--input_filename", path,
                                          "--output_filename", str(tmp_path / "out.json")])
        jsonizer.main()
        text, decoder, objs, pos = (tmp_path / "out.json").read_text(), json.JSONDecoder(), [], 0
        while pos < len(text):  # the jsonizer writes one JSON object per message, back to back
            obj, pos = decoder.raw_decode(text, pos)
            objs.append(obj)
        rank = int(path.rsplit(".", 2)[1])
        mine = [op for op in program.ops if op.rank == rank]
        assert len(objs) == 1 + len(mine)  # the GlobalMetadata, then one node per op
        comm = [o for o in objs[1:] if o.get("type") in ("COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE")]
        assert len(comm) == sum(op.kind in (COLLECTIVE, SEND, RECV) for op in mine)
        assert all(any(x["name"] == "pg_name" for x in o["attr"]) for o in comm)
        # Chakra's ET feeder resolves a node's deps within its own file (src/feeder/et_feeder.cpp rows
        # 105-117 at 21585d8; the package ships no Python feeder): every dep names a node of this file
        ids = {o.get("id", "0") for o in objs[1:]}  # proto3 JSON leaves out id 0
        assert all(d in ids for o in objs[1:] for d in o.get("dataDeps", []) + o.get("ctrlDeps", []))
    assert read_group_file(paths[-1])  # and the group file is the JSON object ASTRA-sim reads


def test_a_second_export_removes_the_stale_rank_files(tmp_path):
    sc = load_scenario_text(SMALL % LAYOUTS["tp2-pp2-dp4"], "x.yaml")
    export_chakra(build_program(sc, None), str(tmp_path))
    two = Program(ranks=2, ops=[Op(0, 0, COLLECTIVE, "comm", (), "ar", bytes=8.0, collective="all_reduce",
                                   group=(0, 1)),
                                Op(1, 1, COLLECTIVE, "comm", (), "ar", bytes=8.0, collective="all_reduce",
                                   group=(0, 1))])
    export_chakra(two, str(tmp_path))
    # 16 ranks, then 2: chakra.2.et .. chakra.15.et go; the all-rank group is "0", so the file is empty
    assert sorted(os.listdir(tmp_path)) == ["chakra.0.et", "chakra.1.et", "comm_group.json"]
    assert json.loads((tmp_path / "comm_group.json").read_text()) == {}
    assert attrs(nodes_of(str(tmp_path / "chakra.0.et"))[0])["pg_name"] == "0"


def test_the_export_is_byte_identical_run_to_run(tmp_path):
    sc = load_scenario_text(SMALL % LAYOUTS["tp2-cp2-pp2-dp2"], "x.yaml")
    a = export_chakra(build_program(sc, None), str(tmp_path / "a"))
    b = export_chakra(build_program(sc, None), str(tmp_path / "b"))
    assert [open(x, "rb").read() for x in a] == [open(y, "rb").read() for y in b]
    assert not [f for f in os.listdir(tmp_path / "a") if f.startswith(".tmp-")]  # no temporary file left


def test_a_tag_beyond_int32_is_refused(tmp_path):
    ops = [Op(0, 0, SEND, "pp", (), "s", bytes=4.0, peer=1, tag=2**31), Op(1, 1, RECV, "pp", (), "r", bytes=4.0,
                                                                            peer=0, tag=2**31)]
    with pytest.raises(TraceError, match=r"op 0 \(s\): tag 2147483648 does not fit Chakra's comm_tag \(int32\)"):
        export_chakra(Program(ranks=2, ops=ops), str(tmp_path))


# ---------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_round_trip_with_several_groups(tmp_path, layout):
    sc = load_scenario_text(SMALL % LAYOUTS[layout], "x.yaml")
    program = build_program(sc, None)
    export_chakra(program, str(tmp_path))
    groups = json.loads((tmp_path / "comm_group.json").read_text())
    assert len(groups) >= 12  # tp2 layouts on 16 GPUs: 8 TP groups alone, plus DP/CP/EP groups and PP pairs
    back = load_chakra(str(tmp_path))
    assert back.ops == program.ops  # every op, its group included
    a = run_program(program, sc, record_links=False).iteration_time_s
    b = run_program(back, sc, record_links=False).iteration_time_s
    assert b == pytest.approx(a, rel=1e-9)


def test_the_group_file_decides_the_members(tmp_path):
    """The group file is the source of a collective's members, also for our own exports."""
    sc = load_scenario_text(SMALL % LAYOUTS["tp2-pp2-dp4"], "x.yaml")
    program = build_program(sc, None)
    export_chakra(program, str(tmp_path))
    groups = json.loads((tmp_path / "comm_group.json").read_text())
    name = next(k for k, v in groups.items() if v == [0, 1])
    groups[name] = [1, 0]  # same members, ring order reversed
    (tmp_path / "comm_group.json").write_text(json.dumps(groups))
    back = load_chakra(str(tmp_path))
    assert {op.group for op in back.ops if op.kind is COLLECTIVE and op.rank in (0, 1) and len(op.group) == 2
            and set(op.group) == {0, 1}} == {(1, 0)}


# ---------------------------------------------------------------------------- foreign traces


def write_foreign(folder, rank: int, nodes: list) -> None:
    with open(os.path.join(folder, f"w.{rank}.et"), "wb") as f:
        write_msg(f, pb.GlobalMetadata(version="0.0.4"))
        for n in nodes:
            write_msg(f, n)


def coll(node_id: int, pg: str | None, size: int = 1 << 20):
    n = pb.Node(id=node_id, name="ar", type=pb.COMM_COLL_NODE)
    n.attr.add(name="comm_type", int64_val=pb.ALL_REDUCE)
    n.attr.add(name="comm_size", int64_val=size)
    if pg is not None:
        n.attr.add(name="pg_name", string_val=pg)
    return n


def test_foreign_trace_with_a_group_file(tmp_path):
    """An ASTRA-sim style 4-rank workload: an all-reduce in {0,1} and in {2,3}, then one in group "0" (all)."""
    for rank in range(4):
        write_foreign(tmp_path, rank, [coll(0, "1" if rank < 2 else "2"), coll(1, "0")])
    (tmp_path / "comm_group.json").write_text('{"1": [0, 1], "2": [2, 3]}')
    p = load_chakra(str(tmp_path))
    assert [(op.rank, op.group) for op in p.ops] == [
        (0, (0, 1)), (0, (0, 1, 2, 3)), (1, (0, 1)), (1, (0, 1, 2, 3)),
        (2, (2, 3)), (2, (0, 1, 2, 3)), (3, (2, 3)), (3, (0, 1, 2, 3))]
    # the same workload written natively runs to the same time
    native = Program(ranks=4, ops=[Op(rank * 10**9 + i, rank, COLLECTIVE, "comm", (), "ar", bytes=float(1 << 20),
                                      collective="all_reduce", group=g, category="comm")
                                   for rank in range(4) for i, g in enumerate(
                                       [(0, 1) if rank < 2 else (2, 3), (0, 1, 2, 3)])])
    assert p.ops == native.ops


def test_groups_from_a_pytorch_metadata_node(tmp_path):
    """A trace converted from PyTorch declares its process groups in a METADATA node (ranks [] = all);
    Chakra's converter writes the node's values as str() of the PyTorch ET's list of one JSON string."""
    pgs = json.dumps([{"pg_name": "0", "pg_desc": "default_pg", "ranks": []},
                      {"pg_name": "5", "pg_desc": "tp", "ranks": [1, 0]},
                      {"pg_name": "6", "pg_desc": "all", "ranks": []}])
    for rank in range(3):
        md = pb.Node(id=0, name="## process_group:init ##", type=pb.METADATA_NODE)
        md.inputs.values = str([pgs])
        write_foreign(tmp_path, rank, [md, coll(1, "5"), coll(2, "6")] if rank < 2 else [md, coll(2, "6")])
    p = load_chakra(str(tmp_path))
    # group "5" as listed (ring order kept), "6" with ranks [] is every rank of the 3 files
    assert [(op.rank, op.group) for op in p.ops if op.kind is COLLECTIVE] == [
        (0, (1, 0)), (0, (0, 1, 2)), (1, (1, 0)), (1, (0, 1, 2)), (2, (0, 1, 2))]


def test_an_unknown_group_names_the_node_and_the_group(tmp_path):
    for rank in range(2):
        write_foreign(tmp_path, rank, [coll(0, "1"), coll(7, "3")])
    with pytest.raises(TraceError, match=r"w\.0\.et: node 0: names communicator group \"1\", but there is no "
                                         r"group file \(comm_group\.json beside the trace"):
        load_chakra(str(tmp_path))
    (tmp_path / "comm_group.json").write_text('{"1": [0, 1]}')
    with pytest.raises(TraceError, match=r"w\.0\.et: node 7: communicator group \"3\" is not in .*comm_group\.json"):
        load_chakra(str(tmp_path))
    (tmp_path / "comm_group.json").write_text('{"1": [0, 1], "3": [1]}')
    with pytest.raises(TraceError, match=r"w\.0\.et: node 7: communicator group \"3\" \[1\] does not include rank 0"):
        load_chakra(str(tmp_path))


def test_unknown_group_exits_2_naming_the_node(tmp_path, capsys):
    sc_text = SMALL % LAYOUTS["tp2-pp2-dp4"]
    program = build_program(load_scenario_text(sc_text, "x.yaml"), None)
    export_chakra(program, str(tmp_path / "et"))
    groups = json.loads((tmp_path / "et" / "comm_group.json").read_text())
    name = next(k for k, v in groups.items() if v == [0, 2, 4, 6])  # rank 0's DP group (rank = 8*pp + 2*dp + tp)
    del groups[name]
    (tmp_path / "et" / "comm_group.json").write_text(json.dumps(groups))
    first = next(op for op in program.ops if op.rank == 0 and op.kind is COLLECTIVE and op.group == (0, 2, 4, 6))
    (tmp_path / "s.yaml").write_text("name: back\ncluster: {nodes: 2, node: dgx-a100}\n"
                                     "workload: {trace: et, format: chakra}\n")
    assert main(["run", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"emulator: {tmp_path}/et/chakra.0.et: node {first.id}: communicator group \"{name}\" is not in "
                   f"{tmp_path}/et/comm_group.json")


# ---------------------------------------------------------------------------- the group file


@pytest.mark.parametrize("text, message", [
    ('{"1": [0, 1],\n "2": [0, 1', r"comm_group\.json:2: not JSON"),
    ('[[0, 1]]', r"comm_group\.json:1: expected a JSON object of group id → list of ranks"),
    ('{"1": [0, 1],\n "0": [0, 1]}', r"comm_group\.json:2: group \"0\": expected a decimal group id of at least 1"),
    ('{"tp": [0, 1]}', r"comm_group\.json:1: group \"tp\": expected a decimal group id"),
    ('{"1": []}', r"comm_group\.json:1: group \"1\": expected a non-empty list of ranks"),
    ('{"1": [0, -1]}', r"comm_group\.json:1: group \"1\": expected ranks \(integers of at least 0\), got -1"),
    ('{"1": [0, 0]}', r"comm_group\.json:1: group \"1\": a rank is listed twice in \[0, 0\]"),
])
def test_bad_group_files(tmp_path, text, message):
    (tmp_path / "comm_group.json").write_text(text)
    with pytest.raises(TraceError, match=message):
        read_group_file(str(tmp_path / "comm_group.json"))


def test_a_group_beyond_the_ranks_is_a_missing_file(tmp_path):
    """Files for ranks 0 and 1 only, but group "1" spans rank 2: rank 2's file is missing."""
    for rank in range(2):
        write_foreign(tmp_path, rank, [coll(0, "1")])
    (tmp_path / "comm_group.json").write_text('{"1": [0, 1, 2]}')
    with pytest.raises(TraceError, match=r"missing Chakra file w\.2\.et for rank 2 \(node 0 of w\.0\.et "
                                         r"communicates with rank 2\)"):
        load_chakra(str(tmp_path))


def test_the_comm_groups_key(tmp_path, capsys):
    for rank in range(2):
        write_foreign(tmp_path, rank, [coll(0, "4")])
    (tmp_path / "groups.json").write_text('{"4": [0, 1]}')
    base = "name: g\ncluster: {nodes: 1, node: dgx-a100}\nworkload: {trace: ., format: %s, comm_groups: %s}\n"
    (tmp_path / "s.yaml").write_text(base % ("chakra", "groups.json"))
    assert main(["run", str(tmp_path / "s.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] > 0
    (tmp_path / "k.yaml").write_text(base % ("kineto", "groups.json"))
    assert main(["run", str(tmp_path / "k.yaml")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"emulator: {tmp_path}/k.yaml:3: workload.comm_groups: a communicator-group file applies to chakra "
        f"traces only (workload.format is \"kineto\")")
    (tmp_path / "n.yaml").write_text(base % ("chakra", "nope.json"))
    assert main(["run", str(tmp_path / "n.yaml")]) == 2
    assert "n.yaml:3: workload.comm_groups: file not found" in capsys.readouterr().err


# ---------------------------------------------------------------------------- missing rank files (issue 17)


def test_a_missing_rank_file_is_named_not_a_deadlock(tmp_path, capsys):
    sc = load_scenario_text(SMALL % LAYOUTS["tp2-pp2-dp4"], "x.yaml")
    export_chakra(build_program(sc, None), str(tmp_path / "et"))
    os.unlink(tmp_path / "et" / "chakra.5.et")
    (tmp_path / "s.yaml").write_text("name: m\ncluster: {nodes: 2, node: dgx-a100}\n"
                                     "workload: {trace: et, format: chakra}\n")
    assert main(["run", str(tmp_path / "s.yaml")]) == 2
    assert capsys.readouterr().err.strip() == (f"emulator: {tmp_path}/et: missing Chakra file chakra.5.et for rank 5 "
                                               "(the export wrote ranks 0 to 15)")


def test_a_gap_in_foreign_rank_files_is_named(tmp_path):
    for rank in (0, 1, 3):
        write_foreign(tmp_path, rank, [coll(0, None)])
    with pytest.raises(TraceError, match=r"missing Chakra file w\.2\.et for rank 2 \(the trace has ranks 0 to 3\)"):
        load_chakra(str(tmp_path))


def test_two_files_for_one_rank(tmp_path):
    write_foreign(tmp_path, 0, [coll(0, None)])
    (tmp_path / "v.0.et").write_bytes((tmp_path / "w.0.et").read_bytes())
    with pytest.raises(TraceError, match=r"two Chakra files for rank 0: v\.0\.et and w\.0\.et"):
        load_chakra(str(tmp_path))


def p2p(node_id: int, send: bool, src: int, dst: int, size: int, tag: int = 7):
    n = pb.Node(id=node_id, name="send" if send else "recv", type=pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE)
    for name, val in (("comm_src", src), ("comm_dst", dst), ("comm_tag", tag)):
        n.attr.add(name=name, int32_val=val)
    n.attr.add(name="comm_size", int64_val=size)
    return n


def test_a_send_and_its_recv_of_different_sizes_are_refused(tmp_path):
    # rank 0 sends 1 MiB to rank 1 with tag 7, but rank 1's recv expects 2 MiB: the trace is wrong,
    # and the import says which two ops disagree (as the native and Kineto importers do)
    write_foreign(tmp_path, 0, [p2p(0, True, 0, 1, 1 << 20)])
    write_foreign(tmp_path, 1, [p2p(0, False, 0, 1, 2 << 20)])
    with pytest.raises(TraceError, match=r"carries 1\.04858e\+06 B but the recv .* expects 2\.09715e\+06 B"):
        load_chakra(str(tmp_path))
    # the same sizes import
    write_foreign(tmp_path, 1, [p2p(0, False, 0, 1, 1 << 20)])
    assert len(load_chakra(str(tmp_path)).ops) == 2

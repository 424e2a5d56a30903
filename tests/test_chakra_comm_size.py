"""Chakra's comm_size is each rank's INPUT buffer (Chakra's PyTorch converter, ASTRA-sim's Ring.cc;
emulator/importers/chakra.py, ``comm_size``): the emulator's all-gather bytes (nccl-tests' S, the gathered
output) are written as S / n and read back as comm_size × n; reduce-scatter (S = the input), all-to-all
and all-reduce (S = each rank's buffer) are written and read as they are."""
import os

import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="the Chakra format needs mlc-chakra")

from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402

from emulator.importers.chakra import export_chakra, load_chakra, read_msgs, write_msg  # noqa: E402
from emulator.program import COLLECTIVE, Op, Program  # noqa: E402

GIB = 1 << 30


def _program(op: str, n: int, nbytes: float) -> Program:
    group = tuple(range(n))
    return Program(n, [Op(id=r, rank=r, kind=COLLECTIVE, stream="comm", collective=op, group=group, bytes=nbytes)
                       for r in range(n)])


def _comm_size(folder, rank=0) -> int:
    n = pb.Node()
    n.ParseFromString(read_msgs(os.path.join(folder, f"chakra.{rank}.et"))[1])
    return {a.name: a for a in n.attr}["comm_size"].int64_val


@pytest.mark.parametrize("op, n, expected", [
    ("all_gather", 2, GIB // 2),  # a 1 GiB gathered output over 2 ranks: each gives 512 MiB
    ("all_gather", 8, GIB // 8),  # over 8 ranks: 128 MiB each
    ("reduce_scatter", 8, GIB),  # S is the input already: 1 GiB in, 128 MiB out per rank
    ("all_to_all", 8, GIB),  # each rank's send buffer
    ("all_reduce", 8, GIB),
])
def test_export_writes_each_ranks_input(tmp_path, op, n, expected):
    export_chakra(_program(op, n, float(GIB)), str(tmp_path))
    assert _comm_size(str(tmp_path)) == expected
    # our own files read back identical (the exact bytes ride along in emu_bytes)
    assert [o.bytes for o in load_chakra(str(tmp_path)).ops] == [float(GIB)] * n


@pytest.mark.parametrize("comm_type, size, expected", [
    (pb.ALL_GATHER, 1 << 20, 8 << 20),  # ASTRA-sim's all-gather microbenchmark: 1 MiB per rank -> S = 8 MiB
    (pb.REDUCE_SCATTER, 1 << 20, 1 << 20),
    (pb.ALL_TO_ALL, 1 << 20, 1 << 20),
])
def test_import_of_a_foreign_collective_reads_comm_size_as_the_input(tmp_path, comm_type, size, expected):
    for rank in range(8):
        with open(tmp_path / f"w.{rank}.et", "wb") as f:
            write_msg(f, pb.GlobalMetadata(version="0.0.4"))
            node = pb.Node(id=0, name="coll", type=pb.COMM_COLL_NODE)
            node.attr.add(name="comm_type", int64_val=comm_type)
            node.attr.add(name="comm_size", int64_val=size)
            write_msg(f, node)
    ops = load_chakra(str(tmp_path)).ops
    assert len(ops) == 8 and all(o.bytes == expected and o.group == tuple(range(8)) for o in ops)

"""Chakra importer and exporter: MLCommons Chakra execution traces (``.et``) <-> Program.

The ``.et`` format is a stream of length-delimited protobuf messages (a varint32
size, then the message): one ``GlobalMetadata``, then one ``Node`` per op. The
message classes come from the optional ``mlc-chakra`` package (``pip install
mlc-chakra``); without it both functions raise a TraceError that says so.

Export (``export_chakra``) writes one file per simulated rank,
``<out_dir>/chakra.<rank>.et`` (ASTRA-sim's ``--workload-configuration=<out_dir>/chakra``),
and the communicator-group file ``<out_dir>/comm_group.json`` (``chakra_groups.py``):
- compute -> ``COMP_NODE`` with ``num_ops`` (FLOPs), ``tensor_size`` (bytes) and
  ``duration_micros`` (a copy of activation offloading, stream ``d2h`` or ``h2d``: ``MEM_STORE_NODE`` or
  ``MEM_LOAD_NODE``, which files of other tools import back onto those streams); collective ->
  ``COMM_COLL_NODE`` with ``comm_type``,
  ``comm_size`` (each rank's input buffer, Chakra's convention: ``comm_size`` below) and
  ``pg_name``; send/recv ->
  ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` with ``comm_src``, ``comm_dst``, ``comm_tag``
  (int32, as Chakra's feeder reads them: commit 21585d8, src/feeder/et_feeder_node.cpp
  rows 42-47), ``comm_size`` and the ``pg_name`` of the pair;
- ``data_deps`` are the op's dependencies on its own rank; ``ctrl_deps`` is the
  previous op on its stream, so that a stream-unaware consumer (ASTRA-sim) keeps
  the in-order stream semantics;
- ``emu_*`` attributes keep what Chakra has no field for (stream, category, exact
  duration in seconds, group, root, micro-batch, stage, layer, position, deps on
  other ranks, the ranks that have files, a MoE token exchange's plan: ``_comm_type``),
  so that our own files import back to the identical Program.

Import (``load_chakra``) reads a directory of ``*.<rank>.et`` files (or one file) and the
group file beside it (or the one given). Files without ``emu_*`` attributes (written by
other tools) become: compute ops on stream ``compute`` (``cpu`` if ``is_cpu_op``),
communication on stream ``comm``, in a topological order of their deps (data and
control; deps on nodes absent from the file are dropped); a collective spans the group
its ``pg_name`` names, or all ranks for "" and "0"; node ids are renumbered
``rank * 10**9 + id``, since every file restarts them. A rank the trace needs without
its file, or a group name the file lacks, is a TraceError naming the file or the node.
"""
from __future__ import annotations

import heapq
import io
import json
import os
import re
import tempfile
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from emulator.importers.chakra_groups import (
    DEFAULT,
    GROUP_FILE,
    beside,
    group_file_text,
    members_of,
    name_groups,
    pytorch_pg_groups,
    read_group_file,
)
from emulator.importers.native import TraceError
from emulator.importers.pairs import pair_mismatch
from emulator.meta import ProgramMeta, TraceFacts, TraceSource
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Fold, Op, OpKind, Program, is_token_exchange

_INSTALL = "the Chakra format needs the optional package mlc-chakra (pip install mlc-chakra)"
_FOREIGN_IDS = 10**9  # id block per rank for files written by other tools
_FILE = re.compile(r"\.(\d+)\.et$")
_PREFIX = "chakra"  # the export's file names: chakra.<rank>.et (ASTRA-sim: --workload-configuration=DIR/chakra)


def comm_size(collective: str, nbytes: float, members: int) -> int:
    """Chakra's ``comm_size`` of a collective whose nccl-tests buffer is ``nbytes`` over ``members`` ranks.

    Chakra and ASTRA-sim read ``comm_size`` as each rank's INPUT buffer:
    - Chakra's PyTorch converter (mlcommons/chakra 21585d8, src/converter/pytorch_node.py,
      ``PyTorchNode.comm_size``) writes the sum of the bytes of the op's input tensors;
    - ASTRA-sim (astra-sim/astra-sim 518bd51, astra-sim/workload/Workload.cc,
      ``Workload::issue_coll_comm``) hands it to the collective as ``data_size``, and
      astra-sim/system/astraccl/native_collectives/collective_algorithm/Ring.cc, ``Ring::Ring``,
      makes an all-gather's result ``data_size * nodes_in_ring`` with messages of ``data_size``,
      a reduce-scatter's ``data_size / nodes_in_ring``, and splits an all-to-all's and an
      all-reduce's ``data_size`` into ``nodes_in_ring`` messages.
    The emulator's bytes are nccl-tests' S (DESIGN.md): the gathered OUTPUT of an all-gather, the
    INPUT of a reduce-scatter, each rank's buffer of an all-to-all, all-reduce and broadcast. So
    only an all-gather differs: its comm_size is S / n (``bytes_of_comm_size`` is the inverse)."""
    if collective == "all_gather":
        return int(round(nbytes / max(1, members)))
    return int(nbytes)


def bytes_of_comm_size(collective: str, size: float, members: int) -> float:
    """The nccl-tests buffer S of a collective whose Chakra ``comm_size`` is ``size`` (``comm_size``'s inverse)."""
    return size * members if collective == "all_gather" else size


_COMM_TYPES = {"all_reduce": 0, "all_gather": 2, "broadcast": 5, "all_to_all": 6, "reduce_scatter": 7}
_FROM_COMM_TYPE = {0: "all_reduce", 1: "all_reduce", 2: "all_gather", 3: "all_gather", 4: "reduce_scatter",
                   5: "broadcast", 6: "all_to_all", 7: "reduce_scatter", 8: "reduce_scatter", 9: "all_reduce"}


def _comm_type(op: Op) -> int:
    """Chakra's comm_type of a collective. A MoE token exchange (``program.is_token_exchange``: the alltoall
    dispatcher's all-to-all-v, DeepEP's or HybridEP's dispatch and combine) is ALL_TO_ALL of its bytes: Chakra has
    no field for the routing's skew, the top-k copies or DeepEP's forwarding, which ``emu_collective`` keeps for
    the emulator's own import (ASTRA-sim runs a balanced all-to-all)."""
    if op.collective in _COMM_TYPES:
        return _COMM_TYPES[op.collective]
    if is_token_exchange(op.collective):
        return _COMM_TYPES["all_to_all"]
    raise TraceError(f"op {op.id} ({op.name}): collective {op.collective} has no Chakra comm_type")


def _pb() -> Any:
    try:
        from chakra.schema.protobuf import et_def_pb2
    except ImportError:
        raise TraceError(_INSTALL) from None
    return et_def_pb2


# ---------------------------------------------------------------------------- framing


def write_msg(f: Any, msg: Any) -> None:
    data = msg.SerializeToString()
    n = len(data)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            break
    f.write(bytes(out) + data)


def read_msgs(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        raw = f.read()
    msgs, pos = [], 0
    while pos < len(raw):
        size, shift = 0, 0
        while True:
            if pos >= len(raw) or shift > 28:
                raise TraceError(f"{path}: truncated or corrupt Chakra file (bad length prefix at byte {pos})")
            b = raw[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if pos + size > len(raw):
            raise TraceError(f"{path}: truncated Chakra file (a message of {size} bytes at byte {pos} runs past "
                             "the end)")
        msgs.append(raw[pos:pos + size])
        pos += size
    return msgs


# ---------------------------------------------------------------------------- attributes


def _attr(pb: Any, name: str, kind: str, value: Any) -> Any:
    a = pb.AttributeProto(name=name)
    if kind == "int64_list":
        a.int64_list.values.extend(int(v) for v in value)
    elif kind == "bool_list":
        a.bool_list.values.extend(bool(v) for v in value)
    else:
        setattr(a, kind, value)
    return a


def _attrs(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in msg.attr:
        which = a.WhichOneof("value")
        if which is None:
            continue
        v = getattr(a, which)
        out[a.name] = list(v.values) if which.endswith("_list") else v
    return out


# ---------------------------------------------------------------------------- export


def export_chakra(program: Program, out_dir: str) -> list[str]:
    """Write ``program`` as one Chakra ``.et`` file per simulated rank and the communicator-group
    file beside them; return the paths (the ETs in rank order, then the group file).

    Each file is written to a temporary name and renamed into place; ``chakra.<r>.et`` files
    of an earlier export to the same folder that this one does not write are removed.
    """
    pb = _pb()
    os.makedirs(out_dir, exist_ok=True)
    rank_of = {op.id: op.rank for op in program.ops}
    names = name_groups(program)
    ranks = program.simulated_ranks()
    paths = []
    for rank in ranks:
        path = os.path.join(out_dir, f"{_PREFIX}.{rank}.et")
        buf = io.BytesIO()
        write_msg(buf, _metadata(pb, program, rank, ranks))
        prev: dict[str, int] = {}
        for index, op in enumerate(program.ops):
            if op.rank != rank:
                continue
            write_msg(buf, _node(pb, op, index, prev.get(op.stream), rank_of, names))
            prev[op.stream] = op.id
        _write_atomic(path, buf.getvalue())
        paths.append(path)
    group_path = os.path.join(out_dir, GROUP_FILE)
    _write_atomic(group_path, group_file_text(names).encode())
    for f in os.listdir(out_dir):
        m = _FILE.search(f)
        if m and f == f"{_PREFIX}.{m.group(1)}.et" and int(m.group(1)) not in ranks:
            os.unlink(os.path.join(out_dir, f))  # a stale rank of an earlier, larger export
    return paths + [group_path]


def _write_atomic(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the trace from other users
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _metadata(pb: Any, program: Program, rank: int, files: list[int]) -> Any:
    md = pb.GlobalMetadata(version="0.0.4")
    md.attr.append(_attr(pb, "emu_ranks", "int64_val", program.ranks))
    md.attr.append(_attr(pb, "emu_rank", "int64_val", rank))
    md.attr.append(_attr(pb, "emu_files", "int64_list", files))
    if program.fold is not None:
        md.attr.append(_attr(pb, "emu_fold_shape", "int64_list", program.fold.shape))
        md.attr.append(_attr(pb, "emu_fold_folded", "bool_list", program.fold.folded))
    try:
        md.attr.append(_attr(pb, "emu_meta", "string_val", json.dumps(program.meta.to_dict())))
    except (TypeError, ValueError):
        pass  # meta that is not JSON stays behind (it is for reports only)
    return md


_NODE_TYPE: dict[OpKind, str] = {COMPUTE: "COMP_NODE", COLLECTIVE: "COMM_COLL_NODE", SEND: "COMM_SEND_NODE",
                                  RECV: "COMM_RECV_NODE"}
# activation offloading's copies (compute ops on the copy streams): a store to host memory and a load from it
_COPY_NODE = {"d2h": "MEM_STORE_NODE", "h2d": "MEM_LOAD_NODE"}
_KIND_OF_NODE: dict[str, OpKind] = {**{v: k for k, v in _NODE_TYPE.items()},
                                    **{v: COMPUTE for v in _COPY_NODE.values()}}
_STREAM_OF_NODE = {v: k for k, v in _COPY_NODE.items()}


def _node(pb: Any, op: Op, index: int, prev: int | None, rank_of: dict[int, int],
          names: dict[tuple[int, ...], str]) -> Any:
    kind = _COPY_NODE.get(op.stream, "COMP_NODE") if op.kind is COMPUTE else _NODE_TYPE[op.kind]
    n = pb.Node(id=op.id, name=op.name, type=getattr(pb, kind))
    n.data_deps.extend(d for d in op.deps if rank_of.get(d) == op.rank)
    if prev is not None:
        n.ctrl_deps.append(prev)
    if op.duration is not None:
        n.duration_micros = int(round(op.duration * 1e6))
    add = n.attr.append
    add(_attr(pb, "is_cpu_op", "bool_val", op.stream == "cpu"))
    if op.kind is COMPUTE:
        add(_attr(pb, "num_ops", "int64_val", int(op.flops)))
        add(_attr(pb, "tensor_size", "uint64_val", int(op.bytes)))
    elif op.kind is COLLECTIVE:
        add(_attr(pb, "comm_size", "int64_val", comm_size(op.collective, op.bytes, len(op.group))))
    else:
        add(_attr(pb, "comm_size", "int64_val", int(op.bytes)))
    if op.kind is COLLECTIVE:
        add(_attr(pb, "comm_type", "int64_val", _comm_type(op)))
        if op.collective not in _COMM_TYPES:  # a MoE token exchange: its plan's name, read back by the emulator
            add(_attr(pb, "emu_collective", "string_val", op.collective))
    if op.kind is SEND or op.kind is RECV:
        src, dst = (op.rank, op.peer) if op.kind is SEND else (op.peer, op.rank)
        if not 0 <= op.tag < 2**31:
            raise TraceError(f"op {op.id} ({op.name}): tag {op.tag} does not fit Chakra's comm_tag (int32)")
        add(_attr(pb, "comm_src", "int32_val", src))
        add(_attr(pb, "comm_dst", "int32_val", dst))
        add(_attr(pb, "comm_tag", "int32_val", op.tag))
    members = members_of(op)
    if members is not None:
        add(_attr(pb, "pg_name", "string_val", names[members]))
    add(_attr(pb, "emu_index", "int64_val", index))
    add(_attr(pb, "emu_stream", "string_val", op.stream))
    add(_attr(pb, "emu_category", "string_val", op.category))
    add(_attr(pb, "emu_flops", "double_val", float(op.flops)))
    add(_attr(pb, "emu_bytes", "double_val", float(op.bytes)))
    if op.duration is not None:
        add(_attr(pb, "emu_duration_s", "double_val", float(op.duration)))
    add(_attr(pb, "emu_group", "int64_list", op.group))
    add(_attr(pb, "emu_ints", "int64_list", (op.root, op.peer, op.tag, op.microbatch, op.stage, op.layer)))
    remote = [d for d in op.deps if rank_of.get(d) != op.rank]
    if remote:
        add(_attr(pb, "emu_remote_deps", "int64_list", remote))
    add(_attr(pb, "emu_dep_order", "int64_list", op.deps))
    return n


# ---------------------------------------------------------------------------- import


def _files(path: str) -> list[tuple[int | None, str]]:
    if os.path.isdir(path):
        found = [(int(m.group(1)), os.path.join(path, f)) for f in os.listdir(path) if (m := _FILE.search(f))]
        if not found:
            raise TraceError(f"{path}: no Chakra files (*.<rank>.et) in this directory")
        found.sort()
        for (r1, f1), (r2, f2) in zip(found, found[1:]):
            if r1 == r2:
                raise TraceError(f"{path}: two Chakra files for rank {r1}: {os.path.basename(f1)} and "
                                 f"{os.path.basename(f2)}; keep one trace per folder")
        return [(r, f) for r, f in found]
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such file or directory")
    m = _FILE.search(path)
    return [(int(m.group(1)) if m else None, path)]


@dataclass
class _RankFile:
    """One parsed ``.et`` file."""

    rank: int
    path: str
    md: dict[str, Any]
    nodes: list[Any]

    @property
    def own(self) -> bool:
        """Written by export_chakra (every node keeps its emu_* attributes)."""
        return all(any(a.name == "emu_index" for a in n.attr) for n in self.nodes)


def _read_file(pb: Any, rank: int | None, k: int, path: str) -> _RankFile:
    from google.protobuf.message import DecodeError

    msgs = read_msgs(path)
    if not msgs:
        raise TraceError(f"{path}: empty Chakra file (no GlobalMetadata)")
    try:
        md = pb.GlobalMetadata()
        md.ParseFromString(msgs[0])
        nodes = []
        for raw in msgs[1:]:
            n = pb.Node()
            n.ParseFromString(raw)
            nodes.append(n)
    except DecodeError as e:
        raise TraceError(f"{path}: not a Chakra execution trace: {e}") from None
    attrs = _attrs(md)
    return _RankFile(int(attrs.get("emu_rank", rank if rank is not None else k)), path, attrs, nodes)


class _Groups:
    """The named communicator groups of an import, and the one rule that resolves a node's pg_name."""

    def __init__(self, named: dict[str, tuple[int, ...]], source: str | None, world: int) -> None:
        self.named = named
        self.source = source
        self.world = world

    def resolve(self, pg: str, default: tuple[int, ...], rank: int, where: str) -> tuple[int, ...]:
        if pg in ("", DEFAULT):
            members = default
        elif pg in self.named:
            members = self.named[pg]
        elif self.source is None:
            raise TraceError(f"{where}: names communicator group \"{pg}\", but there is no group file "
                             f"({GROUP_FILE} beside the trace, or workload.comm_groups)")
        else:
            raise TraceError(f"{where}: communicator group \"{pg}\" is not in {self.source}")
        if rank not in members:
            raise TraceError(f"{where}: communicator group \"{pg}\" {list(members)} does not include rank {rank}")
        if max(members) >= self.world:
            raise TraceError(f"{where}: communicator group \"{pg}\" lists rank {max(members)}, but the trace has "
                             f"ranks 0 to {self.world - 1}")
        return members


def load_chakra(path: str, groups: str | None = None) -> Program:
    """Import Chakra ``.et`` files (a directory of ``*.<rank>.et``, or one file) as a Program.

    ``groups`` is the communicator-group file; by default ``comm_group.json`` beside the trace,
    if there is one. A collective whose ``pg_name`` is neither "" nor "0" runs in the group of
    that name (the file's, or a PyTorch METADATA node's); an unknown name is a TraceError
    naming the node and the group.
    """
    pb = _pb()
    files = [_read_file(pb, r, k, f) for k, (r, f) in enumerate(_files(path))]
    first = files[0].md
    source = groups or beside(path)
    named = read_group_file(source) if source else {}
    for f in files:
        if not f.own:
            named.update(_metadata_groups(f))
    fold = None
    if "emu_fold_shape" in first:
        fold = Fold(tuple(int(x) for x in first["emu_fold_shape"]), tuple(bool(x) for x in first["emu_fold_folded"]))
    ranks = _world(path, files, named, fold)
    named = {name: members or tuple(range(ranks)) for name, members in named.items()}  # () is every rank
    resolver = _Groups(named, source, ranks)
    indexed: list[tuple[int, Op]] = []
    for f in files:
        indexed.extend(_rank_ops(f, ranks, resolver))
    indexed.sort(key=lambda t: t[0])
    if "emu_meta" in first:
        flat = json.loads(first["emu_meta"])
        try:
            meta = ProgramMeta.from_dict(flat)
        except (ValueError, KeyError, TypeError) as e:
            raise TraceError(f"{path}: emu_meta is not a program's meta: {e}") from None
    else:
        meta = ProgramMeta(trace=TraceFacts(TraceSource("chakra", path)))
    program = Program(ranks=ranks, ops=[op for _, op in indexed], fold=fold, meta=meta)
    try:
        program.validate()
    except ValueError as e:
        raise TraceError(f"{path}: the imported program is inconsistent: {e}") from None
    mismatch = pair_mismatch(program)  # a send and its recv that disagree on the bytes
    if mismatch is not None:
        raise TraceError(f"{path}: {mismatch}")
    return program


def _metadata_groups(f: _RankFile) -> dict[str, tuple[int, ...]]:
    """Process groups that a PyTorch-converted trace declares in its METADATA nodes."""
    out: dict[str, tuple[int, ...]] = {}
    for n in f.nodes:
        if _type_name(n) == "METADATA_NODE" and n.inputs.values:
            out.update(pytorch_pg_groups(n.inputs.values, f"{f.path}: node {n.id}"))
    return out


def _world(path: str, files: list[_RankFile], named: dict[str, tuple[int, ...]], fold: Fold | None) -> int:
    """The number of ranks; a TraceError naming the missing file if a rank the trace needs has none."""
    found = {f.rank for f in files}
    first = files[0]
    if "emu_ranks" in first.md:
        ranks = int(first.md["emu_ranks"])
        expected = [int(r) for r in first.md.get("emu_files", [])] or [
            r for r in range(ranks) if fold is None or fold.is_representative(r)]
        missing = [r for r in expected if r not in found]
        if missing:
            _missing(path, first, missing[0], f"the export wrote ranks {_span(expected)}")
        return ranks
    world = max(found) + 1
    for f in files:
        for n in f.nodes:
            for r in _peers(n, named):
                if r not in found:
                    _missing(path, first, r, f"node {n.id} of {os.path.basename(f.path)} communicates with rank {r}")
    missing = [r for r in range(world) if r not in found]
    if missing:
        _missing(path, first, missing[0], f"the trace has ranks 0 to {world - 1}")
    return world


def _peers(n: Any, named: dict[str, tuple[int, ...]]) -> list[int]:
    t = _type_name(n)
    if t not in ("COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"):
        return []
    a = _attrs(n)
    if t == "COMM_COLL_NODE":
        return list(named.get(str(a.get("pg_name", "")), ()))
    return [int(a[k]) for k in ("comm_src", "comm_dst") if k in a and int(a[k]) >= 0]


def _span(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]} to {ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


def _missing(path: str, first: _RankFile, rank: int, why: str) -> NoReturn:
    base = os.path.basename(first.path)
    m = _FILE.search(base)
    name = f"{base[:m.start()] if m else _PREFIX}.{rank}.et"
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    raise TraceError(f"{folder}: missing Chakra file {name} for rank {rank} ({why})")


def _rank_ops(f: _RankFile, ranks: int, groups: _Groups) -> list[tuple[int, Op]]:
    if f.own:
        return [(int((a := _attrs(n))["emu_index"]), _own_op(n, a, f.rank, f.path, groups)) for n in f.nodes]
    nodes = _topological(f.nodes, f.path)
    known = {int(n.id) for n in nodes}
    base = f.rank * _FOREIGN_IDS  # node ids restart in every file: renumber them per rank
    out = []
    for pos, n in enumerate(nodes):
        op = _foreign_op(n, _attrs(n), f.rank, ranks, f.path, known, groups)
        op = replace(op, id=base + op.id, deps=tuple(base + d for d in op.deps))
        out.append((base + pos, op))
    return out


def _own_op(n: Any, a: dict, rank: int, path: str, groups: _Groups) -> Op:
    kind = _KIND_OF_NODE[_type_name(n)]
    root, peer, tag, mb, stage, layer = (int(x) for x in a["emu_ints"])
    group = tuple(int(g) for g in a["emu_group"])
    if kind is COLLECTIVE:
        group = groups.resolve(str(a.get("pg_name", "")), group, rank, f"{path}: node {n.id}")
    return Op(id=int(n.id), rank=rank, kind=kind, stream=a["emu_stream"],
              deps=tuple(int(d) for d in a["emu_dep_order"]),
              name=n.name, duration=a.get("emu_duration_s"), flops=a["emu_flops"], bytes=a["emu_bytes"],
              category=a["emu_category"],
              collective=(a.get("emu_collective") or _FROM_COMM_TYPE[int(a["comm_type"])])
              if kind is COLLECTIVE else "",
              group=group, root=root, peer=peer, tag=tag, microbatch=mb,
              stage=stage, layer=layer)


def _type_name(n: Any) -> str:
    return _pb().NodeType.Name(n.type)


def _foreign_op(n: Any, a: dict, rank: int, ranks: int, path: str, known: set[int], groups: _Groups) -> Op:
    t = _type_name(n)
    deps = tuple(d for d in dict.fromkeys(int(d) for d in list(n.data_deps) + list(n.ctrl_deps)) if d in known)
    where = f"{path}: node {n.id}"
    if t in ("COMP_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "METADATA_NODE", "INVALID_NODE"):
        flops, nbytes = float(a.get("num_ops", 0)), float(a.get("tensor_size", 0))
        dur = n.duration_micros * 1e-6 if n.duration_micros or not (flops or nbytes) else None
        stream = _STREAM_OF_NODE.get(t, "cpu" if a.get("is_cpu_op") else "compute")
        return Op(id=int(n.id), rank=rank, kind=COMPUTE, stream=stream,
                  deps=deps, name=n.name, duration=dur, flops=flops, bytes=nbytes)
    size = float(a.get("comm_size", 0))
    if t == "COMM_COLL_NODE":
        ct = int(a.get("comm_type", -1))
        if ct not in _FROM_COMM_TYPE:
            raise TraceError(f"{where}: unknown comm_type {ct}")
        group = groups.resolve(str(a.get("pg_name", "")), tuple(range(ranks)), rank, where)
        op = _FROM_COMM_TYPE[ct]
        return Op(id=int(n.id), rank=rank, kind=COLLECTIVE, stream="comm", deps=deps, name=n.name,
                  bytes=bytes_of_comm_size(op, size, len(group)), collective=op, group=group, category="comm")
    if t in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
        send = t == "COMM_SEND_NODE"
        peer = int(a.get("comm_dst" if send else "comm_src", -1))
        return Op(id=int(n.id), rank=rank, kind=SEND if send else RECV, stream="comm", deps=deps, name=n.name,
                  bytes=size, peer=peer, tag=int(a.get("comm_tag", 0)), category="comm")
    raise TraceError(f"{where}: unsupported node type {t}")


def _topological(nodes: list[Any], path: str) -> list[Any]:
    """Nodes in dependency order, smallest id first among the ready ones."""
    by_id = {int(n.id): n for n in nodes}
    indeg = {i: 0 for i in by_id}
    succ: dict[int, list[int]] = {i: [] for i in by_id}
    for n in nodes:
        for d in set(int(x) for x in list(n.data_deps) + list(n.ctrl_deps)):
            if d in by_id:
                indeg[int(n.id)] += 1
                succ[d].append(int(n.id))
    heap = [i for i, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        i = heapq.heappop(heap)
        out.append(by_id[i])
        for s in succ[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, s)
    if len(out) != len(nodes):
        raise TraceError(f"{path}: the dependencies of the Chakra nodes form a cycle")
    return out

"""Chakra importer and exporter: MLCommons Chakra execution traces (``.et``) <-> Program.

The ``.et`` format is a stream of length-delimited protobuf messages (a varint32
size, then the message): one ``GlobalMetadata``, then one ``Node`` per op. The
message classes come from the optional ``mlc-chakra`` package (``pip install
mlc-chakra``); without it both functions raise a TraceError that says so.

Export (``export_chakra``) writes one file per simulated rank,
``<out_dir>/chakra.<rank>.et``:
- compute -> ``COMP_NODE`` with ``num_ops`` (FLOPs), ``tensor_size`` (bytes) and
  ``duration_micros``; collective -> ``COMM_COLL_NODE`` with ``comm_type`` and
  ``comm_size`` (the nccl-tests buffer S); send/recv -> ``COMM_SEND_NODE`` /
  ``COMM_RECV_NODE`` with ``comm_src``, ``comm_dst``, ``comm_tag``, ``comm_size``;
- ``data_deps`` are the op's dependencies on its own rank; ``ctrl_deps`` is the
  previous op on its stream, so that a stream-unaware consumer (ASTRA-sim) keeps
  the in-order stream semantics;
- ``emu_*`` attributes keep what Chakra has no field for (stream, category, exact
  duration in seconds, group, root, micro-batch, stage, layer, position, deps on
  other ranks), so that our own files import back to the identical Program.

Import (``load_chakra``) reads a directory of ``*.<rank>.et`` files (or one file).
Files without ``emu_*`` attributes (written by other tools) become: compute ops
on stream ``compute`` (``cpu`` if ``is_cpu_op``), communication on stream
``comm``, in a topological order of their deps (data and control; deps on nodes
absent from the file are dropped); collectives span all ranks; node ids are
renumbered ``rank * 10**9 + id``, since every file restarts them.
"""
from __future__ import annotations

import heapq
import json
import os
import re
from dataclasses import replace
from typing import Any

from emulator.importers.native import TraceError
from emulator.meta import ProgramMeta, TraceFacts, TraceSource
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Fold, Op, OpKind, Program

_INSTALL = "the Chakra format needs the optional package mlc-chakra (pip install mlc-chakra)"
_FOREIGN_IDS = 10**9  # id block per rank for files written by other tools
_FILE = re.compile(r"\.(\d+)\.et$")
_COMM_TYPES = {"all_reduce": 0, "all_gather": 2, "broadcast": 5, "all_to_all": 6, "reduce_scatter": 7}
_FROM_COMM_TYPE = {0: "all_reduce", 1: "all_reduce", 2: "all_gather", 3: "all_gather", 4: "reduce_scatter",
                   5: "broadcast", 6: "all_to_all", 7: "reduce_scatter", 8: "reduce_scatter", 9: "all_reduce"}


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
    """Write ``program`` as one Chakra ``.et`` file per simulated rank; return the paths."""
    pb = _pb()
    os.makedirs(out_dir, exist_ok=True)
    rank_of = {op.id: op.rank for op in program.ops}
    paths = []
    for rank in program.simulated_ranks():
        path = os.path.join(out_dir, f"chakra.{rank}.et")
        with open(path, "wb") as f:
            write_msg(f, _metadata(pb, program, rank))
            prev: dict[str, int] = {}
            for index, op in enumerate(program.ops):
                if op.rank != rank:
                    continue
                write_msg(f, _node(pb, op, index, prev.get(op.stream), rank_of))
                prev[op.stream] = op.id
        paths.append(path)
    return paths


def _metadata(pb: Any, program: Program, rank: int) -> Any:
    md = pb.GlobalMetadata(version="0.0.4")
    md.attr.append(_attr(pb, "emu_ranks", "int64_val", program.ranks))
    md.attr.append(_attr(pb, "emu_rank", "int64_val", rank))
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
_KIND_OF_NODE: dict[str, OpKind] = {v: k for k, v in _NODE_TYPE.items()}


def _node(pb: Any, op: Op, index: int, prev: int | None, rank_of: dict[int, int]) -> Any:
    n = pb.Node(id=op.id, name=op.name, type=getattr(pb, _NODE_TYPE[op.kind]))
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
    else:
        add(_attr(pb, "comm_size", "int64_val", int(op.bytes)))
    if op.kind is COLLECTIVE:
        add(_attr(pb, "comm_type", "int64_val", _COMM_TYPES[op.collective]))
    if op.kind is SEND or op.kind is RECV:
        src, dst = (op.rank, op.peer) if op.kind is SEND else (op.peer, op.rank)
        add(_attr(pb, "comm_src", "int32_val", src))
        add(_attr(pb, "comm_dst", "int32_val", dst))
        add(_attr(pb, "comm_tag", "int32_val", op.tag))
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
        return sorted(found)
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such file or directory")
    m = _FILE.search(path)
    return [(int(m.group(1)) if m else None, path)]


def load_chakra(path: str) -> Program:
    """Import Chakra ``.et`` files (a directory of ``*.<rank>.et``, or one file) as a Program."""
    pb = _pb()
    from google.protobuf.message import DecodeError

    per_file = []
    for file_rank, f in _files(path):
        msgs = read_msgs(f)
        if not msgs:
            raise TraceError(f"{f}: empty Chakra file (no GlobalMetadata)")
        try:
            md = pb.GlobalMetadata()
            md.ParseFromString(msgs[0])
            nodes = []
            for raw in msgs[1:]:
                n = pb.Node()
                n.ParseFromString(raw)
                nodes.append(n)
        except DecodeError as e:
            raise TraceError(f"{f}: not a Chakra execution trace: {e}") from None
        per_file.append((file_rank, f, _attrs(md), nodes))
    ranks = int(per_file[0][2].get("emu_ranks", len(per_file)))
    indexed: list[tuple[int, Op]] = []
    for k, (file_rank, f, md, nodes) in enumerate(per_file):
        rank = int(md.get("emu_rank", file_rank if file_rank is not None else k))
        indexed.extend(_rank_ops(nodes, rank, ranks, f))
    indexed.sort(key=lambda t: t[0])
    first = per_file[0][2]
    fold = None
    if "emu_fold_shape" in first:
        fold = Fold(tuple(int(x) for x in first["emu_fold_shape"]), tuple(bool(x) for x in first["emu_fold_folded"]))
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
    return program


def _rank_ops(nodes: list[Any], rank: int, ranks: int, path: str) -> list[tuple[int, Op]]:
    own = all(any(a.name == "emu_index" for a in n.attr) for n in nodes)
    if own:
        return [(int((a := _attrs(n))["emu_index"]), _own_op(n, a, rank)) for n in nodes]
    nodes = _topological(nodes, path)
    known = {int(n.id) for n in nodes}
    base = rank * _FOREIGN_IDS  # node ids restart in every file: renumber them per rank
    out = []
    for pos, n in enumerate(nodes):
        op = _foreign_op(n, _attrs(n), rank, ranks, path, known)
        op = replace(op, id=base + op.id, deps=tuple(base + d for d in op.deps))
        out.append((base + pos, op))
    return out


def _own_op(n: Any, a: dict, rank: int) -> Op:
    kind = _KIND_OF_NODE[_type_name(n)]
    root, peer, tag, mb, stage, layer = (int(x) for x in a["emu_ints"])
    return Op(id=int(n.id), rank=rank, kind=kind, stream=a["emu_stream"],
              deps=tuple(int(d) for d in a["emu_dep_order"]),
              name=n.name, duration=a.get("emu_duration_s"), flops=a["emu_flops"], bytes=a["emu_bytes"],
              category=a["emu_category"],
              collective=_FROM_COMM_TYPE[int(a["comm_type"])] if kind is COLLECTIVE else "",
              group=tuple(int(g) for g in a["emu_group"]), root=root, peer=peer, tag=tag, microbatch=mb,
              stage=stage, layer=layer)


def _type_name(n: Any) -> str:
    return _pb().NodeType.Name(n.type)


def _foreign_op(n: Any, a: dict, rank: int, ranks: int, path: str, known: set[int]) -> Op:
    t = _type_name(n)
    deps = tuple(d for d in dict.fromkeys(int(d) for d in list(n.data_deps) + list(n.ctrl_deps)) if d in known)
    where = f"{path}: node {n.id}"
    if t in ("COMP_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "METADATA_NODE", "INVALID_NODE"):
        flops, nbytes = float(a.get("num_ops", 0)), float(a.get("tensor_size", 0))
        dur = n.duration_micros * 1e-6 if n.duration_micros or not (flops or nbytes) else None
        return Op(id=int(n.id), rank=rank, kind=COMPUTE, stream="cpu" if a.get("is_cpu_op") else "compute",
                  deps=deps, name=n.name, duration=dur, flops=flops, bytes=nbytes)
    size = float(a.get("comm_size", 0))
    if t == "COMM_COLL_NODE":
        ct = int(a.get("comm_type", -1))
        if ct not in _FROM_COMM_TYPE:
            raise TraceError(f"{where}: unknown comm_type {ct}")
        return Op(id=int(n.id), rank=rank, kind=COLLECTIVE, stream="comm", deps=deps, name=n.name, bytes=size,
                  collective=_FROM_COMM_TYPE[ct], group=tuple(range(ranks)), category="comm")
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

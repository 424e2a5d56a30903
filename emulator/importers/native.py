"""The project's own trace format, v1 (DESIGN.md, "Trace format v1").

    {"format": "emulator-trace", "version": 1, "ranks": N, "ops": [...]}

Each op has ``id``, ``rank``, ``kind`` and ``deps``, and per kind: ``duration``
or ``flops``/``bytes`` (compute); ``peer``, ``bytes``, ``tag`` (send/recv);
``op``, ``group``, ``bytes`` (collective; ``root`` for broadcast). Optional:
``stream``, ``name``, ``category``, ``microbatch``, ``stage``, ``layer``.
Plain numbers are SI; strings with units are accepted. Ops keep file order on
each (rank, stream). A group lists each member once, and a send and the recv it
pairs with carry the same bytes (pairs.py). ``dump_trace`` writes a Program back in this format.
"""
from __future__ import annotations

import json
from typing import Any

from emulator.errors import EmulatorError
from emulator.importers.pairs import pair_mismatch
from emulator.program import COLLECTIVE, COLLECTIVE_OPS, COMPUTE, KINDS, RECV, SEND, Op, OpKind, Program
from emulator.scenario import paths

_LABELS = tuple(k.label for k in KINDS)  # the kinds as the format writes them


class TraceError(EmulatorError):
    """A trace file is malformed; the message names the file and the op."""


def _num(v: Any, kind: str, where: str, key: str) -> float:
    from emulator.scenario.units import parse_si

    try:
        return parse_si(v, kind)
    except (ValueError, TypeError) as exc:
        raise TraceError(f"{where}: {key}: {exc}") from None


def _int(v: Any, where: str, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{where}: {key}: expected an integer, got {v!r}")
    return v


def _op(d: Any, i: int, path: str, ranks: int) -> Op:
    where = f"{path}: ops[{i}]"
    if not isinstance(d, dict):
        raise TraceError(f"{where}: expected an object, got {type(d).__name__}")
    for key in ("id", "rank", "kind"):
        if key not in d:
            raise TraceError(f"{where}: missing key {key!r}")
    label = d["kind"]
    if not isinstance(label, str) or label not in _LABELS:
        raise TraceError(f"{where}: kind: expected one of {', '.join(_LABELS)}, got {label!r}")
    kind = OpKind.parse(label)
    deps = d.get("deps", [])
    if not isinstance(deps, list):
        raise TraceError(f"{where}: deps: expected a list of op ids, got {deps!r}")
    common: dict[str, Any] = dict(
        id=_int(d["id"], where, "id"), rank=_int(d["rank"], where, "rank"), kind=kind,
        stream=str(d.get("stream", "compute" if kind is COMPUTE else "comm")),
        deps=tuple(_int(x, where, "deps") for x in deps), name=str(d.get("name", "")),
        category=str(d.get("category", "")), microbatch=_int(d.get("microbatch", -1), where, "microbatch"),
        stage=_int(d.get("stage", -1), where, "stage"), layer=_int(d.get("layer", -1), where, "layer"))
    if kind is COMPUTE:
        if "duration" in d:
            return Op(**common, duration=_num(d["duration"], "time", where, "duration"),
                      flops=_num(d.get("flops", 0), "flops", where, "flops"),
                      bytes=_num(d.get("bytes", 0), "bytes", where, "bytes"))
        if "flops" not in d and "bytes" not in d:
            raise TraceError(f"{where}: a compute op needs 'duration' or 'flops'/'bytes'")
        return Op(**common, flops=_num(d.get("flops", 0), "flops", where, "flops"),
                  bytes=_num(d.get("bytes", 0), "bytes", where, "bytes"))
    nbytes = _num(d.get("bytes"), "bytes", where, "bytes") if "bytes" in d else None
    if nbytes is None:
        raise TraceError(f"{where}: a {label} op needs 'bytes'")
    if kind is COLLECTIVE:
        name = d.get("op")
        if name not in COLLECTIVE_OPS:
            raise TraceError(f"{where}: op: expected one of {', '.join(COLLECTIVE_OPS)}, got {name!r}")
        group = d.get("group", list(range(ranks)))
        if not isinstance(group, list) or not group:
            raise TraceError(f"{where}: group: expected a list of ranks, got {group!r}")
        listed = [_int(x, where, "group") for x in group]
        twice = sorted({x for x in listed if listed.count(x) > 1})
        if twice:
            raise TraceError(f"{where}: group: {listed} lists rank {twice[0]} more than once; "
                             "expected each member once")
        members = tuple(sorted(listed))
        return Op(**common, bytes=nbytes, collective=name, group=members,
                  root=_int(d.get("root", members[0]), where, "root"))
    if "peer" not in d:
        raise TraceError(f"{where}: a {label} op needs 'peer'")
    return Op(**common, bytes=nbytes, peer=_int(d["peer"], where, "peer"), tag=_int(d.get("tag", 0), where, "tag"))


def load_trace(path: str) -> Program:
    """Read a v1 trace file into a Program (raises TraceError on any defect)."""
    wrong = paths.problem(path)
    if wrong is not None:
        raise TraceError(f"{path}: {wrong}")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        data = json.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not a JSON trace: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != "emulator-trace":
        raise TraceError(f"{path}: expected an object with \"format\": \"emulator-trace\"")
    if data.get("version") != 1:
        raise TraceError(f"{path}: version: expected 1, got {data.get('version')!r}")
    ranks = data.get("ranks")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise TraceError(f"{path}: ranks: expected a positive integer, got {ranks!r}")
    ops = data.get("ops")
    if not isinstance(ops, list):
        raise TraceError(f"{path}: ops: expected a list")
    program = Program(ranks, [_op(d, i, path, ranks) for i, d in enumerate(ops)])
    try:
        program.validate()
    except ValueError as exc:
        raise TraceError(f"{path}: {exc}") from None
    mismatch = pair_mismatch(program)
    if mismatch is not None:
        raise TraceError(f"{path}: {mismatch}")
    return program


def dump_trace(program: Program) -> dict:
    """A Program as a v1 trace object (deterministic key order)."""
    ops = []
    for op in program.ops:
        d: dict[str, Any] = {"id": op.id, "rank": op.rank, "kind": op.kind.label, "deps": list(op.deps),
                             "stream": op.stream}
        if op.name:
            d["name"] = op.name
        if op.kind is COMPUTE:
            if op.duration is not None:
                d["duration"] = op.duration
            if op.flops:
                d["flops"] = op.flops
            if op.bytes or op.duration is None:
                d["bytes"] = op.bytes
        elif op.kind is COLLECTIVE:
            d.update(op=op.collective, group=list(op.group), bytes=op.bytes)
            if op.collective == "broadcast":
                d["root"] = op.root
        elif op.kind is SEND or op.kind is RECV:
            d.update(peer=op.peer, bytes=op.bytes, tag=op.tag)
        for key in ("category",):
            if getattr(op, key):
                d[key] = getattr(op, key)
        for key in ("microbatch", "stage", "layer"):
            if getattr(op, key) >= 0:
                d[key] = getattr(op, key)
        ops.append(d)
    return {"format": "emulator-trace", "version": 1, "ranks": program.ranks, "ops": ops}

"""Communicator groups of a Chakra trace: the ``pg_name`` of each communication node and
the group file that ASTRA-sim reads beside the ETs.

The format, as the two consumers define it:

- A node names its group in the string attribute ``pg_name`` (Chakra commit 21585d8,
  ``src/converter/pytorch_converter.py`` rows 243-263 write it on collective and on
  send/recv nodes; ``src/feeder/et_feeder_node.cpp`` row 48 reads it as ``string_val``).
- The group file, ASTRA-sim's ``--comm-group-configuration`` (ASTRA-sim commit 518bd51,
  ``astra-sim/workload/Workload.cc`` rows 75-99, ``Workload::initialize_comm_groups``), is one JSON
  object: a group id written as a decimal string → the list of its member ranks, e.g.
  ``{"1": [0, 1], "2": [2, 3]}``. ``Workload::extract_comm_group`` (rows 589-611) takes
  ``pg_name`` "" or "0" as the default group of every rank, ``std::stoi``-s any other
  name and stops with "communicator group N not found" when the file lacks it;
  ``CommunicatorGroup::set_id`` (``astra-sim/system/CommunicatorGroup.cc`` rows 41-47) asserts
  id > 0, so the file never defines "0".
- A trace converted from PyTorch may instead carry its process groups in a
  ``METADATA_NODE`` (PyTorch's "## process_group:init ##"): ``inputs.values`` holds
  ``['[{"pg_name": "1", "ranks": [0, 1]}, ...]']``, an empty ``ranks`` meaning every rank
  (``Workload::issue_pytorch_pg_metadata``, Workload.cc rows 101-134, which strips the outer
  ``['`` and ``']``).

Export names every distinct member set of a collective (and every send/recv pair) with
ids 1, 2, ... in sorted order of the members; the set of all ranks is the default group "0".
"""
from __future__ import annotations

import ast
import json
import os
import re
from typing import Any

from emulator.importers.native import TraceError
from emulator.program import COLLECTIVE, RECV, SEND, Op, Program

GROUP_FILE = "comm_group.json"  # the name the export writes and the import looks for beside the ETs
DEFAULT = "0"  # ASTRA-sim's default group: every rank
_ID = re.compile(r"^[1-9][0-9]{0,8}$")  # a decimal id that std::stoi reads, at least 1


def pair(op: Op) -> tuple[int, ...]:
    """The members of a send/recv: its own rank and its peer, sorted."""
    return tuple(sorted({op.rank, op.peer}))


def members_of(op: Op) -> tuple[int, ...] | None:
    """The group a communication op runs in (None for compute)."""
    if op.kind is COLLECTIVE:
        return op.group
    if op.kind is SEND or op.kind is RECV:
        return pair(op)
    return None


def name_groups(program: Program) -> dict[tuple[int, ...], str]:
    """Member tuple → group name, for every group of ``program``'s communication ops."""
    world = tuple(range(program.ranks))
    found = {m for op in program.ops if (m := members_of(op)) is not None}
    found.discard(world)
    names = {g: str(i) for i, g in enumerate(sorted(found), start=1)}
    names[world] = DEFAULT
    return names


def group_file_text(names: dict[tuple[int, ...], str]) -> str:
    """The group file of ``names``: one group a line, ids in numeric order, the default left out."""
    rows = sorted((int(n), list(g)) for g, n in names.items() if n != DEFAULT)
    if not rows:
        return "{}\n"
    body = ",\n".join(f"  {json.dumps(str(i))}: {json.dumps(g)}" for i, g in rows)
    return "{\n" + body + "\n}\n"


# ---------------------------------------------------------------------------- import


def _line_of(text: str, key: str) -> int:
    m = re.search(r'"' + re.escape(key) + r'"\s*:', text)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def read_group_file(path: str) -> dict[str, tuple[int, ...]]:
    """Group name → members, from an ASTRA-sim group file; TraceError naming file, line and group."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such communicator-group file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read the communicator-group file: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}:{e.lineno}: not JSON ({e.msg}); expected an object of group id → "
                         "list of ranks, e.g. {\"1\": [0, 1]}") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}:1: expected a JSON object of group id → list of ranks, e.g. "
                         f"{{\"1\": [0, 1]}}, got a {type(data).__name__}")
    out: dict[str, tuple[int, ...]] = {}
    for key, value in data.items():
        where = f"{path}:{_line_of(text, key)}: group \"{key}\""
        if not _ID.match(key):
            raise TraceError(f"{where}: expected a decimal group id of at least 1 (ASTRA-sim reserves 0 for the "
                             "group of all ranks)")
        out[key] = _ranks(value, where)
    return out


def _ranks(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise TraceError(f"{where}: expected a non-empty list of ranks, got {json.dumps(value)[:60]}")
    for r in value:
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise TraceError(f"{where}: expected ranks (integers of at least 0), got {json.dumps(r)[:60]}")
    if len(set(value)) != len(value):
        raise TraceError(f"{where}: a rank is listed twice in {value}")
    return tuple(value)


def pytorch_pg_groups(values: str, where: str) -> dict[str, tuple[int, ...]]:
    """The process groups of a PyTorch ``METADATA_NODE`` (its ``inputs.values``); {} if it holds none.
    A group of every rank (PyTorch writes ``"ranks": []``) comes back as ``()``."""
    entries = _pg_entries(values)
    out: dict[str, tuple[int, ...]] = {}
    for e in entries:
        if not isinstance(e, dict) or "pg_name" not in e or "ranks" not in e:
            return {}  # some other metadata
        name = str(e["pg_name"])
        out[name] = _ranks(e["ranks"], f"{where}: process group \"{name}\"") if e["ranks"] != [] else ()
    return out


def _pg_entries(values: str) -> list[Any]:
    """The entries of a METADATA node's ``inputs.values``: Chakra's converter writes ``str(list)``
    of the PyTorch ET's values (commit 21585d8, src/converter/pytorch_converter.py row 306), a
    Python literal holding one JSON string; a JSON list of that string reads the same."""
    data: Any = None
    for parse in (json.loads, ast.literal_eval):
        try:
            data = parse(values)
            break
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], str):
        try:
            data = json.loads(data[0])
        except ValueError:
            return []
    return data if isinstance(data, list) else []


def beside(path: str) -> str | None:
    """The group file next to a trace (a folder of ETs, or one ET file), if there is one."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    candidate = os.path.join(folder, GROUP_FILE)
    return candidate if os.path.isfile(candidate) else None

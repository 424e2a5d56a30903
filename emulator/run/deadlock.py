"""Deadlock reports: why a program can never finish, in words.

When the engine's event queue runs dry with ops unfinished, the report names a dependency
cycle if the unstarted ops form one, and the first unfinished op of each stream with what it
waits for (its dependencies, the other members of its collective, or the peer of its send or
recv).
"""
from __future__ import annotations

from array import array
from typing import Protocol

import simpy

from emulator.errors import ReportError
from emulator.program import COLLECTIVE, RECV, SEND, Op
from emulator.run.copies import Copies


class Engine(Protocol):
    """What a report reads of the engine (``emulator.run.engine.Engine``)."""

    env: simpy.Environment
    tops: list[Op]
    copies: Copies
    T: int
    n: int
    start: array[float]
    end: array[float]
    off: array[int]
    to: array[int]

    def op_id(self, i: int) -> int: ...  # noqa: D102

    def rank(self, i: int) -> int: ...  # noqa: D102


class DeadlockError(ReportError):
    """The program can never finish: some ops wait for something that never comes."""


def deadlock_report(e: Engine, limit: int = 12) -> str:
    """The first unfinished op of each stream (at most ``limit`` streams)."""
    left = sum(1 for x in e.end if x < 0.0)
    lines = [f"deadlock: {left} of {e.n} ops can never finish "
             f"(simulated time {max(e.env.now, max(e.end)):.6g} s). Waiting:"]
    found = cycle(e)
    if found:
        steps = " -> ".join(f"op {e.op_id(i)} (rank {e.rank(i)} {e.tops[i % e.T].stream})" for i in found + found[:1])
        lines[0] = lines[0].replace("deadlock:", "deadlock: a dependency cycle:", 1)
        lines.insert(1, f"  cycle: {steps} (each must end before the next can start: a dependency, "
                        "or the op before it on its stream)")
    shown = 0
    heads: dict[tuple[int, str], int] = {}
    for i in range(e.n):
        if e.end[i] < 0:
            key = (e.rank(i), e.tops[i % e.T].stream)
            if key not in heads:
                heads[key] = i
    for (rank, stream), i in sorted(heads.items()):
        if shown >= limit:
            lines.append(f"  ... and {len(heads) - shown} more streams")
            break
        lines.append(f"  rank {rank} stream {stream}: op {e.op_id(i)} ({why(e, i)})")
        shown += 1
    return "\n".join(lines)


def cycle(e: Engine) -> list[int]:
    """A cycle of ops that never started, each the prerequisite of the next (dependency or stream
    order), as flat op indices; [] when the unfinished ops form no cycle."""
    T, start = e.T, e.start

    def succ(t: int) -> array[int]:
        return e.to[e.off[t]:e.off[t + 1]]

    state: dict[int, int] = {}  # 1: on the current path, 2: done (no cycle through it)
    for root in range(e.n):
        if start[root] >= 0 or root in state:
            continue
        path, stack = [root], [iter(succ(root % T))]
        state[root] = 1
        while stack:
            base = path[-1] - path[-1] % T
            j = next(stack[-1], None)
            if j is None:
                state[path.pop()] = 2
                stack.pop()
                continue
            j += base
            if start[j] >= 0 or state.get(j) == 2:
                continue
            if state.get(j) == 1:
                return path[path.index(j):]
            state[j] = 1
            path.append(j)
            stack.append(iter(succ(j % T)))
    return []


def why(e: Engine, i: int) -> str:
    """Why op ``i`` never finished, in words."""
    op = e.tops[i % e.T]
    if e.start[i] < 0:
        return (f"{op.kind.label} {op.name or op.collective}: not started; waits for its dependencies or the op "
                "before it")
    k = i // e.T
    if op.kind is COLLECTIVE:
        return (f"{op.collective} on group {list(e.copies.group(k, op.group))}: issued, waits for the other members "
                "to issue the matching call")
    if op.kind is SEND:
        return f"send to rank {e.copies.rank(k, op.peer)} tag {op.tag}: no matching recv was ever issued"
    if op.kind is RECV:
        return f"recv from rank {e.copies.rank(k, op.peer)} tag {op.tag}: no matching send was ever issued"
    return f"{op.kind.label}: started but never finished (a transfer with no bandwidth?)"

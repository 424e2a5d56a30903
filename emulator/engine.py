"""The engine: runs each simulated rank's program on SimPy over the fabric.

It owns the op semantics of the IR (``emulator.program``): dependencies, in-order
streams, the rendezvous of collectives, send/recv matching by (src, dst, tag),
and deadlock detection. It records one Span per op.

Hot path notes: ops are indexed by position; each op keeps a counter of unmet
prerequisites (its deps plus the previous op on its stream); no SimPy process
or Resource is created per op — only timeouts with callbacks, and the fabric's.
"""
from __future__ import annotations

from typing import Callable

import simpy

from emulator.devices.gpu import Gpu
from emulator.errors import EmulatorError
from emulator.network.collectives import CollectiveModel, Plan
from emulator.network.fabric import Fabric
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Program
from emulator.spans import Span


class DeadlockError(EmulatorError):
    """The program can never finish: some ops wait for something that never comes."""


class Engine:
    """Runs a Program; ``run()`` returns the spans and the event count."""

    def __init__(self, program: Program, collectives: CollectiveModel, capacity: list[float],
                 gpus: dict[int, Gpu], progress: Callable[[float, int], None] | None = None) -> None:
        self.program = program
        self.ops = program.ops
        self.model = collectives
        self.env = simpy.Environment()
        self.fabric = Fabric(self.env, capacity)
        self.gpus = gpus
        self.progress = progress
        self.fold = program.fold
        # every rank is simulated unless folded away (a rank with no ops still must join its groups)
        self.simulated = set(program.simulated_ranks()) if self.fold else set(range(program.ranks))
        n = len(self.ops)
        self.start = [-1.0] * n
        self.xfer = [0.0] * n
        self.end = [-1.0] * n
        self.waiting = [0] * n
        self.succ: list[list[int]] = [[] for _ in range(n)]
        self.finished = 0
        self.events = 0
        self._rdv: dict[tuple, list[int]] = {}
        self._seq: dict[tuple, int] = {}
        self._p2p: dict[tuple, list[int]] = {}
        self._wire()
        self.dur = [gpus[op.rank].compute_time(op) if op.kind == COMPUTE else 0.0 for op in self.ops]
        self._expected: dict[tuple[int, ...], int] = {}
        collectives.prepare(self._plan_keys(), capacity)

    def _wire(self) -> None:
        index = {op.id: i for i, op in enumerate(self.ops)}
        last_on_stream: dict[tuple[int, str], int] = {}
        for i, op in enumerate(self.ops):
            for d in op.deps:
                self.succ[index[d]].append(i)
                self.waiting[i] += 1
            key = (op.rank, op.stream)
            prev = last_on_stream.get(key)
            if prev is not None:
                self.succ[prev].append(i)
                self.waiting[i] += 1
            last_on_stream[key] = i

    def _plan_keys(self) -> list[tuple]:
        keys = set()
        for op in self.ops:
            if op.kind == COLLECTIVE:
                keys.add((op.collective, op.group, op.root))
            elif op.kind == SEND:
                keys.add(("p2p", (op.rank, op.peer), op.rank))
        return sorted(keys, key=repr)

    # -- running ----------------------------------------------------------------
    def run(self) -> tuple[list[Span], int]:
        ready = [i for i, w in enumerate(self.waiting) if w == 0]
        self._release(ready)
        env = self.env
        step = env.step
        events = 0
        tick = 50_000
        try:
            while True:
                step()
                events += 1
                if self.progress is not None and events % tick == 0:
                    self.progress(env.now, events)
        except simpy.core.EmptySchedule:
            pass
        self.events = events
        if self.finished < len(self.ops):
            raise DeadlockError(self._deadlock_report())
        return self._spans(), events

    def _release(self, ready: list[int]) -> None:
        """Start every op in ``ready``; zero-time completions are handled iteratively."""
        ops = self.ops
        now = self.env.now
        start, dur, timeout, done = self.start, self.dur, self.env.timeout, self._done
        while ready:
            i = ready.pop()
            op = ops[i]
            start[i] = now
            kind = op.kind
            if kind == COMPUTE:
                d = dur[i]
                if d <= 0.0:
                    self.end[i] = now
                    self.finished += 1
                    self._successors(i, ready)
                else:
                    timeout(d).callbacks.append(lambda _e, i=i: done(i))
            elif kind == COLLECTIVE:
                self._arrive_collective(i)
            elif kind == SEND:
                self._arrive_p2p(i, self._send_key(op), 0)
            elif kind == RECV:
                self._arrive_p2p(i, (op.rank, op.peer, op.tag), 1)

    def _successors(self, i: int, ready: list[int]) -> None:
        waiting = self.waiting
        for j in self.succ[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)

    def _done(self, i: int) -> None:
        self.end[i] = self.env.now
        self.finished += 1
        ready: list[int] = []
        self._successors(i, ready)
        if ready:
            self._release(ready)

    def _done_many(self, members: list[int]) -> None:
        now = self.env.now
        ready: list[int] = []
        for i in members:
            self.end[i] = now
            self.finished += 1
            self._successors(i, ready)
        if ready:
            self._release(ready)

    # -- collectives ------------------------------------------------------------
    def _arrive_collective(self, i: int) -> None:
        op = self.ops[i]
        gkey = (op.rank, op.group)
        seq = self._seq.get(gkey, 0)
        self._seq[gkey] = seq + 1
        key = (op.group, seq)
        arrived = self._rdv.setdefault(key, [])
        arrived.append(i)
        expected = self._expected.get(op.group)
        if expected is None:
            expected = self._expected[op.group] = sum(1 for r in op.group if r in self.simulated)
        if len(arrived) < expected:
            return
        del self._rdv[key]
        first = self.ops[arrived[0]]
        for j in arrived[1:]:
            o = self.ops[j]
            if o.collective != first.collective or o.bytes != first.bytes:
                raise EmulatorError(
                    f"collective mismatch on group {list(op.group)} (call #{seq}): op {first.id} on rank {first.rank} "
                    f"is {first.collective} of {first.bytes:g} B but op {o.id} on rank {o.rank} is "
                    f"{o.collective} of {o.bytes:g} B")
        plan = self.model.collective(first.collective, first.group, first.root)
        self._run_plan(plan, first.bytes, arrived)

    def _run_plan(self, plan: Plan, nbytes: float, members: list[int]) -> None:
        now = self.env.now
        for i in members:
            self.xfer[i] = now
        if not plan:  # a group of one: done now, via the queue (no deep recursion)
            self.env.timeout(0.0).callbacks.append(lambda _e: self._done_many(members))
            return
        self._phase(plan, 0, nbytes, members)

    def _phase(self, plan: Plan, p: int, nbytes: float, members: list[int]) -> None:
        flows = plan[p]
        if not flows:
            self._next_phase(plan, p, nbytes, members)
            return
        left = [len(flows)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._next_phase(plan, p, nbytes, members)

        transfer = self.fabric.transfer
        for f in flows:
            transfer(f.links, f.weights, nbytes * f.volume, f.latency, one_done)

    def _next_phase(self, plan: Plan, p: int, nbytes: float, members: list[int]) -> None:
        if p + 1 < len(plan):
            self._phase(plan, p + 1, nbytes, members)
        else:
            self._done_many(members)

    # -- point to point -----------------------------------------------------------
    def _send_key(self, op) -> tuple[int, int, int]:
        """Match key (dst, src, tag) as seen by the receiver, which may be a representative."""
        dst, src = op.peer, op.rank
        fold = self.fold
        if fold is not None and dst not in self.simulated:
            c = fold.coords(dst)
            back = tuple(-x if f else 0 for x, f in zip(c, fold.folded))
            dst, src = fold.translate(dst, back), fold.translate(src, back)
        return dst, src, op.tag

    def _arrive_p2p(self, i: int, key: tuple[int, int, int], side: int) -> None:
        pair = self._p2p.get(key)
        if pair is None:
            pair = self._p2p[key] = [[], []]
        pair[side].append(i)
        if pair[0] and pair[1]:
            s = pair[0].pop(0)
            r = pair[1].pop(0)
            if not pair[0] and not pair[1]:
                del self._p2p[key]
            send = self.ops[s]
            plan = self.model.p2p(send.rank, send.peer)
            self._run_plan(plan, send.bytes, [s, r])

    # -- results --------------------------------------------------------------------
    def _spans(self) -> list[Span]:
        out = []
        start, end, xfer = self.start, self.end, self.xfer
        for i, op in enumerate(self.ops):
            out.append(Span(op.id, op.rank, op.stream, op.kind, op.name or op.collective or op.kind,
                            start[i], end[i], op.bytes, op.flops, op.microbatch, op.stage,
                            op.category, xfer[i] if op.kind != COMPUTE else start[i], op.layer))
        return out

    def _deadlock_report(self, limit: int = 12) -> str:
        lines = [f"deadlock: {len(self.ops) - self.finished} of {len(self.ops)} ops can never finish "
                 f"(simulated time {self.env.now:.6g} s). Waiting:"]
        shown = 0
        heads: dict[tuple[int, str], int] = {}
        for i, op in enumerate(self.ops):
            if self.end[i] < 0 and (op.rank, op.stream) not in heads:
                heads[(op.rank, op.stream)] = i
        for (rank, stream), i in sorted(heads.items()):
            if shown >= limit:
                lines.append(f"  ... and {len(heads) - shown} more streams")
                break
            lines.append(f"  rank {rank} stream {stream}: op {self.ops[i].id} ({self._why(i)})")
            shown += 1
        return "\n".join(lines)

    def _why(self, i: int) -> str:
        op = self.ops[i]
        if self.start[i] < 0:
            return f"{op.kind} {op.name or op.collective}: not started; waits for its dependencies or the op before it"
        if op.kind == COLLECTIVE:
            return (f"{op.collective} on group {list(op.group)}: issued, waits for the other members "
                    "to issue the matching call")
        if op.kind == SEND:
            return f"send to rank {op.peer} tag {op.tag}: no matching recv was ever issued"
        if op.kind == RECV:
            return f"recv from rank {op.peer} tag {op.tag}: no matching send was ever issued"
        return f"{op.kind}: started but never finished (a transfer with no bandwidth?)"

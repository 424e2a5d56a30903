"""The engine: runs each simulated rank's program on SimPy over the fabric.

It owns the op semantics of the IR (``emulator.program``): dependencies, in-order
streams, the rendezvous of collectives (the calls of a communicator match in program
order, as NCCL matches them in issue order, whatever stream each runs on), send/recv
matching by (src, dst, tag), the sharing of one GPU by compute ops on several of its
streams (``emulator.devices.sharing``; a rank with one compute stream keeps the fast
path below), one hardware queue a GPU where the job sets CUDA_DEVICE_MAX_CONNECTIONS=1 (``queued``: an
op is launched only after the op its rank issued before it, ``wiring.issue_order``, so an op that waits for
its stream or a dep holds back every op issued after it), and deadlock detection. It records one Span
per op (``emulator.spans.SpanTable``).

Hot path notes: ops are indexed by position; each op keeps a counter of unmet
prerequisites (its deps plus the previous op on its stream), in flat arrays; no SimPy process
or Resource is created per op. *Timed* ops — a compute op on a GPU it has alone, and a
private collective (``emulator.run.private``: its links carry nothing else, one member is
simulated) —
depend on nothing but their start, so ``_advance`` finishes them as soon as their start is
known, ahead of the clock, and hands their end to their successors (``ready_at``); only ops
that meet other ranks or share something (collectives, sends, receives, shared GPUs) wait
for the clock, by one timeout per distinct start time; a collective whose group has one simulated
member and whose plan is one flow (a folded TP pair, mostly) waits for no one either, and is handed
to the fabric as soon as its start is known, to begin then (``_issue``, ``Fabric.transfer_at``: one
event fewer each; DeepSeek-V3 1024 0.78M → 0.51M events; flows that begin together may then be
placed in another order, which moved its iteration time by 4e-16). The results are those of running
every op on the clock, to the last bit: a private collective ends at its start plus its
duration alone, where the fabric sums its steps at the run's absolute time (2.6e-12 of its
length at t ≈ 8 s; a contended fabric can carry that to 4.8e-10 of a 4:1 fat-tree's
iteration). With far fewer events: GPT 1T on 512 A100 (64 ranks simulated,
1.84M ops) 3.88M → 0.26M events. Before this, compute ops ending at one time shared one
timeout, which cut an unfolded 1024-GPU run from 16.6M to 3.6M events.

Templates: a ``Stamped`` program (``emulator.run.folding``: every rank simulated,
given as the representatives' ops plus the translations that copy them) is run
without materialising its copies. Static facts (kind, successors, initial
prerequisite count, duration) are kept once per template op t; copy k's op is
entry k·T + t of the flat per-op lists (start, end, xfer, waiting). Deps never
leave a rank, so successors of a copy are the template's, shifted by k·T. A plain
Program is the one-copy case. This removed the 21M-Op unfold, most of the wiring
and validation, and the Span list, of a 1024-GPU unfolded run. A Stamped program may
also keep a fold (``folding.restamp``: data-parallel replicas whose fold in effect was
refused, each simulated, with their tensor-parallel peers still folded): each copy then
has private collectives of its own, and its blocks run as one op where every copy's
block collectives take as long as the template's (``PrivateRuns._copies_alike``). GPT 530B on
2,520 A100: one build of 35 ranks instead of two (the second of 315), 1.44 GB → 0.57 GB,
23.8 → 11.5 s, the same iteration time to the last bit.
"""
from __future__ import annotations

from array import array
from collections.abc import Collection, Iterable
from typing import Any, Callable

import simpy

from emulator.devices.gpu import Gpu
from emulator.errors import EmulatorError
from emulator.network.collectives import CollectiveModel
from emulator.network.fabric import Fabric, delay_to
from emulator.network.flows import FlowSpec, Plan
from emulator.program import COLLECTIVE, COMPUTE, OFF_SM_STREAMS, RECV, SEND, Op, Program, runs_ahead
from emulator.run.block import OpenedFields, opened_times
from emulator.run.copies import Copies
from emulator.run.deadlock import DeadlockError, deadlock_report
from emulator.run.folding import Stamped, back
from emulator.run.private import PrivateRuns
from emulator.run.shared_gpus import SharedGpus
from emulator.run.wiring import OpFields, call_numbers, issue_order, sharing, wire
from emulator.spans import SpanTable

__all__ = ["BLOCK", "DeadlockError", "Engine", "PROGRESS_EVERY"]

# Events between two calls of the progress callback. It is also the length of the inner
# loop that calls SimPy's step(), so counting events costs nothing per event. Chosen with
# the engine (not tuned): at about 1 µs per event it reports every ~0.05 s of wall time,
# often enough for the CLI's progress line, rarely enough to cost nothing.
PROGRESS_EVERY = 50_000

BLOCK = 4  # the engine's kind of a block op (Op.parts), beside the OpKind values

GroupKey = tuple[int, tuple[int, ...]]  # (world rank, its group), of one copy
P2PKey = tuple[int, int, int]  # (dst, src, tag) as the receiver sees it


class Engine:
    """Runs a Program; ``run()`` returns the spans and the event count.

    It delegates its bookkeeping to small helpers: the static wiring of the ops
    (``emulator.run.wiring``), the copies of a stamped program (``emulator.run.copies``),
    private collectives and block ops run alone (``emulator.run.private``), GPUs shared by
    several compute streams (``emulator.run.shared_gpus``) and the deadlock report
    (``emulator.run.deadlock``). What stays here is the op semantics on the clock."""

    def __init__(self, program: Program, collectives: CollectiveModel, capacity: list[float],
                 gpus: dict[int, Gpu], progress: Callable[[float, int], None] | None = None,
                 blocks: bool = True, queued: Collection[int] = ()) -> None:
        self.program = program
        self.env = simpy.Environment()
        self.fabric = Fabric(self.env, capacity)
        self.gpus = gpus
        self.progress = progress
        self.fold = program.fold
        # every rank is simulated unless folded away (a rank with no ops still must join its groups)
        self.simulated = set(program.simulated_ranks()) if self.fold else set(range(program.ranks))
        self.tops: list[Op] = program.template if isinstance(program, Stamped) else program.ops
        self.copies = copies = Copies(program)
        self.stride = copies.stride
        self._tr = copies.rank  # bound once: the hot paths call it directly
        self._group = copies.group
        self._ckeys: list[dict[GroupKey, GroupKey]] = [{} for _ in range(copies.count)]
        self.model = collectives
        self.runs = runs = PrivateRuns(self.tops, collectives, self.fabric, copies, gpus)
        keys = runs.plan_keys()
        collectives.prepare(keys, capacity)
        groups_ok = runs.groups(keys, self.simulated)
        # GPUs whose compute slows while their communication is resident (catalog comm_overlap_slowdown)
        overlap = {r: g.spec.comm_overlap_slowdown for r, g in gpus.items()
                   if g.spec is not None and g.spec.comm_overlap_slowdown > 1.0}
        self.overlap = overlap
        if overlap or not all(groups_ok.values()) or any(op.kind is SEND for op in self.tops):
            self.fabric.set_slack(collectives.slack)  # else no flow ever reaches the fabric: none to find
        if any(op.parts for op in self.tops) and not runs.blocks_hold(groups_ok, blocks and not overlap):
            self.tops = runs.tops = Program(program.ranks, self.tops).expanded().ops  # run their ops one by one
        self.T = len(self.tops)
        n = self.T * copies.count
        self.n = n
        # plain ints (OpKind values) for the hot path: an int compares in C, the enum in Python; a
        # block op is BLOCK
        self.kind: list[int] = [BLOCK if op.parts else int(op.kind) for op in self.tops]
        self.off, self.to, wait = wire(self.tops)
        # the same successors as a tuple per op, for the hot loops: iterating a tuple makes no int
        # objects, where a slice of the array makes the slice and an int per entry (~0.1 µs an op)
        to = self.to
        self.succ = [tuple(to[a:b]) for a, b in zip(self.off, self.off[1:])]
        self.call = call_numbers(self.tops)
        # one hardware queue on the GPUs of ``queued`` (template ranks): an op is launched only once the op its rank
        # issued before it is
        self.issue_next: array[int] | None = issue_order(self.tops, frozenset(queued)) if queued else None
        for j in self.issue_next or ():
            if j >= 0:
                wait[j] += 1
        self.shares = sharing(self.tops)
        self.shared = SharedGpus(self.env, overlap, self._kernels_ended)
        # flat arrays, not lists: no float object per op, and nothing for the garbage collector
        # to traverse (a full collection walking four 21M-entry lists cost ~1/3 of a 1024-GPU run)
        self.waiting = array("q", wait) * copies.count
        self.start = array("d", [-1.0]) * n
        self.xfer = array("d", [0.0]) * n
        self.end = array("d", [-1.0]) * n
        self.ready_at = array("d", [0.0]) * n  # the latest end among an op's finished prerequisites
        self.events = 0
        self._rdv: dict[tuple[tuple[int, ...], int], list[int]] = {}  # (group, call #) → ops that arrived
        self._ahead: dict[tuple[str, str, int], bool] = {}  # (collective, stream, members) → ``runs_ahead``
        self._p2p: dict[P2PKey, list[list[int]]] = {}  # [waiting sends, waiting recvs]
        self._later_at: dict[float, list[int]] = {}  # start time → ops whose start was decided early
        self._expected: dict[tuple[int, ...], int] = {}
        self.private = bytearray(op.kind is COLLECTIVE and groups_ok[op.group] for op in self.tops)
        self.durs = self._durations()
        if overlap:  # compute then depends on what else runs: every GPU kernel goes through SharedGpu
            self.shares = bytearray(op.kind is COMPUTE and op.stream not in OFF_SM_STREAMS for op in self.tops)
            self.private = bytearray(self.T)
        self.timed = bytearray(op.kind is COMPUTE and not sh for op, sh in zip(self.tops, self.shares))
        # collectives that may be issued ahead of the clock (``_issue``): not with the GPUs' overlap slowdown,
        # which counts the communication resident from its start on the clock
        self.early = bytearray(op.kind is COLLECTIVE and not overlap for op in self.tops)
        self._solos: list[tuple[FlowSpec, float] | bool | None] = [None] * self.T  # ``_issue``'s, of copy 0
        self._pkey, self._ppair = self._p2p_keys()
        runs.index_shapes()
        # per copy: the sends or recvs waiting for their match, by template key; each send pair's plan
        self._pwait: list[dict[P2PKey, list[Any]]] = [{} for _ in range(copies.count)]
        npairs = max(self._ppair, default=-1) + 1
        self._pplan: list[list[tuple[Plan, Any] | None]] = [[None] * npairs for _ in range(copies.count)]

    # -- copies ------------------------------------------------------------------
    def op_id(self, i: int) -> int:
        """The program's id of flat op ``i``."""
        k, t = divmod(i, self.T)
        return self.tops[t].id + k * self.stride

    def rank(self, i: int) -> int:
        """The world rank of flat op ``i``."""
        k, t = divmod(i, self.T)
        return self._tr(k, self.tops[t].rank)

    # -- preparation -------------------------------------------------------------
    def _durations(self) -> list[array[float]]:
        """Per copy, the duration of each template op (a block's: its last part's end after its
        start); copies whose ranks have the same slowdowns share one list."""
        gpus = self.gpus
        ranks = sorted({op.rank for op in self.tops})
        cache: dict[tuple[float, ...], array[float]] = {}
        out = []
        for k in range(self.copies.count):
            sig = tuple(gpus[self._tr(k, r)].slowdown if self._tr(k, r) in gpus else 1.0 for r in ranks)
            d = cache.get(sig)
            if d is None:
                d = cache[sig] = array("d", [self.runs.block(t, op) if op.parts else
                                             gpus[self._tr(k, op.rank)].compute_time(op) if op.kind is COMPUTE
                                             else 0.0 for t, op in enumerate(self.tops)])
            out.append(d)
        return out

    # -- running ----------------------------------------------------------------
    def run(self) -> tuple[SpanTable, int]:
        """Run to the end; return the spans and the number of SimPy events processed."""
        if self.fabric.rewrite is not None:  # timed faults change links mid-run: every flow is simulated,
            self.private = bytearray(self.T)  # on every link (a detour is no prepared plan: no slack proof)
            self.fabric.set_slack(set())
        self.timed = bytearray(bool(tm or pv) for tm, pv in zip(self.timed, self.private))
        self.early = bytearray(bool(e and not pv) for e, pv in zip(self.early, self.private))
        T = self.T
        heads = [t for t in range(T) if self.waiting[t] == 0]  # every copy starts like the template
        self._advance([k * T + t for k in range(self.copies.count) for t in heads])
        env = self.env
        step = env.step
        events = 0
        tick = PROGRESS_EVERY
        j = 0
        try:
            while True:
                for j in range(tick):
                    step()
                events += tick
                if self.progress is not None:
                    self.progress(env.now, events)
        except simpy.core.EmptySchedule:
            events += j
        self.events = events
        if self.n and min(self.end) < 0.0:
            raise DeadlockError(deadlock_report(self))
        return self._spans(), events

    def _advance(self, ready: list[int]) -> None:
        """Start every op in ``ready`` (last first), at the latest end of its prerequisites.

        A *timed* op (a compute op on a GPU it has alone, or a private collective: see
        ``_private``) depends on nothing but its start, so it is finished at once, ahead of the
        simulated clock: its end is its start plus its duration, and its successors learn that
        end (``ready_at``). Chains of timed ops so cost no SimPy event. Any other op whose start
        lies ahead of the clock is started by one timeout at that time (``_later``); one due now
        starts now (``_start``)."""
        now = self.env.now
        T, timed, start, xfer, end, durs = self.T, self.timed, self.start, self.xfer, self.end, self.durs
        succ, waiting, ready_at, kind = self.succ, self.waiting, self.ready_at, self.kind
        listening, owe = bool(self.fabric.listeners), self.fabric.owe
        runs, early = self.runs, self.early
        nxt = self.issue_next
        while ready:
            i = ready.pop()
            k, t = divmod(i, T)
            at = ready_at[i]
            if nxt is not None and nxt[t] >= 0:  # launched: the next op issued may be launched too
                self._launched(nxt[t] + i - t, at, ready)
            if not timed[t]:
                if at > now:
                    if not (early[t] and self._issue(i, k, t, at)):
                        self._later(i, at)
                else:
                    self._start(i, k, t, now)
                continue
            start[i] = xfer[i] = at
            c = kind[t]
            if c == 0:
                e = at + durs[k][t]
            elif c == 1:
                e = at + runs.time(k, t, at)
            else:  # BLOCK: its collectives move their bytes at their times
                e = at + durs[k][t]
                if listening:
                    for dt, solo in (runs.replays[t] if not k else runs.replays_of(k, t)):
                        runs.replay(solo, at + dt)
                else:  # only the bytes: one flat list per copy and block shape, owed to the fabric (``Fabric.owe``)
                    flat = runs.moved[k][runs.shape[t]]
                    if flat is None:
                        flat = runs.moved_of(k, t)
                    owe(flat)
            end[i] = e
            base = i - t  # copy k's ops are the template's, shifted by k·T
            for j in succ[t]:
                j += base
                if ready_at[j] < e:
                    ready_at[j] = e
                w = waiting[j] - 1
                waiting[j] = w
                if not w:
                    ready.append(j)

    def _launched(self, j: int, at: float, ready: list[int]) -> None:
        """One hardware queue: the op issued before flat op ``j`` was launched at ``at``; ``j`` joins ``ready`` if
        that was its last prerequisite (``issue_order``)."""
        if self.ready_at[j] < at:
            self.ready_at[j] = at
        self.waiting[j] -= 1
        if not self.waiting[j]:
            ready.append(j)

    def _later(self, i: int, at: float) -> None:
        """Start op ``i`` at the future time ``at`` (ops due at one time share one timeout)."""
        batch = self._later_at.get(at)
        if batch is None:
            self._later_at[at] = [i]
            self.env.timeout(delay_to(self.env.now, at), at).callbacks.append(self._due)
        else:
            batch.append(i)

    def _due(self, event: simpy.Event) -> None:
        """The ops due at this timeout's time start now, in the order they were put off."""
        ops = self._later_at.pop(event.value)  # type: ignore[arg-type]  # simpy types every value Optional[Any]
        now, T = self.env.now, self.T
        for i in ops:
            k, t = divmod(i, T)
            self._start(i, k, t, now)

    def _start(self, i: int, k: int, t: int, now: float) -> None:
        """Start op ``i`` (copy ``k`` of template op ``t``), which is not timed, now."""
        self.start[i] = now
        c = self.kind[t]
        if c == 0:  # OpKind.COMPUTE on a shared GPU
            self.xfer[i] = now
            d = self.durs[k][t]
            if d > 0.0:
                self.shared.start(self._tr(k, self.tops[t].rank), i, d, now)
            else:
                self._done_many([i])
            return
        if self.overlap and c == 1:
            self.shared.resident(i, self._tr(k, self.tops[t].rank), now, 1)
        if c == 1:  # OpKind.COLLECTIVE
            self._arrive_collective(i, k, t)
        elif self._pkey is not None:  # OpKind.SEND (2) or RECV (3), matched copy by copy
            self._match(i, k, t, c == 2)
        elif c == 2:  # OpKind.SEND
            self._arrive_p2p(i, self._send_key(k, self.tops[t]), 0)
        else:  # OpKind.RECV
            op = self.tops[t]
            self._arrive_p2p(i, (self._tr(k, op.rank), self._tr(k, op.peer), op.tag), 1)

    def _complete(self, finished: Iterable[int], now: float, ready: list[int], start_each: bool = False) -> None:
        """Mark the ``finished`` ops ended at ``now``; append to ``ready`` each successor that this
        leaves with no unmet prerequisite (the successor-release loop of ops the clock finishes;
        ``_advance`` has the timed ops' own).

        With ``start_each``, the successors of each op are started (``_advance`` empties
        ``ready``) before the next op ends: ops that end together keep their start order."""
        T, succ, waiting, end, ready_at = self.T, self.succ, self.waiting, self.end, self.ready_at
        for i in finished:
            end[i] = now
            t = i % T
            base = i - t
            for j in succ[t]:
                j += base
                if ready_at[j] < now:
                    ready_at[j] = now
                w = waiting[j] - 1
                waiting[j] = w
                if not w:
                    ready.append(j)
            if start_each and ready:
                self._advance(ready)

    def _kernels_ended(self, finished: list[int], now: float) -> None:
        """Kernels of a shared GPU ended now (``SharedGpus``): each one's successors start before the
        next one ends, so that ops ending together keep their start order."""
        self._complete(finished, now, [], True)

    def _done_many(self, members: list[int]) -> None:
        """The ops of a finished transfer (a collective's members, or a send and its recv) ended
        now; their successors start together, after all of them ended."""
        if self.overlap:
            now = self.env.now
            for i in members:
                self.shared.resident(i, self.rank(i), now, -1)
        ready: list[int] = []
        self._complete(members, self.env.now, ready)
        if ready:
            self._advance(ready)

    # -- collectives ------------------------------------------------------------
    def _arrive_collective(self, i: int, k: int, t: int) -> None:
        """Op ``i`` (copy ``k`` of template op ``t``) issued its collective; the last member starts it."""
        op = self.tops[t]
        keys = self._ckeys[k]
        gkey = keys.get((op.rank, op.group))
        if gkey is None:  # (rank, group) of this copy; the template's key when it is the identity
            gkey = keys[(op.rank, op.group)] = (self._tr(k, op.rank), self._group(k, op.group))
        group = gkey[1]
        seq = self.call[t]
        key = (group, seq)
        arrived = self._rdv.get(key)
        if arrived is None:
            arrived = self._rdv[key] = []
        arrived.append(i)
        expected = self._expected.get(group)
        if expected is None:
            expected = self._expected[group] = sum(1 for r in group if r in self.simulated)
        if len(arrived) < expected:
            return
        del self._rdv[key]
        T, tops = self.T, self.tops
        k0, t0 = divmod(arrived[0], T)
        first = tops[t0]
        for j in arrived[1:]:
            o = tops[j % T]
            if o.collective != first.collective or o.bytes != first.bytes:
                raise EmulatorError(
                    f"collective mismatch on group {list(group)} (call #{seq}): op {self.op_id(arrived[0])} on rank "
                    f"{self.rank(arrived[0])} is {first.collective} of {first.bytes:g} B but op {self.op_id(j)} on "
                    f"rank {self.rank(j)} is {o.collective} of {o.bytes:g} B")
        plan = self.model.collective(first.collective, group, self._tr(k0, first.root), first.bytes)
        call = (first.collective, first.stream, expected)
        ahead = self._ahead.get(call)
        if ahead is None:
            ahead = self._ahead[call] = runs_ahead(*call)
        self._run_plan(plan, first.bytes, arrived, ahead)

    def _issue(self, i: int, k: int, t: int, at: float) -> bool:
        """Issue collective ``i`` (copy ``k`` of template op ``t``), due at ``at`` ahead of the clock, now,
        where that changes nothing: its group has one simulated member (no one else's arrival decides
        when it starts) and its plan is one flow (``Fabric.transfer_at`` begins it at its time, as its
        start there would; a TP pair's ring, mostly). One event fewer per collective. False otherwise."""
        hit = self._solos[t] if not k else None  # copy 0's, kept per template op
        if hit is None:
            hit = self._solo(k, t)
            if not k:
                self._solos[t] = hit
        if not hit:
            return False
        f, nbytes = hit  # type: ignore[misc]  # a pair where not False
        self.start[i] = self.xfer[i] = at
        self.fabric.transfer_at(at, f.links, f.weights, nbytes, f.latency, lambda: self._done_many([i]))
        return True

    def _solo(self, k: int, t: int) -> tuple[FlowSpec, float] | bool:
        """The one flow of collective ``t`` of copy ``k`` and its bytes, where ``_issue`` may issue it
        ahead of the clock; else False."""
        op = self.tops[t]
        keys = self._ckeys[k]
        gkey = keys.get((op.rank, op.group))
        if gkey is None:
            gkey = keys[(op.rank, op.group)] = (self._tr(k, op.rank), self._group(k, op.group))
        group = gkey[1]
        expected = self._expected.get(group)
        if expected is None:
            expected = self._expected[group] = sum(1 for r in group if r in self.simulated)
        if expected != 1:
            return False
        plan = self.model.collective(op.collective, group, self._tr(k, op.root), op.bytes)
        if len(plan) != 1 or len(plan[0]) != 1:
            return False
        f = plan[0][0]
        return f, op.bytes * f.volume

    def _run_plan(self, plan: Plan, nbytes: float, members: list[int], ahead: bool = False) -> None:
        """The transfer of ``members`` begins now: the fabric runs the plan's phases (with ``ahead``, a MoE token
        dispatch's or a layer's collective of one simulated member, ``program.runs_ahead``, ahead of the clock
        where its links are free, ``Fabric.run_plan``: its one flow per rank of a group that the fold maps onto
        itself would otherwise each cost events and solves)."""
        now = self.env.now
        for i in members:
            self.xfer[i] = now
        if not plan:  # a group of one: done now, via the queue (no deep recursion)
            self.env.timeout(0.0).callbacks.append(lambda _e: self._done_many(members))
            return
        self.fabric.run_plan(plan, nbytes, lambda: self._done_many(members), ahead)

    # -- point to point -----------------------------------------------------------
    def _send_key(self, k: int, op: Op) -> P2PKey:
        """Match key (dst, src, tag) as seen by the receiver, which may be a representative."""
        dst, src = self._tr(k, op.peer), self._tr(k, op.rank)
        fold = self.fold
        if fold is not None and dst not in self.simulated:
            dst, src = back(fold, dst, src)
        return dst, src, op.tag

    def _arrive_p2p(self, i: int, key: P2PKey, side: int) -> None:
        """Op ``i`` posted its side (0 send, 1 recv) of ``key``; the oldest complete pair starts."""
        pair = self._p2p.get(key)
        if pair is None:
            pair = self._p2p[key] = [[], []]
        pair[side].append(i)
        if pair[0] and pair[1]:
            s = pair[0].pop(0)
            r = pair[1].pop(0)
            if not pair[0] and not pair[1]:
                del self._p2p[key]
            k, t = divmod(s, self.T)
            send = self.tops[t]
            plan = self.model.p2p(self._tr(k, send.rank), self._tr(k, send.peer))
            self._run_plan(plan, send.bytes, [s, r])

    def _p2p_keys(self) -> tuple[list[P2PKey] | None, array[int]]:
        """Per template op, the match key of a send or recv as copy 0 sees it (``_send_key``), and per
        send, the index of its (rank, peer) pair; keys None where a copy's ops might match another
        copy's (a key with a rank outside the template's: then every key is made per op, in world
        ranks, ``_arrive_p2p``).

        Copy k's world key is the template key translated by k: translations along the stamped axes
        commute with the fold's (disjoint axes of one grid) and map the simulated ranks onto
        themselves (the copies' shifts are a group), and copies' ranks are disjoint; so two ops of
        one copy match in world ranks exactly when their template keys are equal, and ops of two
        copies never do when every key's ranks are the template's."""
        ranks = {op.rank for op in self.tops}
        keys: list[P2PKey] = [(-1, -1, -1)] * self.T
        pairs = array("q", [-1]) * self.T
        index: dict[tuple[int, int], int] = {}
        for t, op in enumerate(self.tops):
            if op.kind is SEND:
                key = self._send_key(0, op)
                pairs[t] = index.setdefault((op.rank, op.peer), len(index))
            elif op.kind is RECV:
                key = (op.rank, op.peer, op.tag)
            else:
                continue
            if self.copies.count > 1 and not (key[0] in ranks and key[1] in ranks):
                return None, pairs
            keys[t] = key
        return keys, pairs

    def _match(self, i: int, k: int, t: int, send: bool) -> None:
        """Op ``i`` (copy ``k`` of template send or recv ``t``) is posted; with the oldest waiting op
        of the other side and the same key, its transfer starts (NCCL matches a peer's sends and
        receives in the order they are posted)."""
        key = self._pkey[t]  # type: ignore[index]  # set when this path is taken
        waits = self._pwait[k]
        q = waits.get(key)  # [side waiting (True: sends), its ops oldest first]: one side waits at a time
        if q is None:
            waits[key] = [send, i]
            return
        if q[0] is send:
            q.append(i)
            return
        j = q.pop(1)
        if len(q) == 1:
            del waits[key]
        s, r = (i, j) if send else (j, i)
        ts = s - k * self.T
        pi = self._ppair[ts]
        plans = self._pplan[k]
        hit = plans[pi]
        if hit is None:
            op = self.tops[ts]
            plan = self.model.p2p(self._tr(k, op.rank), self._tr(k, op.peer))
            hit = plans[pi] = (plan, plan[0][0] if len(plan) == 1 and len(plan[0]) == 1 else None)
        plan, flow = hit
        if flow is None:
            self._run_plan(plan, self.tops[ts].bytes, [s, r])
            return
        # one flow, one phase (a transfer within a node or between two NICs): the fabric's transfer
        # itself, as ``Fabric.run_plan`` would start it
        now = self.env.now
        self.xfer[s] = self.xfer[r] = now
        self.fabric.transfer(flow.links, flow.weights, self.tops[ts].bytes * flow.volume, flow.latency,
                             lambda: self._done_many([s, r]))

    # -- results --------------------------------------------------------------------
    def _spans(self) -> SpanTable:
        """The run's spans (made lazily from the flat per-op arrays and the template ops), a
        block's one per part."""
        ranks = {op.rank for op in self.tops}
        maps: list[dict[int, int] | None] = []
        for k, m in enumerate(self.copies.rank_maps):
            if m is not None:
                for r in ranks:
                    self._tr(k, r)
            maps.append(m)
        if self.runs.rel:
            start, end, xfer = opened_times(self.tops, self.runs.rel, self.start, self.end, self.xfer, len(maps))
            # memoryviews of the numpy arrays, not copies: they slice and iterate as Python floats
            return SpanTable(OpenedFields(self.tops), maps, self.stride, memoryview(start), memoryview(end),
                             memoryview(xfer))
        return SpanTable(OpFields(self.tops), maps, self.stride, self.start, self.end, self.xfer)

"""The record of a live run: the local rank's emulated communication, its waits, its iterations.

Pure Python (no torch): the backend calls it, the report reads it.

Timing rules (DESIGN.md, "Live emulation"):
- a collective is issued at the local rank's ``now()``; every other member is a
  symmetric copy and issues it at the same moment, so it starts when its
  stream is free: start = max(issue, end of the previous op on that stream);
- each process group has its own communication stream (as NCCL does), so
  communication overlaps the local compute and other groups' communication;
- it ends at start + the cost on the emulated cluster (``CommCost``);
- the local rank blocks only where it waits: ``Work.wait()``, the end of a
  backward pass (for what was issued during it: DDP's gradient buckets), an
  optimizer step, a barrier, the end of the script. A blocked interval is
  *exposed communication*.
- an iteration ends at each optimizer step (after the step).

Several real ranks (``emulator live --real K``, ``emulator.live.mirror``): a group
whose members are all real runs on the real transport, and its record ends when
the real work completes (``issue_real`` / ``complete``). A mixed group is costed
as above, but it starts at the latest *arrival* of its members: each real
member's own issue time, exchanged by the backend.

Stragglers (``slow``: emulated rank → compute factor f, ``emulator.live.faults``):
an emulated rank's compute is its mirror's measured compute × f. The session keeps
how far each such rank lags behind its mirror: every stretch of the local rank's
compute c (time not blocked) adds (f − 1)·c; the rank arrives at a collective
``lag`` after its mirror, and the collective starts when the last member arrives;
waiting on a collective it joined brings it level: it waited for the same end, and then, as
its mirror, takes the mirror's time to wake up (the wall clock's overshoot of the wait, the
arrival exchange among the real ranks), unless its own compute is still running.

Arrival skew (``skew``: (a, b) of ``emulator.live.skew``, or None: off): an emulated member
of a collective arrives ``lag`` = (e_n − e_k)·(a + b·c) after its mirror, c the local rank's
compute since its last wait on communication, n the members, k the real ones among them
(whose skew is measured); so a collective with emulated members starts that much after the
latest real arrival. Sends and receives keep the symmetric rule (or the pipeline's).

Pipelines (``pipeline``, ``emulator.live.pipeline``): the real rank is stage 0 and a
receive from stage 1 (interleaved: also from the last stage) completes when its sender's
own program would have sent it (its schedule, on the measured compute per micro-batch,
fed by the real stage's actual sends), not at the symmetric copy's moment: the real
stage waits out the bubble.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from emulator.live.clock import Clock
from emulator.live.cost import CommCost
from emulator.live.mirror import mirrors
from emulator.live.pipeline import Pipeline
from emulator.live.skew import lag as skew_lag
from emulator.live.watchdog import Beacon


@dataclass(frozen=True)
class CommRecord:
    """One intercepted collective or send/recv, on the local timeline (s)."""

    seq: int
    op: str  # all_reduce | reduce_scatter | all_gather | all_to_all | broadcast | barrier | send | recv
    group: tuple[int, ...]  # world ranks
    bytes: float  # nccl-tests buffer size S
    issue_s: float
    start_s: float
    end_s: float
    stream: str


@dataclass(frozen=True)
class WaitRecord:
    """An interval in which the local rank was blocked on emulated communication."""

    start_s: float
    end_s: float
    reason: str  # wait | backward | optimizer | barrier | end
    resumed_s: float = -1.0  # when the rank went on (the wall clock wakes after end_s); -1: at end_s


class Session:
    """Issues collectives on emulated streams and records waits and iteration boundaries."""

    def __init__(self, clock: Clock, cost: CommCost, world: int, rank: int = 0, real: int = 1,
                 slow: dict[int, float] | None = None, pipeline: Pipeline | None = None,
                 skew: tuple[float, float] | None = None) -> None:
        self.clock = clock
        self.skew = skew  # (σ at no compute in s, its growth per second of compute), or None: off
        self._sync_busy = 0.0  # the local compute (now - blocked) at the end of the last wait
        self.pipeline = pipeline  # the emulated stages 1.. of a pipeline whose stage 0 is this rank
        self.real = real  # world ranks 0..real-1 are real processes
        self.slow = dict(slow or {})  # emulated rank -> compute slowdown factor
        self.lag = {r: 0.0 for r in self.slow}  # how far each slowed rank is behind its mirror (s)
        self.blocked_s = 0.0  # total time the local rank was blocked
        self._busy_mark: dict[int, float] = {}  # slowed rank -> local compute (now - blocked) at its last update
        self._arrived: dict[int, dict[int, tuple[float, float]]] = {}  # record -> slowed member -> (arrival, busy)
        self.pending: dict[int, Any] = {}  # record index -> the real Work still running
        self.cost = cost
        self.world = world
        self.rank = rank
        self.comms: list[CommRecord] = []
        self.waits: list[WaitRecord] = []
        self.steps: list[float] = []  # local time at the end of each optimizer step
        self.stream_free: dict[str, float] = {}
        self.notes: list[str] = []
        self.end_s: float | None = None
        self._step_key: int | None = None
        self.on_synced: list[Callable[[], None]] = []  # called each time a wait on communication ends
        self.beacon = Beacon(None, rank)  # tells the launcher's watchdog of real waits (``emulator.live.watchdog``)

    # -- stragglers ---------------------------------------------------------------
    def arrival(self, group: tuple[int, ...], collective: bool = True) -> float:
        """Now, or later if a slowed emulated member that mirrors this rank arrives after it, or (a
        ``collective`` with the skew model on) the emulated members' skew lag puts them later."""
        now = self.clock.now()
        busy = now - self.blocked_s
        arrived: dict[int, tuple[float, float]] = {}
        for r, f in self.slow.items():
            self.lag[r] += (f - 1.0) * (busy - self._busy_mark.get(r, 0.0))
            self._busy_mark[r] = busy
            if r in group:
                arrived[r] = (now + self.lag[r], busy)
        if arrived:
            self._arrived[len(self.comms)] = arrived  # for the record issued next
        late = [self.lag[r] for r in group if r in self.slow and self._mirrors_me(group, r)]
        if self.skew is not None and collective and any(self._mirrors_me(group, r) for r in group if r >= self.real):
            reals = 1 if self.real == 1 else sum(1 for r in group if r < self.real)
            late.append(skew_lag(*self.skew, busy - self._sync_busy, len(group), reals))
        return now + max([0.0, *late])

    def _mirrors_me(self, group: tuple[int, ...], r: int) -> bool:
        return self.real == 1 or (self.rank in group and mirrors(group, self.real).get(r) == self.rank)

    def _level(self, recs: list[CommRecord], before: float) -> None:
        """After a wait from ``before`` to now on ``recs``: a slowed member of one waited for its end
        too, and computed (×f) what this rank computed between the issue and the wait.

        It goes on when this rank does (now: the end, plus the time this rank took to resume, which
        its copy takes too), or later if that compute of its own ends later. Going on at the end
        instead let the straggler skip the wake-up that every real rank pays once per iteration, so
        the straggler hid it: the live lengthening fell short of `emulator run`'s (whose ranks
        pay none, with or without the straggler) by that wake-up, 11-20% in six runs (README, "A
        straggler on an emulated rank")."""
        after = self.clock.now()
        busy = after - self.blocked_s
        for r, f in self.slow.items():
            mine = [c for c in recs if r in c.group and c.end_s > before]  # those it waited for
            if not mine:
                continue
            last = max(mine, key=lambda c: c.end_s)
            arr, busy_then = self._arrived.get(last.seq, {}).get(r, (before + self.lag[r], busy))
            self.lag[r] = max(after, last.end_s, arr + f * (busy - busy_then)) - after
            self._busy_mark[r] = busy

    # -- issuing ----------------------------------------------------------------
    def issue(self, op: str, group: tuple[int, ...], nbytes: float, root: int = -1, peer: int = -1,
              arrival: float | None = None) -> CommRecord:
        """Record a collective (or a send/recv with ``peer``) issued now; return its record.
        ``arrival``: when the last member arrives (default: this rank's ``arrival``)."""
        now = self.clock.now()
        staged = self.pipeline is not None and op in ("send", "recv") and self.pipeline.handles(peer)
        if arrival is None:  # a pipeline stage's own program says when it is there (``_stage``)
            p2p = op in ("send", "recv")
            arrival = now if staged else self.arrival((self.rank, peer) if p2p else tuple(group), collective=not p2p)
        stream = "comm " + _group_name(group, self.world)
        if op in ("send", "recv"):
            src, dst = (self.rank, peer) if op == "send" else (peer, self.rank)
            duration = self.cost.p2p(src, dst, nbytes)
            stream = f"p2p {src}->{dst}"
            group = (src, dst)
        elif op == "barrier":
            duration = self.cost.collective("all_reduce", group, 4.0)  # a barrier is a 1-element all-reduce
        else:
            duration = self.cost.collective(op, group, nbytes, root)
        start = max(arrival, self.stream_free.get(stream, 0.0))
        if staged:
            start = self._stage(op, peer, start, nbytes)
        rec = CommRecord(len(self.comms), op, tuple(group), float(nbytes), now, start, start + duration, stream)
        self.stream_free[stream] = rec.end_s
        self.comms.append(rec)
        return rec

    def _stage(self, op: str, peer: int, start: float, nbytes: float) -> float:
        """A transfer with an emulated stage: a send (issued now), or a receive (posted at ``start``)
        whose sender runs its own schedule; returns when the transfer starts."""
        assert self.pipeline is not None
        now = self.clock.now()
        hops = {(a, b): self.cost.p2p(a, b, nbytes) for a, b in self.pipeline.pairs()}
        arrives = self.pipeline.event(op, peer, now if op == "send" else start, now - self.blocked_s, hops)
        return start if arrives is None else max(start, arrives - hops[peer, self.rank])

    def issue_real(self, op: str, group: tuple[int, ...], nbytes: float, work: Any) -> CommRecord:
        """Record a collective among real ranks only, running on the real transport as ``work``;
        it ends when the work completes (``complete``)."""
        self.arrival(group)  # keep the stragglers' lag up to date
        now = self.clock.now()
        stream = "real " + _group_name(group, self.world)
        rec = CommRecord(len(self.comms), op, tuple(group), float(nbytes), now, now, math.inf, stream)
        self.comms.append(rec)
        self.pending[rec.seq] = work
        return rec

    def complete(self, seq: int, reason: str = "wait") -> CommRecord:
        """Wait for the real work of record ``seq``; its end is the wall time it completed."""
        work = self.pending.pop(seq, None)
        if work is not None:
            start = self.clock.now()
            rec = self.comms[seq]
            peer = next((r for r in rec.group if r != self.rank), -1) if rec.op in ("send", "recv") else -1
            with self.beacon.blocked(rec.op, rec.group, rec.group, peer):
                work.wait()
            end = self.clock.now()
            self.blocked_s += end - start
            self._synced()
            if end > start:
                self.waits.append(WaitRecord(start, end, reason))
            self.comms[seq] = replace(self.comms[seq], end_s=end)
        return self.comms[seq]

    # -- waiting ----------------------------------------------------------------
    def blocked_until_now(self, since: float, reason: str) -> None:
        """The local rank was blocked from ``since`` to now on the real transport (a mixed group's real part)."""
        now = self.clock.now()
        if now > since:
            self.waits.append(WaitRecord(since, now, reason))
            self.blocked_s += now - since
        self._synced()

    def wait_until(self, t: float, reason: str) -> float:
        start = self.clock.now()
        blocked = self.clock.advance_to(t)
        if blocked > 0:
            self.waits.append(WaitRecord(start, start + blocked, reason, self.clock.now()))
            self.blocked_s += blocked
        self._synced()
        return blocked

    def _synced(self) -> None:
        """The local rank waited on communication: its compute since the last synchronisation restarts."""
        self._sync_busy = self.clock.now() - self.blocked_s
        for cb in self.on_synced:
            cb()

    def wait(self, rec: CommRecord, reason: str = "wait") -> float:
        if self.pipeline is not None and rec.op == "send":
            return 0.0  # a pipeline send is eager: it runs on its own stream (``emulator.live.pipeline``)
        if rec.seq in self.pending:
            self.complete(rec.seq, reason)
            return 0.0
        before = self.clock.now()
        blocked = self.wait_until(rec.end_s, reason)
        self._level([rec], before)
        return blocked

    def sync(self, reason: str, since: int = 0) -> float:
        """Wait for every record issued at index ``since`` or later."""
        for seq in sorted(k for k in self.pending if k >= since):
            self.complete(seq, reason)
        recs = self.comms[since:]
        if not recs:
            return 0.0
        before = self.clock.now()
        blocked = self.wait_until(max(c.end_s for c in recs), reason)
        self._level(list(recs), before)
        return blocked

    # -- iterations -------------------------------------------------------------
    def step(self, key: int = 0) -> None:
        """An optimizer step ended; only the first optimizer seen marks iterations."""
        if self._step_key is None:
            self._step_key = key
        if key == self._step_key:
            self.steps.append(self.clock.now())
            if self.pipeline is not None:
                self.pipeline.step(self.clock.now())

    def to_dict(self) -> dict:
        """The record as plain JSON-able data (what the child process hands the launcher)."""
        return {"world": self.world, "rank": self.rank, "clock": self.clock.mode,
                "initialised": self.beacon.initialised,
                "hidden_s": self.clock.hidden_s, "real": self.real,
                "slow": {str(r): f for r, f in sorted(self.slow.items())},
                **({"skew": {"base_s": self.skew[0], "slope": self.skew[1]}} if self.skew else {}),
                "end_s": self.end_s, "steps_s": list(self.steps),
                **({"pipeline": {"schedule": self.pipeline.name, "stages": self.pipeline.stages,
                                 "virtual_stages": self.pipeline.virtual, "microbatches": self.pipeline.microbatches,
                                 "fwd_s": self.pipeline.fwd, "bwd_s": self.pipeline.bwd,
                                 "measured_s": [list(fb) for fb in self.pipeline.history]}} if self.pipeline else {}),
                "engine_runs": self.cost.engine_runs,
                "notes": list(self.notes) + (self.pipeline.notes if self.pipeline else []),
                "comms": [dict(seq=c.seq, op=c.op, group=list(c.group), bytes=c.bytes, issue_s=c.issue_s,
                               start_s=c.start_s, end_s=c.end_s, stream=c.stream) for c in self.comms],
                "waits": [dict(start_s=w.start_s, end_s=w.end_s, reason=w.reason,
                               resumed_s=w.resumed_s if w.resumed_s >= 0 else w.end_s) for w in self.waits]}

    def finish(self) -> None:
        if self.end_s is None:
            self.sync("end")
            self.end_s = self.clock.now()


def _group_name(group: tuple[int, ...], world: int) -> str:
    if len(group) == world and tuple(sorted(group)) == tuple(range(world)):
        return f"world[{world}]"
    g = sorted(group)
    if len(g) > 2 and all(b - a == g[1] - g[0] for a, b in zip(g, g[1:])):
        return f"[{g[0]}:{g[-1] + 1}:{g[1] - g[0]}]"
    return "[" + ",".join(map(str, g)) + "]"

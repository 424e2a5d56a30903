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
"""
from __future__ import annotations

from dataclasses import dataclass

from emulator.live.clock import Clock
from emulator.live.cost import CommCost


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


class Session:
    """Issues collectives on emulated streams and records waits and iteration boundaries."""

    def __init__(self, clock: Clock, cost: CommCost, world: int, rank: int = 0) -> None:
        self.clock = clock
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

    # -- issuing ----------------------------------------------------------------
    def issue(self, op: str, group: tuple[int, ...], nbytes: float, root: int = -1, peer: int = -1) -> CommRecord:
        """Record a collective (or a send/recv with ``peer``) issued now; return its record."""
        now = self.clock.now()
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
        start = max(now, self.stream_free.get(stream, 0.0))
        rec = CommRecord(len(self.comms), op, tuple(group), float(nbytes), now, start, start + duration, stream)
        self.stream_free[stream] = rec.end_s
        self.comms.append(rec)
        return rec

    # -- waiting ----------------------------------------------------------------
    def wait_until(self, t: float, reason: str) -> float:
        start = self.clock.now()
        blocked = self.clock.advance_to(t)
        if blocked > 0:
            self.waits.append(WaitRecord(start, start + blocked, reason))
        return blocked

    def wait(self, rec: CommRecord, reason: str = "wait") -> float:
        return self.wait_until(rec.end_s, reason)

    def sync(self, reason: str, since: int = 0) -> float:
        """Wait for every record issued at index ``since`` or later."""
        ends = [c.end_s for c in self.comms[since:]]
        return self.wait_until(max(ends), reason) if ends else 0.0

    # -- iterations -------------------------------------------------------------
    def step(self, key: int = 0) -> None:
        """An optimizer step ended; only the first optimizer seen marks iterations."""
        if self._step_key is None:
            self._step_key = key
        if key == self._step_key:
            self.steps.append(self.clock.now())

    def to_dict(self) -> dict:
        """The record as plain JSON-able data (what the child process hands the launcher)."""
        return {"world": self.world, "rank": self.rank, "clock": self.clock.mode,
                "hidden_s": self.clock.hidden_s, "end_s": self.end_s, "steps_s": list(self.steps),
                "engine_runs": self.cost.engine_runs, "notes": list(self.notes),
                "comms": [dict(seq=c.seq, op=c.op, group=list(c.group), bytes=c.bytes, issue_s=c.issue_s,
                               start_s=c.start_s, end_s=c.end_s, stream=c.stream) for c in self.comms],
                "waits": [dict(start_s=w.start_s, end_s=w.end_s, reason=w.reason) for w in self.waits]}

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

"""The emulated pipeline stages of a live run: when their sends reach the real stage.

Pure Python (no torch). A live pipeline has the real rank as stage 0 and the other
stages emulated (``parallel.pp`` = the live world, one rank per stage, rank s =
stage s). An emulated stage runs its own program: the schedule's order of forward
and backward tasks for its stage (``emulator.workload.schedules``: gpipe, 1f1b),
each forward taking F and each backward B, the script's measured compute per
micro-batch on the real stage (the same layers on every stage). A forward receives
its activation from the stage before (for stage 1: the real stage's actual send), a
backward its gradient from the stage after (the last stage: none); a receive blocks
until the sender got there and the transfer (the emulated cost ``hop``) is done.

So the k-th gradient the real stage receives from stage 1 arrives when stage 1's
backward of that micro-batch ends and the transfer is done: a live 1F1B run shows its bubble.

Only what the real stage has already sent is known. When the real stage waits for
a gradient, it has sent every activation it will send before it: a forward whose
activation is not yet sent is past the last micro-batch, so the count of micro-batches
is the number sent (``M``).
"""
from __future__ import annotations

from emulator.workload.schedules import schedule

SCHEDULES = ("gpipe", "1f1b")


def emulated_stages(name: str, stages: int, acts: list[float], posts: dict[int, float], fwd: float, bwd: float,
                    hop: float, start: float = 0.0) -> dict[int, float]:
    """Micro-batch → when stage 0's receive of stage 1's gradient for it completes (s).

    Each emulated stage runs its schedule's tasks in order, as the script does: a forward
    receives its activation (stage 1: from the real stage), computes F, sends it on; a
    backward receives its gradient (the last stage: none), computes B, sends it back.
    A send does not hold its stage (it runs on its own stream, as gloo's eager sends do);
    a receive blocks, and the transfer starts when both sides are there and completes
    ``hop`` later (``emulator run``'s rule). ``acts``: when the real
    stage sent each activation (micro-batch 0, 1, ...); ``posts``: micro-batch → when the
    real stage posted the receive of its gradient; ``start``: when the emulated stages
    began the iteration.
    """
    if name not in SCHEDULES:
        raise ValueError(f"pipeline schedule {name!r}: live runs support {', '.join(SCHEDULES)}")
    m = len(acts)
    offer: dict[tuple, float] = {("F", 1, i): t for i, t in enumerate(acts)}  # (phase, to stage, mb) → sender there
    done: dict[tuple, float] = {}  # the same key → when the transfer completed
    steps: dict[int, list[tuple]] = {}
    for s in range(1, stages):
        seq: list[tuple] = []
        for phase, mb, _chunk in schedule(name, s, stages, m):
            if phase == "F":
                seq += [("recv", ("F", s, mb)), ("compute", fwd)]
                if s + 1 < stages:
                    seq.append(("send", ("F", s + 1, mb)))
            else:
                if s + 1 < stages:
                    seq.append(("recv", ("B", s, mb)))
                seq += [("compute", bwd), ("send", ("B", s - 1, mb))]
        steps[s] = seq
    pos = {s: 0 for s in steps}
    now = {s: start for s in steps}
    progress = True
    while progress:
        progress = False
        for s, seq in steps.items():
            while pos[s] < len(seq):
                kind, arg = seq[pos[s]]
                if kind == "compute":
                    now[s] += arg
                elif kind == "recv":
                    if arg not in offer:
                        break
                    done[arg] = now[s] = max(offer[arg], now[s]) + hop
                else:  # send: eager, on its own stream; the receiver takes it when it gets there
                    offer[arg] = now[s]
                    if arg[1] == 0:  # to the real stage: it takes it when it posts its receive
                        post = posts.get(arg[2])
                        if post is not None:
                            done[arg] = max(now[s], post) + hop
                pos[s] += 1
                progress = True
    return {key[2]: t for key, t in done.items() if key[0] == "B" and key[1] == 0}


class Pipeline:
    """The real stage 0's view of one iteration: its sends to stage 1, its receives from it,
    and the measured F and B (the median of the previous iteration's)."""

    def __init__(self, name: str, stages: int) -> None:
        if name not in SCHEDULES:
            raise ValueError(f"parallel.schedule {name!r}: a live pipeline supports {', '.join(SCHEDULES)}")
        self.name = name
        self.stages = stages
        self.start = 0.0
        self.acts: list[float] = []  # arrival at stage 1 of each activation sent this iteration
        self.recvs = 0  # gradients received this iteration
        self.posts: dict[int, float] = {}  # micro-batch → when the real stage posted its gradient's receive
        self.fwd: float | None = None
        self.bwd: float | None = None
        self._fwd_seen: list[float] = []
        self._bwd_seen: list[float] = []
        self._last: tuple[str, float] | None = None  # the last event: ("send" | "recv", busy time then)

    def sent(self, arrival: float, busy: float) -> None:
        """The real stage sent an activation (arriving at stage 1 at ``arrival``); ``busy``: its compute so far."""
        if self._last is not None and self._last[0] == "send":
            self._fwd_seen.append(busy - self._last[1])  # a forward between two sends
        self._last = ("send", busy)
        self.acts.append(arrival)

    def received(self, busy: float) -> None:
        """The real stage posted the receive of a gradient; ``busy``: its compute so far."""
        if self._last is not None and self._last[0] == "recv":
            self._bwd_seen.append(busy - self._last[1])  # a backward between two receives
        self._last = ("recv", busy)
        self.recvs += 1

    def grad(self, now: float, hop: float) -> float | None:
        """When the receive of the gradient the real stage now waits for (its ``recvs``-th, posted at
        ``now``) completes; None if not modelled yet."""
        fwd = self.fwd if self.fwd is not None else _median(self._fwd_seen)
        if fwd is None:
            return None
        bwd = self.bwd if self.bwd is not None else 2.0 * fwd  # the first iteration: backward ≈ 2 × forward
        order = [t.microbatch for t in schedule(self.name, 0, self.stages, len(self.acts)) if t.phase == "B"]
        k = self.recvs - 1
        if k >= len(order):
            return None
        self.posts[order[k]] = now
        return emulated_stages(self.name, self.stages, self.acts, self.posts, fwd, bwd, hop, self.start).get(order[k])

    def step(self, now: float) -> None:
        """An iteration ended: keep this one's F and B, start the next at ``now``."""
        if self._fwd_seen:
            self.fwd = _median(self._fwd_seen)
        if self._bwd_seen:
            self.bwd = _median(self._bwd_seen)
        self.start = now
        self.acts, self.recvs, self._last, self.posts = [], 0, None, {}
        self._fwd_seen, self._bwd_seen = [], []


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

"""The emulated pipeline stages of a live run: when their sends reach the real stage.

Pure Python (no torch). A live pipeline has the real rank as stage 0 and the other
stages emulated (``parallel.pp`` = the live world, one rank per stage, rank s =
stage s). An emulated stage runs its own program: the schedule's order of forward
and backward tasks for its stage (``emulator.workload.schedules``: gpipe, 1f1b,
interleaved-1f1b; the others are refused by name, ``UNSUPPORTED``), each forward taking F and each
backward B, the script's measured
compute per micro-batch and model chunk on the real stage (the same layers on every
stage and chunk). A forward receives its activation from the virtual stage before,
a backward its gradient from the virtual stage after; a receive blocks until the
transfer (the emulated cost ``hop``) is done, and a stage's sends queue on its one send
stream, each starting when the receiver is there (``emulator run``'s rules).

Interleaved 1F1B (``virtual_stages`` v ≥ 2, Megatron-LM): stage s holds chunks
s, p + s, 2p + s, ... (virtual stage c·p + s is its chunk c), so the real stage 0
also receives activations from the last stage (chunk c − 1 → its chunk c) and sends
gradients back to it, besides its sends to and receives from stage 1.

So the k-th gradient the real stage receives from stage 1 arrives when stage 1's
backward of it ends and the transfer is done: a live 1F1B run shows its bubble.

Only what the real stage has already sent is known. Its sends and receives follow its
own schedule's order (``Pipeline`` checks the peers against it), so the n-th one is a
known (phase, micro-batch, chunk). The micro-batch count m: gpipe and 1f1b take the
forwards sent so far (when the real stage waits, a forward not yet sent is past the
ones the emulated stages need); interleaved takes the previous iteration's count, and
in the first iteration the smallest multiple of p (> p unless the order proves m = p)
whose schedule fits what the real stage did so far. Within an iteration the emulated
stages go on from where they stopped (``Emulation``), as long as m, F and B stay put.
"""
from __future__ import annotations

from functools import lru_cache

from emulator.workload.schedules import schedule

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
# The schedules of emulator/workload/schedules.py that a live pipeline refuses, and why: its emulated stages
# run whole forwards and backwards (F and B, the real stage's measured medians) along one direction, with
# chunk c of stage s as virtual stage c·p + s; these need what a real script's one backward and that
# placement do not give.
_SPLIT = "splits backwards into input- and weight-gradient passes (a real backward is measured whole)"
UNSUPPORTED = {
    "zb-h1": _SPLIT,
    "zb-v": f"places two chunks a rank in a V (stage 0 holds the first and the last virtual stage) and {_SPLIT}",
    "dualpipev": "places two chunks a rank in a V (stage 0 holds the first and the last virtual stage) and runs "
                 "a forward and a backward as one overlapped pair",
    "dualpipe": "runs two directions (every rank holds two stages: stage 0 is also the reverse direction's last, "
                "fed by stage 1) with a forward and a backward as one overlapped pair",
}


def unsupported(name: str) -> str:
    """The refusal of schedule ``name`` by a live pipeline, naming it (and why, for a known one)."""
    why = f": {name} {UNSUPPORTED[name]}; `emulator run` simulates it" if name in UNSUPPORTED else ""
    return f"parallel.schedule: a live pipeline supports {', '.join(SCHEDULES)}, got {name!r}{why}"

Key = tuple[str, int, int, int]  # (phase F | B, the receiving stage, micro-batch, the receiving chunk)
Step = tuple[str, object]  # ("recv", Key) | ("compute", "F" | "B") | ("send", Key)
Hops = float | dict[tuple[int, int], float]  # one cost for every transfer, or per (sender, receiver) stage


def _forward_to(stage: int, chunk: int, stages: int, virtual: int) -> tuple[int, int] | None:
    """(stage, chunk) of the virtual stage after chunk ``chunk`` of ``stage``; None after the last."""
    if stage + 1 < stages:
        return stage + 1, chunk
    return (0, chunk + 1) if chunk + 1 < virtual else None


def _backward_to(stage: int, chunk: int, stages: int) -> tuple[int, int] | None:
    """(stage, chunk) of the virtual stage before chunk ``chunk`` of ``stage``; None before the first."""
    if stage > 0:
        return stage - 1, chunk
    return (stages - 1, chunk - 1) if chunk > 0 else None


@lru_cache(maxsize=256)
def program(name: str, stage: int, stages: int, microbatches: int, virtual: int = 1) -> tuple[Step, ...]:
    """A stage's receives, computes and sends, in its schedule's order: a forward receives its
    activation (not the first virtual stage), computes, sends it on (not the last); a backward
    receives its gradient (not the last), computes, sends it back (not the first)."""
    steps: list[Step] = []
    for phase, mb, chunk in schedule(name, stage, stages, microbatches, virtual):
        nxt, prev = _forward_to(stage, chunk, stages, virtual), _backward_to(stage, chunk, stages)
        if phase == "F":
            if prev is not None:
                steps.append(("recv", ("F", stage, mb, chunk)))
            steps.append(("compute", "F"))
            if nxt is not None:
                steps.append(("send", ("F", nxt[0], mb, nxt[1])))
        else:
            if nxt is not None:
                steps.append(("recv", ("B", stage, mb, chunk)))
            steps.append(("compute", "B"))
            if prev is not None:
                steps.append(("send", ("B", prev[0], mb, prev[1])))
    return tuple(steps)


def emulated(name: str, stages: int, microbatches: int, virtual: int, sent: dict[Key, float],
             posted: dict[Key, float], fwd: float, bwd: float, hop: Hops, start: float = 0.0,
             slow: dict[int, float] | None = None) -> dict[Key, float]:
    """Key → when stage 0's receive of it completes (s), for the receives it posted that the
    emulated stages 1.. get to send.

    Each emulated stage runs its ``program`` from ``start``. A send does not hold its stage: it
    goes on the stage's one send stream (``emulator run``'s rule for a Program whose sends run on
    a stream of their own): it starts when its compute is done, the stream's previous send is
    done and the receiver has posted its receive, and completes ``hop`` later, and so does the
    receive. A receive blocks its stage until then. ``sent``: when the real stage 0 issued each of
    its sends (they go on its send stream in its program's order); ``posted``: when it posted each
    of its receives. ``hop``: a transfer's cost, or per (sender, receiver) stage; ``slow``: stage →
    factor on its F and B (a ``gpu_slowdown`` override).
    """
    return Emulation(name, stages, microbatches, virtual, fwd, bwd, hop, start, slow).run(sent, posted)


class Emulation:
    """``emulated`` that keeps its state: fed more of stage 0's sends and posts, it goes on from
    where it stopped (what it computed needs only what it had; nothing later changes it)."""

    def __init__(self, name: str, stages: int, microbatches: int, virtual: int, fwd: float, bwd: float,
                 hop: Hops, start: float = 0.0, slow: dict[int, float] | None = None) -> None:
        self.key = _key(name, stages, microbatches, virtual, fwd, bwd, hop, start, slow)
        self.progs = {s: program(name, s, stages, microbatches, virtual) for s in range(stages)}
        self.queue = {s: [arg for kind, arg in self.progs[s] if kind == "send"] for s in range(stages)}
        self.fwd, self.bwd, self.hop = fwd, bwd, hop
        self.factor = {s: (slow or {}).get(s, 1.0) for s in range(stages)}
        self.ready: dict[Key, float] = {}  # send → when its compute was done
        self.post: dict[Key, float] = {}  # receive → when its stage got there
        self.done: dict[Key, float] = {}  # message → when its transfer completed
        self.pos = {s: 0 for s in range(1, stages)}
        self.now = {s: start for s in range(1, stages)}
        self.head = {s: 0 for s in range(stages)}  # the next send of each stage's send stream
        self.free = {s: start for s in range(stages)}

    def run(self, sent: dict[Key, float], posted: dict[Key, float]) -> dict[Key, float]:
        """Go on with stage 0's ``sent`` and ``posted`` (all of them so far); what reached stage 0."""
        self.ready.update(sent)
        self.post.update(posted)
        progress = True
        while progress:
            progress = self._stages() | self._streams()
        return {key: t for key, t in self.done.items() if key[1] == 0 and key in posted}

    def _stages(self) -> bool:
        moved = False
        for s in self.pos:
            seq = self.progs[s]
            while self.pos[s] < len(seq):
                kind, arg = seq[self.pos[s]]
                if kind == "compute":
                    self.now[s] += (self.fwd if arg == "F" else self.bwd) * self.factor[s]
                elif kind == "send":
                    self.ready[arg] = self.now[s]  # type: ignore[index]
                else:
                    self.post.setdefault(arg, self.now[s])  # type: ignore[arg-type]
                    if arg not in self.done:
                        break
                    self.now[s] = self.done[arg]  # type: ignore[index]
                self.pos[s] += 1
                moved = True
        return moved

    def _streams(self) -> bool:
        moved = False
        for s, keys in self.queue.items():
            while self.head[s] < len(keys) and keys[self.head[s]] in self.ready and keys[self.head[s]] in self.post:
                key: Key = keys[self.head[s]]  # type: ignore[assignment]
                hop = self.hop[s, key[1]] if isinstance(self.hop, dict) else self.hop
                self.done[key] = self.free[s] = max(self.ready[key], self.free[s], self.post[key]) + hop
                self.head[s] += 1
                moved = True
        return moved


def _key(*args: object) -> tuple:
    """A hashable key of an emulation's inputs (dicts as sorted items)."""
    return tuple(tuple(sorted(a.items())) if isinstance(a, dict) else a for a in args)


def emulated_stages(name: str, stages: int, acts: list[float], posts: dict[int, float], fwd: float, bwd: float,
                    hop: float, start: float = 0.0) -> dict[int, float]:
    """gpipe / 1f1b (one chunk per stage), m = len(acts): micro-batch → when stage 0's receive of
    stage 1's gradient for it completes. ``acts``: when the real stage sent each activation
    (micro-batch 0, 1, ...); ``posts``: micro-batch → when it posted the receive of its gradient."""
    if name not in SCHEDULES[:2]:
        raise ValueError(f"pipeline schedule {name!r}: one chunk per stage is {', '.join(SCHEDULES[:2])}")
    sent = {("F", 1, i, 0): t for i, t in enumerate(acts)}
    posted = {("B", 0, mb, 0): t for mb, t in posts.items()}
    done = emulated(name, stages, len(acts), 1, sent, posted, fwd, bwd, hop, start)
    return {key[2]: t for key, t in done.items()}


def refusal(pp: int, schedule_name: str, world: int, real: int, rank: int) -> str | None:
    """Why live cannot run this pipeline layout (``parallel.pp``, ``parallel.schedule``), or None."""
    if pp <= 1:
        return None
    if pp != world or real != 1 or rank != 0:
        return (f"parallel.pp = {pp}: a live pipeline needs the live world to be the pipeline (--world {pp}, one "
                f"rank per stage) and one real rank, stage 0 (--real 1, --rank 0); got --world {world} --real {real} "
                f"--rank {rank}")
    if schedule_name not in SCHEDULES:
        return unsupported(schedule_name)
    return None


class Pipeline:
    """The real stage 0's view of one iteration: its sends and receives (to and from stage 1, and
    with interleaving stage p − 1) in its schedule's order, and the measured F and B per micro-batch
    and chunk (the medians of the previous iteration's)."""

    def __init__(self, name: str, stages: int, virtual: int = 1, slow: dict[int, float] | None = None) -> None:
        if name not in SCHEDULES:
            raise ValueError(unsupported(name))
        self.name = name
        self.stages = stages
        self.virtual = virtual
        self.slow = {s: f for s, f in (slow or {}).items() if 0 < s < stages}  # emulated stage → gpu_slowdown
        self.start = 0.0
        self.microbatches: int | None = None  # the previous iteration's (interleaved: its layout from then on)
        self.fwd: float | None = None
        self.bwd: float | None = None
        self.mismatch: str | None = None  # why this iteration is not modelled (the script left the schedule)
        self.notes: list[str] = []
        self.history: list[tuple[float | None, float | None]] = []  # (F, B) measured in each iteration
        self._new_iteration()

    def _new_iteration(self) -> None:
        self.seen: list[tuple[str, int, float]] = []  # (send | recv, peer, busy) this iteration
        self.sent: dict[Key, float] = {}
        self.posted: dict[Key, float] = {}
        self._fwd_seen: list[float] = []
        self._bwd_seen: list[float] = []
        self.mismatch = None
        self._guess = 2  # interleaved, first iteration: try m = 2p, 3p, ... (then p) until one fits
        self._m = 0  # the micro-batch count of the last fit
        self._sim: Emulation | None = None  # the emulated stages so far this iteration
        self._checked: dict[int, int] = {}  # micro-batch count → how much of ``seen`` fits its schedule

    def handles(self, peer: int) -> bool:
        """Whether a send/recv with ``peer`` is a pipeline transfer of the real stage 0."""
        return peer == 1 or (self.virtual > 1 and peer == self.stages - 1)

    def _comms(self, m: int) -> list[tuple[str, int, Key, list[str]]]:
        """Stage 0's sends and receives for m micro-batches: (op, peer, key, computes since the last)."""
        return _comms(self.name, self.stages, m, self.virtual)

    def _fits(self, m: int) -> list[tuple[str, int, Key, list[str]]] | None:
        comms = self._comms(m)
        checked = self._checked.get(m, 0)  # the prefix already found to fit
        if len(comms) < len(self.seen) or any(c[:2] != s[:2] for c, s in zip(comms[checked:], self.seen[checked:])):
            return None
        self._checked[m] = len(self.seen)
        return comms

    def _layout(self) -> tuple[int, list[tuple[str, int, Key, list[str]]]] | None:
        """The micro-batch count that fits what stage 0 did this iteration so far, and its comms."""
        if self.virtual == 1:  # gpipe, 1f1b: every send is a forward; m = the forwards sent so far
            m = max(1, sum(1 for op, _, _ in self.seen if op == "send"))
            comms = self._fits(m)
            return None if comms is None else (m, comms)
        p, v = self.stages, self.virtual
        candidates = [self.microbatches] if self.microbatches is not None else \
            [j * p for j in range(self._guess, (len(self.seen) + 2 * p * v) // (p * v) + 1)] + [p]
        for m in candidates:
            comms = self._fits(m)
            if comms is not None:
                self._guess = max(self._guess, m // p)
                return m, comms
        return None

    def pairs(self) -> list[tuple[int, int]]:
        """The (sender, receiver) stages that transfer: neighbours, and with interleaving the last → 0."""
        p = self.stages
        out = [(s, s + 1) for s in range(p - 1)] + [(s + 1, s) for s in range(p - 1)]
        return out + ([(p - 1, 0), (0, p - 1)] if self.virtual > 1 and p > 2 else [])

    def event(self, op: str, peer: int, t: float, busy: float, hop: Hops) -> float | None:
        """The real stage issued a send (at ``t``) or posted a receive (at ``t``) with ``peer``;
        ``busy``: its compute so far; ``hop``: a transfer's cost (per pair: ``pairs``). For a
        receive: when it completes (s); None if not modelled."""
        self.seen.append((op, peer, busy))
        n = len(self.seen) - 1
        layout = None if self.mismatch else self._layout()
        if layout is None:
            if not self.mismatch:
                self.mismatch = (f"pipeline: the script's {op} #{n + 1} of an iteration (peer {peer}) does not follow "
                                 f"parallel.schedule {self.name} (virtual_stages {self.virtual}) on stage 0; "
                                 "its receives from the emulated stages follow the symmetric rule")
                if self.mismatch not in self.notes:
                    self.notes.append(self.mismatch)
            return None
        self._m, comms = layout
        _, _, key, between = comms[n]
        if n > 0 and len(between) == 1:  # one compute between two transfers: a forward or a backward
            (self._fwd_seen if between[0] == "F" else self._bwd_seen).append(busy - self.seen[n - 1][2])
        if op == "send":
            self.sent[key] = t
            return None
        fwd = self.fwd if self.fwd is not None else _median(self._fwd_seen)
        if fwd is None:
            return None
        bwd = self.bwd if self.bwd is not None else 2.0 * fwd  # the first iteration: backward ≈ 2 × forward
        self.posted[key] = t
        sim = self._sim
        args = (self.name, self.stages, self._m, self.virtual, fwd, bwd, hop, self.start, self.slow)
        if sim is None or sim.key != _key(*args):
            sim = self._sim = Emulation(*args)
        return sim.run(self.sent, self.posted).get(key)

    def step(self, now: float) -> None:
        """An iteration ended: keep this one's F, B (and micro-batch count), start the next at ``now``."""
        if self._fwd_seen:
            self.fwd = _median(self._fwd_seen)
        if self._bwd_seen:
            self.bwd = _median(self._bwd_seen)
        self.history.append((_median(self._fwd_seen), _median(self._bwd_seen)))
        if not self.mismatch and self.seen and len(self._comms(self._m)) == len(self.seen):
            self.microbatches = self._m  # the whole iteration followed the schedule with m micro-batches
        self.start = now
        self._new_iteration()


@lru_cache(maxsize=64)
def _comms(name: str, stages: int, m: int, virtual: int) -> list[tuple[str, int, Key, list[str]]]:
    """Stage 0's sends and receives for m micro-batches: (op, peer, key, computes since the last)."""
    out: list[tuple[str, int, Key, list[str]]] = []
    between: list[str] = []
    for kind, arg in program(name, 0, stages, m, virtual):
        if kind == "compute":
            between.append(arg)  # type: ignore[arg-type]
            continue
        key: Key = arg  # type: ignore[assignment]
        peer = key[1] if kind == "send" else (1 if key[0] == "B" else stages - 1)
        out.append((kind, peer, key, between))
        between = []
    return out


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

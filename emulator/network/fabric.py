"""The fabric: flow plans run on the flow fabric, whole plans run ahead of the clock where they can be.

``Fabric`` is the flow fabric (emulator.network.flow_fabric: flows on links shared max-min fairly,
flows started ahead of the clock) that also runs a collective's or a transfer's flow plan
(emulator.network.flows): its phases one after the other, the flows of a phase started together
(``run_plan``). The engine, the private collectives and the timed faults all use this one.

Plans run ahead (DESIGN.md, "Network model"; step 3 of a flow's life in flow_fabric.py): a MoE token
dispatch's plan (its phases), or a layer's collective of one simulated member (``program.runs_ahead``), whose
links carry nothing is *run ahead* as a whole (``run_plan(ahead=True)``):
its run alone on an idle fabric (kept per plan and size) gives its end, a flow that meets it before
then puts the flows of its phase then on the fabric as they stand, its later phases following
on the clock (``_wake_plan``); flows started ahead on its links that have not begun to stream
are *joined* to it and run with it (their run together kept per plan, size and joined flows);
the same times but for the rounding of a shifted sum (``PLANS_AHEAD`` False runs it flow by
flow; DeepSeek-V3 1024: 4.17M → 1.25M events alone, 0.27M with joined flows, its iteration time
the same to 13 digits).

A plan run ahead holds the links of it that can bind as bits of an int (``_m_plan``, checked by the
flow fabric wherever a flow may go on a link, as it checks those of the flows started ahead); a flow
placed on one of them wakes it (``_wake_held``), and so does any change or inspection of the links
(``_wake_all``). A wake reads the run alone at its time from a trail (trail.py): the plan and its
joined flows run again on a fresh fabric (``_Replay``), their state kept after each event time, once
per plan, size and joined flows.

``alone`` runs a plan by itself on a fresh fabric: the run a plan ahead follows, the duration of a
private collective (emulator.run.private), the time an algorithm choice compares (collectives.py).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Callable, Sequence

import simpy

from emulator.network.flow_fabric import Flow, FlowFabric, delay_to
from emulator.network.flows import FlowSpec, Plan
from emulator.network.maxmin import INF, max_min_rates
from emulator.network.trail import Kept, Trail

__all__ = ["JOINS", "PLANS_AHEAD", "Alone", "Fabric", "Flow", "alone", "delay_to", "max_min_rates"]

# Whether ``run_plan(ahead=True)`` may run a plan ahead of the clock (``Fabric._run_ahead``). False runs
# every plan on the clock, flow by flow: the exact path the fast one is checked against (tests/test_fabric_ahead.py).
PLANS_AHEAD = True
# Whether a flow that begins streaming on the links of one plan run ahead (and on no busy link) is joined to it
# (``Fabric._join``); False wakes the plan onto the clock, as any other meeting does (``_wake_plan``).
JOINS = True
# after JOIN_TRIALS runs together made for joins to a plan of a size, another is made only while the runs kept
# serve JOIN_HITS joins for each one made (``Fabric._join``)
JOIN_TRIALS, JOIN_HITS = 8, 4


class Fabric(FlowFabric):
    """The flow fabric that runs flow plans (``run_plan``), ahead of the clock where their links are free."""

    def __init__(self, env: simpy.Environment, capacity: Sequence[float]) -> None:
        super().__init__(env, capacity)
        # the plans run ahead (``run_plan(ahead=True)``); the bits of their links are ``_m_plan``
        self._plan_on: dict[_Ahead, None] = {}
        # (id(plan), bytes, the lazy flows it meets) → its run alone (with them), and its trail once a wake needs it
        self._solo: dict[tuple[object, ...], tuple[Plan, Alone, list[Trail | None]]] = {}
        # id(plan) → the links of it that can bind, and their bits
        self._hard: dict[int, tuple[Plan, tuple[int, ...], int]] = {}
        # the max-min rates' memo of those runs alone, on this fabric's capacities (``alone``'s ``rates``)
        self._solo_rates: dict[Any, list[float]] = {}
        self.woken = 0  # plans run ahead that a flow met before their end (run on the clock from then)
        self.joined = 0  # flows started ahead that a plan run ahead took in (``_run_ahead``)
        self.joins = JOINS  # whether a flow meeting a plan run ahead may join it (``_join``)
        self.late = 0  # flows joined so, as they began streaming
        # (id(plan), bytes) → the runs together made for joins to it (``_join``), and the joins that found one kept
        self._families: dict[tuple[object, ...], list[int]] = {}

    @property
    def _aheads(self) -> int:
        """How many plans are run ahead of the clock."""
        return len(self._plan_on)

    def set_slack(self, links: set[int]) -> None:
        """The flow fabric's (``links`` never bind); the links of each plan that can bind are found again."""
        super().set_slack(links)
        self._hard.clear()

    def set_capacity(self, link: int, capacity: float) -> None:
        """The flow fabric's (plans run ahead are woken first, ``_wake_all``); the runs alone kept, and the links
        of each plan that can bind, are found again."""
        super().set_capacity(link, capacity)
        self._hard.clear()
        self._solo.clear()
        self._solo_rates.clear()

    def _wake_all(self) -> None:
        """Every plan run ahead, then every lazy flow, becomes an ordinary one (before links change or are
        inspected)."""
        # in the order of their lowest links, as a walk of the links finds them; those on no link that can
        # bind (slack only) are never met, and stay as they are
        for a in sorted((a for a in self._plan_on if a.mask), key=lambda a: self._lowest(a.mask)):
            self._wake_plan(a)
        super()._wake_all()

    def _owners(self, mask: int) -> dict[int, Any]:
        """Link → the plan run ahead or the flow started ahead that holds it, for the links of ``mask``
        that one holds."""
        out: dict[int, Any] = {}
        for a in self._plan_on:
            if a.mask & mask:
                for link in a.links:
                    out[link] = a
        out.update(super()._owners(mask))
        return out

    def _place(self, flow: Flow) -> None:
        """The flow fabric's, but a flow that begins streaming on the links of one plan run ahead, and on links
        that carry nothing else, is joined to it (``_join``) instead of waking it."""
        if self._m_plan and self.joins and self._join(flow):
            return
        super()._place(flow)

    def _join(self, f: Flow) -> bool:
        """Join ``f``, beginning to stream now, to the plan run ahead whose links it meets, if it meets one plan,
        no flow started ahead, and no flow on its other links: the plan, the flows joined to it and ``f`` from
        now are a component of their own, run together from the plan's start (``alone`` with ``f`` as one more
        extra, begun at its offset: kept per plan, size and joined flows, as at ``_run_ahead``), each member
        ending at its time there. Up to now that run is the plan's (``f`` was not in it), so the members that
        ended keep their ends. Under Megatron-Core's 1F1B all-to-all overlap a tensor-parallel collective of
        one micro-batch meets the dispatch of the other on the NVLinks: Qwen3-235B on 256 H100s woke 4,461 of
        its 15,232 all-to-alls so, each then run on the clock, flow by flow (a solve per end)."""
        if not (self._may_ahead() and f.links):
            return False
        hard, hm = self._alone_on(f)[1:]
        if not hm & self._m_plan or hm & self._m_lazy:
            return False
        met = [a for a in self._plan_on if a.mask & hm]
        if len(met) != 1:
            return False
        a = met[0]
        if hm & ~a.mask & self._m_on:
            bit, on_link = self._bit, self.on_link
            if any(on_link[link] for link in hard if not a.mask >> bit[link] & 1):
                return False
        now = self.env.now
        joined = a.joined + ((f.links, f.weights, f.remaining, now - a.start),)
        key: tuple[object, ...] = (id(a.plan), a.nbytes, *joined)
        hit = self._solo.get(key)
        fam = self._families.get((id(a.plan), a.nbytes))
        if fam is None:
            fam = self._families[(id(a.plan), a.nbytes)] = [0, 0]
        if hit is None:
            # a run together not seen yet costs a run from the plan's start, where a wake reads a trail kept. Per
            # plan and size, after JOIN_TRIALS such runs one is made only while the runs kept serve JOIN_HITS joins
            # for each one made: the offsets of a sequence-parallel collective beside the other micro-batch's
            # dispatch recur (Qwen3-235B with the 1F1B overlap), those of a pipeline transfer seldom (Qwen3-235B
            # without it: 2.5 joins a run, 8.2 -> 11.5 s of CPU joined), nor those of each flow of another
            # all-to-all's phase joining in turn (DeepSeek-V4-Flash: every run new, 1.8 -> 9.9 s): those plans
            # are woken
            if fam[0] >= JOIN_TRIALS and fam[0] * JOIN_HITS > fam[1]:
                return False
            fam[0] += 1
            solo = alone(a.plan, a.nbytes, self.capacity, joined, record=False, rates=self._solo_rates)
            hit = self._solo[key] = (a.plan, solo, [None])
        else:
            fam[1] += 1
        self._unmark_plan(a)
        a.woken = True  # its ends are stale: the run together's follow
        f.last, f.rate = now, 0.0
        f.version += 1
        b = _Ahead(a.plan, a.nbytes, a.done, a.start, hit[1], tuple(sorted(set(a.links).union(hard))),
                   a.extras + (f,), a.mask | hm, joined, hit[2])
        b.ended[:len(a.ended)] = a.ended
        b.ended_plan = a.ended_plan
        b.left = (not b.ended_plan) + b.ended.count(False)
        self._m_plan |= b.mask
        self._plan_on[b] = None
        solo = hit[1]
        if not b.ended_plan:
            self.env.timeout(max(0.0, delay_to(now, a.start + solo.duration)), b).callbacks.append(self._ahead_ended)
        for i, end in enumerate(solo.ends):
            if not b.ended[i]:
                self.env.timeout(max(0.0, delay_to(now, a.start + end)), (b, i)).callbacks.append(self._joined_ended)
        self.late += 1
        return True

    def _wake_held(self, holder: Any) -> None:
        """A flow placed now meets plan ``holder``, run ahead, on one of its links (``_place``): it is woken,
        unless it is already (the flow met it on an earlier link)."""
        if holder in self._plan_on:
            self._wake_plan(holder)

    def run_plan(self, plan: Plan, nbytes: float, done: Callable[[], None], ahead: bool = False) -> None:
        """Run a collective's or transfer's flow ``plan`` for a buffer of ``nbytes`` from now: its
        phases one after the other, each flow of a phase started together (``transfer``); call
        ``done()`` when the last flow of the last phase is done (an empty plan: at once).

        With ``ahead``, a plan of several flows whose links carry nothing now is run ahead of the clock
        (``_run_ahead``): one event for its end instead of two per flow and a solve per change."""
        if not plan:
            done()
            return
        if len(plan) == 1 and len(plan[0]) == 1:  # one flow (a TP pair's ring, mostly): ``_phase``'s, without its count
            f = plan[0][0]
            self.transfer(f.links, f.weights, nbytes * f.volume, f.latency, done)
            return
        if ahead and PLANS_AHEAD and self._may_ahead() and self._run_ahead(plan, nbytes, done):
            return
        self._phase(plan, 0, nbytes, done)

    def _run_ahead(self, plan: Plan, nbytes: float, done: Callable[[], None]) -> bool:
        """Run ``plan`` as it runs alone (``alone``, once per plan and size), if none of its links
        that can bind carries a flow now: its end is scheduled at once and its links are marked. A
        flow placed on one of them before that end wakes it (``_wake_plan``): its flows are put on
        the fabric as the run alone has them then, and run on the clock from there. Until then its
        links carry nothing else, so max-min sharing is among its own flows, as alone: the same
        rates, phases of latency and ends (shifted by the start; the last bits of a sum may differ).

        Links that carry flows started ahead (``_ahead``) that have not begun to stream yet do not stop
        it: those flows are alone on their links, so the plan and they are a component of their own
        until another flow meets one of them; they are *joined* to the plan and run with it (``alone``
        with ``extras``, kept per plan, size and the joined flows' links, bytes and offsets: the same
        recur every micro-batch), each ending at its time there. A flow that meets any of them wakes
        all of them (``_wake_plan``)."""
        hit_hard = self._hard.get(id(plan))
        if hit_hard is None:
            slack = self.slack
            bind = tuple(sorted({l for phase in plan for f in phase for l in f.links if not slack[l]}))
            hit_hard = self._hard[id(plan)] = (plan, bind, self._bits(bind))
        hard, mask = hit_hard[1], hit_hard[2]
        if mask & self._m_plan or (mask & self._m_on and not self._empty(hard, mask)):
            return False
        now = self.env.now
        extras: tuple[Flow, ...] = ()
        if mask & self._m_lazy:  # in the order of the first of its links each holds
            met = sorted((f for f in self._lazy_on if f.hmask & mask), key=lambda f: self._lowest(f.hmask & mask))
            for f in met:
                if f.last < now:  # streaming already: its bytes so far are the clock's to settle
                    return False
            extras = tuple(met)
        joined: tuple[Extra, ...] = tuple((f.links, f.weights, f.remaining, f.last - now) for f in extras)
        key: tuple[object, ...] = (id(plan), nbytes, *joined)
        hit = self._solo.get(key)
        if hit is None:
            holder: list[Trail | None] = [None]
            hit = self._solo[key] = (plan, alone(plan, nbytes, self.capacity, joined, record=False,
                                                 rates=self._solo_rates), holder)
        solo = hit[1]
        if extras:
            marked = set(hard)
            for f in extras:  # on no link's list: ended by the group from now on (its own end is stale)
                marked.update(self._alone_on(f)[1])
                mask |= f.hmask
                self._unmark(f)
                f.version += 1
            hard = tuple(sorted(marked))
            self.joined += len(extras)
        a = _Ahead(plan, nbytes, done, now, solo, hard, extras, mask, joined, hit[2])
        self._m_plan |= mask
        self._plan_on[a] = None
        self.env.timeout(solo.duration, a).callbacks.append(self._ahead_ended)
        for i, end in enumerate(solo.ends):
            self.env.timeout(end, (a, i)).callbacks.append(self._joined_ended)
        return True

    def _unmark_plan(self, a: "_Ahead") -> None:
        self._m_plan ^= a.mask  # its bits, and no other plan's
        del self._plan_on[a]

    def _ahead_ended(self, event: simpy.Event) -> None:
        a: _Ahead = event.value  # type: ignore[assignment]  # simpy types every value Optional[Any]
        if a.woken:
            return
        a.ended_plan = True
        self._member_ended(a)
        a.done()

    def _joined_ended(self, event: simpy.Event) -> None:
        """A flow joined to a plan run ahead ends at its time in their run together."""
        a, i = event.value  # type: ignore[misc]  # simpy types every value Optional[Any]
        if a.woken:
            return
        a.ended[i] = True
        f = a.extras[i]
        f.remaining = 0.0
        f.rate = 0.0
        f.version += 1
        self._member_ended(a)
        f.done()

    def _member_ended(self, a: "_Ahead") -> None:
        """One of a plan run ahead and its joined flows has ended; after the last, its links are free."""
        a.left -= 1
        if a.left:
            return
        self._unmark_plan(a)
        self.owe(a.solo.link_bytes)

    def _wake_plan(self, a: "_Ahead") -> None:
        """Plan ``a``, run ahead, meets a flow now: its run alone is read at now (its trail, recorded on a
        fresh fabric as ``alone`` runs it at the first wake of a plan run ahead alike: trail.py), and each
        flow of its phase then, and each flow joined to it, goes on this fabric as it stands there: ended,
        waiting out its latency, or streaming with its bytes left; the plan's later phases follow on the
        clock (``_run_ahead``)."""
        self._unmark_plan(a)
        a.woken = True
        self.woken += 1
        now = self.env.now
        trail = a.trail[0]
        if trail is None:
            trail = a.trail[0] = _Replay(a, self.capacity, self._solo_rates).record()
        replay = trail.at(now - a.start)
        n = len(replay.specs)
        left = [n - sum(replay.ended[:n])]
        p = replay.phase

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._next_phase(a.plan, p, a.nbytes, a.done)

        on_link = self.on_link
        specs = [(f.links, f.weights) for f in replay.specs] + [(f.links, f.weights) for f in a.extras]
        for i, ((links, weights), twin, end) in enumerate(zip(specs, replay.twins, replay.ended)):
            joined = a.extras[i - n] if i >= n else None
            if (a.ended[i - n] if joined is not None else a.ended_plan or replay.done):
                continue  # its end came on the clock already, or the plan's last phase is over
            if end:
                if joined is not None:  # ends now: as on the clock, at this time
                    self._ended_later(joined)
                continue
            started = twin.started
            if started:
                replay.settle(twin)
            if joined is None:
                flow = Flow(links, weights, twin.remaining, one_done)
            else:
                flow = joined
                flow.remaining = twin.remaining
                flow.version += 1  # its end in the run together is stale
            if not started:
                flow.rate = 0.0
                at = a.start + replay.began + replay.specs[i].latency if joined is None else joined.last
                self.env.timeout(delay_to(now, at), flow).callbacks.append(self._started)
                continue
            flow.last, flow.rate = now, twin.rate
            if joined is None:
                flow.version = 1
            k = len(links)  # on each of its links, in C
            deque(map(dict.__setitem__, map(on_link.__getitem__, links), repeat(flow, k), repeat(None, k)), 0)
            self._m_on |= self._mask(flow.links)
            if twin.rate > 0.0:
                self.env.timeout(flow.remaining / twin.rate, (flow, flow.version)).callbacks.append(self._finished)
            self._dirty.update(flow.links)
        pending = self._path_bytes  # the bytes its run alone moved, per path: added link by link when read
        for links, weights, b in replay.paths():
            key = (id(links), id(weights))
            hit = pending.get(key)
            if hit is None:
                pending[key] = [links, weights, b]
            else:
                hit[2] += b
        if replay.done and not a.ended_plan:
            self.env.timeout(0.0).callbacks.append(lambda _e: a.done())
        self._request_solve()

    def _ended_later(self, f: Flow) -> None:
        """A flow joined to a plan ends now, in the replay of their run together: its ``done`` is called
        by an event at this time, as its end on the clock would be."""
        f.remaining = 0.0
        f.rate = 0.0
        f.version += 1
        self.env.timeout(0.0).callbacks.append(lambda _e: f.done())

    def _phase(self, plan: Plan, p: int, nbytes: float, done: Callable[[], None]) -> None:
        flows = plan[p]
        if not flows:
            self._next_phase(plan, p, nbytes, done)
            return
        left = [len(flows)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._next_phase(plan, p, nbytes, done)

        for f in flows:
            self.transfer(f.links, f.weights, nbytes * f.volume, f.latency, one_done)

    def _next_phase(self, plan: Plan, p: int, nbytes: float, done: Callable[[], None]) -> None:
        if p + 1 < len(plan):
            self._phase(plan, p + 1, nbytes, done)
        else:
            done()


class _Replay:
    """A plan run ahead (``_Ahead``) and its joined flows run alone on a fresh fabric, as ``alone`` ran them (the
    same flows started in the same order), kept after each of its event times (``record``: trail.py) for the
    wakes of every plan run ahead with the same plan, size and joined flows."""

    def __init__(self, a: "_Ahead", capacity: Sequence[float],
                 rates: dict[Any, list[float]] | None = None) -> None:  # noqa: D107
        self.env = simpy.Environment()
        self.fabric = FlowFabric(self.env, capacity)  # flows alone: its phases are started here (``_start``)
        self.fabric.on_clock = True  # as ``alone``: no flow started ahead there
        if rates is not None:  # ``alone``'s
            self.fabric._rates = rates
        self.plan, self.nbytes = a.plan, a.nbytes
        self.phase, self.began, self.done = -1, 0.0, False
        self.specs: list[FlowSpec] = []
        self._twins: list[Flow] = []
        self._ended: list[bool] = []
        self._extra_ended = [False] * len(a.joined)
        self._start(0)
        self._extra_twins = [self.fabric.transfer(links, weights, size, start, self._mark(i))
                             for i, (links, weights, size, start) in enumerate(a.joined)]  # after the first phase

    def record(self) -> Trail:
        """The run to its end, its state kept before any event and after the events of each time."""
        env, trail = self.env, Trail()
        trail.add(-INF, self._kept())
        while (t := env.peek()) < INF:
            while env.peek() == t:
                env.step()
            trail.add(t, self._kept())
        return trail

    def _kept(self) -> Kept:
        on = self.fabric.on_link
        twins = self._twins + self._extra_twins
        return Kept(self.phase, self.began, self.done, tuple(self.specs),
                    tuple((f.links, f.weights, f.remaining, f.last, f.rate,
                           bool(f.links) and f in (on[f.links[0]] or {})) for f in twins),
                    tuple(self._ended + self._extra_ended),
                    tuple((links, weights, b) for links, weights, b in self.fabric._path_bytes.values()))

    def _mark(self, i: int) -> Callable[[], None]:
        def one() -> None:
            self._extra_ended[i] = True
        return one

    def _start(self, p: int) -> None:
        """Phase ``p`` begins (empty ones are passed over, as ``Fabric._phase`` does)."""
        plan = self.plan
        while p < len(plan) and not plan[p]:
            p += 1
        if p == len(plan):
            self.done = True
            return
        ended = [False] * len(plan[p])
        self.phase, self.began, self.specs, self._ended = p, self.env.now, list(plan[p]), ended
        left = [len(ended)]

        def one_done(i: int) -> Callable[[], None]:
            def one() -> None:
                ended[i] = True
                left[0] -= 1
                if left[0] == 0:
                    self._start(p + 1)
            return one

        self._twins = [self.fabric.transfer(f.links, f.weights, self.nbytes * f.volume, f.latency, one_done(i))
                       for i, f in enumerate(plan[p])]


class _Ahead:
    """A plan run ahead of the clock (``Fabric._run_ahead``): what it is, when it began, its run alone, the
    flows joined to it, which of them and whether the plan have ended, and how many of those are left."""

    __slots__ = ("plan", "nbytes", "done", "start", "solo", "links", "mask", "woken", "extras", "ended",
                 "ended_plan", "left", "joined", "trail")

    def __init__(self, plan: Plan, nbytes: float, done: Callable[[], None], start: float, solo: "Alone",
                 links: tuple[int, ...], extras: tuple[Flow, ...] = (), mask: int = 0, joined: tuple[Extra, ...] = (),
                 trail: list[Trail | None] | None = None) -> None:  # noqa: D107
        self.plan, self.nbytes, self.done, self.start, self.solo, self.links = plan, nbytes, done, start, solo, links
        self.mask = mask  # the bits of ``links``
        self.woken = False
        self.extras = extras
        self.joined = joined  # the joined flows as they were at the start: links, weights, bytes, start (s)
        # its trail once a wake needs it, shared by the plans run ahead alike (``_solo``)
        self.trail: list[Trail | None] = trail if trail is not None else [None]
        self.ended = [False] * len(extras)
        self.ended_plan = False
        self.left = 1 + len(extras)


@dataclass(frozen=True)
class Alone:
    """A plan run alone on an idle fabric from time 0: how long it takes, the bytes it leaves on
    each link, the load changes a listener of the fabric saw, as (time, {link: B/s}), and when each
    flow run with it (``alone``'s ``extras``) ended."""

    duration: float
    link_bytes: tuple[tuple[int, float], ...]
    loads: tuple[tuple[float, dict[int, float]], ...]
    ends: tuple[float, ...] = ()


Extra = tuple[tuple[int, ...], tuple[float, ...], float, float]  # a flow's links, weights, bytes, start (s)


def alone(plan: Plan, nbytes: float, capacity: Sequence[float], extras: Sequence[Extra] = (),
          record: bool = True, rates: dict[Any, list[float]] | None = None) -> Alone:
    """Run ``plan`` for ``nbytes`` by itself on a fresh fabric of ``capacity`` (with ``extras``: and
    those flows, each started at its time; their ends are ``Alone.ends``; without ``record``, no load
    changes are kept: a fabric's runs ahead keep none, and are kept per plan, size and joined flows; ``rates``,
    where given, is the max-min rates' memo the run reads and adds to, ``FlowFabric._rates_of``: one per
    ``capacity``, shared by the runs alone a fabric makes).

    Where nothing else ever uses a plan's links (the engine's private collectives), this is
    exactly what the plan does in the full run, shifted by its start: max-min sharing happens
    among its own flows only, and phases, latencies and rate changes are the same events."""
    env = simpy.Environment()
    fabric = Fabric(env, capacity)
    if rates is not None:
        fabric._rates = rates
    loads: list[tuple[float, dict[int, float]]] = []
    if record:
        fabric.listeners.append(lambda now, load: loads.append((now, dict(load))))
    else:  # no flow is started ahead there all the same (``_Replay`` replays it so)
        fabric.on_clock = True
    end = [-1.0]
    ends = [-1.0] * len(extras)

    def done() -> None:
        end[0] = env.now

    def ended(i: int) -> Callable[[], None]:
        def one() -> None:
            ends[i] = env.now
        return one

    fabric.run_plan(plan, nbytes, done)
    for i, (links, weights, size, start) in enumerate(extras):  # after the plan's: as ``_wake_plan`` replays
        fabric.transfer(links, weights, size, start, ended(i))
    env.run()
    if end[0] < 0.0 or min(ends, default=0.0) < 0.0:
        raise ValueError("a plan run alone never finished (a link of no capacity?)")
    on = fabric.bytes_on_link  # only the plan's links carry bytes (no scan of the whole fabric's)
    used = {l for phase in plan for f in phase for l in f.links} | {l for x in extras for l in x[0]}
    moved = tuple((l, on[l]) for l in sorted(used) if on[l])
    return Alone(end[0], moved, tuple(loads), tuple(ends))
